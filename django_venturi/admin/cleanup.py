"""The cleanup page: delete finished jobs older than an age, after a preview.

`CleanupForm` takes the age ("7d") and the finished states; the page shows what
`store.retention.cleanup` would delete (a dry run) and deletes it once confirmed.
`JobAdmin.cleanup_view` checks the `cleanup_jobs` permission and calls `cleanup_page`.
"""

from __future__ import annotations

from datetime import timedelta

from django import forms
from django.contrib import admin, messages
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse

from django_venturi.admin.breadcrumbs import job_page_breadcrumbs
from django_venturi.conf import as_age, venturi_settings
from django_venturi.models import Job
from django_venturi.states import FINISHED_STATES
from django_venturi.store.retention import cleanup


class CleanupForm(forms.Form):
    older_than = forms.CharField(
        initial="7d",
        help_text="Finished more than this long ago: 30m, 12h, 7d, 2w.",
        max_length=20,
    )
    states = forms.MultipleChoiceField(
        choices=[(state.value, state.label) for state in FINISHED_STATES],
        initial=[state.value for state in FINISHED_STATES],
        widget=forms.CheckboxSelectMultiple,
    )

    def clean_older_than(self) -> timedelta:
        try:
            return as_age(self.cleaned_data["older_than"])
        except ValueError as error:
            raise forms.ValidationError(str(error)) from None


def cleanup_page(model_admin: admin.ModelAdmin[Job], request: HttpRequest) -> HttpResponse:
    """The form, then its preview, then the deletion (the caller checked the permission)."""
    form = CleanupForm(request.POST or None)
    preview = None
    if request.method == "POST" and form.is_valid():
        options = {
            "older_than": form.cleaned_data["older_than"],
            "states": form.cleaned_data["states"],
            "using": venturi_settings.DATABASE,
        }
        if "confirm" in request.POST:
            result = cleanup(**options)
            model_admin.message_user(
                request,
                f"Deleted {result.counts()} {result.in_batches()}.",
                messages.SUCCESS,
            )
            return HttpResponseRedirect(reverse("admin:django_venturi_job_changelist"))
        preview = cleanup(dry_run=True, **options)
    request.current_app = model_admin.admin_site.name
    context = {
        **model_admin.admin_site.each_context(request),
        "title": "Clean up finished jobs",
        "breadcrumbs": job_page_breadcrumbs(model_admin, request, "Clean up finished jobs"),
        "opts": model_admin.model._meta,
        "form": form,
        "preview": preview,
    }
    return TemplateResponse(request, "admin/django_venturi/job/cleanup.html", context)
