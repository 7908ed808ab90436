"""Admin access: groups that hold the venturi admin's permissions."""

from __future__ import annotations

from django.contrib.auth.models import Group, Permission

# [groups]
SEE = [
    "view_job",  # the job list, each job's page and the stats page
    "view_journalentry",  # the journal on a job's page, and the journal entry list
    "view_periodictask",  # the "Periodic tasks" page
]
OPS = [
    *SEE,
    "retry_job",  # the "Retry now" action
    "cancel_job",  # the "Cancel" action
    "delete_job",  # the "Delete selected" action (jobs go with their journal)
    "cleanup_jobs",  # the "Clean up finished jobs" page
    "pause_queues",  # Pause and Resume on the stats page (queues and kinds)
    "manage_schedules",  # Run now, Disable and Enable on the "Periodic tasks" page
]
SUPPORT = [*SEE, "retry_job"]


def grant(group_name: str, codenames: list[str]) -> Group:
    """Create the group if it is missing and add these django_venturi permissions to it."""
    permissions = list(
        Permission.objects.filter(content_type__app_label="django_venturi", codename__in=codenames)
    )
    missing = set(codenames) - {permission.codename for permission in permissions}
    if missing:  # a typo, or `migrate` has not run on this database yet
        raise LookupError(f"no django_venturi permission {', '.join(sorted(missing))}")
    group, _ = Group.objects.get_or_create(name=group_name)
    group.permissions.add(*permissions)  # the group's other permissions stay
    return group


def create_admin_groups() -> None:
    grant("Ops", OPS)
    grant("Support", SUPPORT)


# [groups end]
