"""The admin's pause and resume buttons, on the stats page, behind their own permission.

`django_venturi.pause_queues` ("Can pause and resume queues and kinds") guards
both; seeing the pauses needs only the view permission on jobs, like the rest
of the stats page. A pause made here is recorded as made by the admin user.
"""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.urls import reverse

from django_venturi.conf import venturi_settings
from django_venturi.management.commands.venturi_worker import default_queues
from django_venturi.observe.snapshot import Stats
from django_venturi.registry import registry
from django_venturi.store.pauses import pause, resume

PERMISSION = "django_venturi.pause_queues"
SCOPES = ("queue", "kind")


def can_pause(request: HttpRequest) -> bool:
    return request.user.has_perm(PERMISSION)


def pause_context(request: HttpRequest, snapshot: Stats) -> dict[str, Any]:
    """What the stats page's "Paused" section needs."""
    paused_names = {(item.scope, item.name) for item in snapshot.pauses}
    return {
        "can_pause": can_pause(request),
        "pauses": snapshot.pauses,
        "pausable_queues": sorted(
            name
            for name in default_queues() | set(snapshot.due)
            if ("queue", name) not in paused_names
        ),
        "pausable_kinds": [kind for kind in registry.kinds() if ("kind", kind) not in paused_names],
    }


def answer(request: HttpRequest, *, resuming: bool) -> HttpResponse:
    """A POST from a Pause or Resume button: act, say what was done, back to the stats."""
    if request.method != "POST":
        return HttpResponseNotAllowed(["POST"])
    if not can_pause(request):
        raise PermissionDenied
    scope = request.POST.get("scope", "")
    name = request.POST.get("name", "").strip()
    if scope not in SCOPES:
        messages.error(request, f"scope must be queue or kind, got {scope!r}")
        return back()
    target = {scope: name}
    alias = venturi_settings.DATABASE
    try:
        if resuming:
            done = resume(**target, using=alias)
            said = f"Resumed {scope} {name}." if done else f"The {scope} {name} was not paused."
        else:
            done = pause(**target, by=request.user.get_username() or "admin", using=alias)
            said = (
                f"Paused {scope} {name}: workers claim none of its jobs; running jobs finish."
                if done
                else f"The {scope} {name} was paused already."
            )
    except ValueError as error:
        messages.error(request, str(error))
        return back()
    if done:
        messages.success(request, said)
    else:
        messages.info(request, said)
    return back()


def back() -> HttpResponse:
    return HttpResponseRedirect(reverse("admin:django_venturi_job_stats"))
