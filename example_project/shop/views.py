from django import forms
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from example_project.shop.signups import sign_up


class SignupForm(forms.Form):
    email = forms.EmailField()


def signup(request: HttpRequest) -> HttpResponse:
    """GET: the form. POST: save the signup and enqueue its welcome email together."""
    form = SignupForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        signup, job = sign_up(form.cleaned_data["email"])
        return render(request, "shop/thanks.html", {"signup": signup, "job": job}, status=201)
    return render(request, "shop/signup.html", {"form": form})
