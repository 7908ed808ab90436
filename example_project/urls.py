from django.contrib import admin
from django.urls import path

from example_project.shop import views

urlpatterns = [
    path("", views.signup, name="home"),
    path("signup/", views.signup, name="signup"),
    path("admin/", admin.site.urls),
]
