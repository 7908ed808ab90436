"""A Wagtail page type whose references Wagtail's reference index records."""

from __future__ import annotations

from django.db import models
from wagtail.fields import RichTextField
from wagtail.models import Page


class LinkPage(Page):
    """A page with a rich text body and a link to another page."""

    body = RichTextField(blank=True)
    related_page = models.ForeignKey(
        "wagtailcore.Page",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )
