"""What the admin shows of a job's stored data: never a `venturi.secret()` value.

Every page that shows a job's payload, carry, result or error text takes it from
here (`JobMask`), and the searches take their limits from here (`searchable`):

- The payload and the carry are masked by their declared types
  (`payloads.masking`): the task class, and the task's `carry=` type. An untyped
  carry (`carry=None`) is plain JSON, where no `secret()` field can sit.
- The result is untyped JSON (`Outcome.completed(result=...)`): no declared type
  says which part of it is secret. It is shown with every value the job's secret
  fields hold (payload and carry) hidden wherever it appears, whole or inside a
  string (`payloads.masking.redact`). The same holds for the texts a handler's
  exception wrote (the last error, the journal's messages and tracebacks) and
  for an untyped carry: a handler may have copied a secret into any of them.
- A kind this process has not registered: its types are unknown, so its payload
  and carry show their top-level keys only, and every value they hold is hidden
  from its result and texts. Django Tasks jobs (`tasks:` kinds) hold plain
  arguments, no `secret()` fields: shown as stored.
- Searching never finds a job by a secret: the payload of a kind that can hold
  one (or of an unknown kind) is not searched, nor the journal's messages of
  such kinds; filters from the URL on the payload, carry, result and error texts
  are refused (`UNFILTERED_FIELDS`).
"""

from __future__ import annotations

import functools
from typing import Any

from django.db.models import Q

from django_venturi.models import Job
from django_venturi.payloads import masking
from django_venturi.registry import TASKS_KIND_PREFIX, registry

UNFILTERED_FIELDS = frozenset({"payload", "carry", "result", "last_error"})
"""Job fields no filter from the URL may look into (`?carry__token__startswith=a`
would test a secret one guess at a time, without showing it)."""
UNFILTERED_JOURNAL_FIELDS = frozenset({"error_message", "traceback"})
"""The same for journal entries: a handler's message may quote a secret."""


def may_hold_secrets(kind: str) -> bool:
    """Whether a job of `kind` can hold a secret (or its types are not known here)."""
    types = registry.declared_types(kind)
    return types is None or any(masking.holds_secrets(hint) for hint in types)


class JobMask:
    """One job's stored data as the admin shows it (see the module's docstring)."""

    def __init__(self, job: Job) -> None:
        self.job = job
        self.types = registry.declared_types(job.kind)

    def carry(self) -> Any:
        if self.types is None:
            return masking.hidden(self.job.carry)
        return masking.redact(masking.masked_value(self.types[1], self.job.carry), self.texts)

    def result(self) -> Any:
        return masking.redact(self.job.result, self.texts)

    def text(self, text: str) -> str:
        """An error message or traceback with the job's secret values hidden."""
        return masking.redact_text(text, self.texts) if text else text

    @functools.cached_property
    def texts(self) -> frozenset[str]:
        """The values the job's secret fields hold (every value, for an unknown kind)."""
        if self.types is not None and not may_hold_secrets(self.job.kind):
            return frozenset()  # the common case: the payload need not even be loaded
        return masking.stored_secret_texts(self.types, self.job.payload, self.job.carry)


def job_mask(job: Job) -> JobMask:
    """The job's `JobMask`, made once per loaded row (a list shows several of its texts)."""
    mask = job.__dict__.get("_venturi_mask")
    if not isinstance(mask, JobMask):
        mask = job.__dict__["_venturi_mask"] = JobMask(job)
    return mask


def searchable(field: str = "kind") -> Q:
    """Jobs whose stored text may be searched: of kinds that cannot hold a secret.

    `field` names the job's kind from the model searched (`job__kind` for the journal).
    Kinds not registered here are left out too: what they hold is not known.
    """
    plain = [spec.kind for spec in registry.specs() if not may_hold_secrets(spec.kind)]
    return Q(**{f"{field}__in": plain}) | Q(**{f"{field}__startswith": TASKS_KIND_PREFIX})
