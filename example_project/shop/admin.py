from django.contrib import admin

from example_project.shop.models import Signup


@admin.register(Signup)
class SignupAdmin(admin.ModelAdmin):
    list_display = ("id", "email", "created_at", "welcome_sent_at")
    search_fields = ("email",)
