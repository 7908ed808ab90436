"""From what a run produced to what is written: the job's next state and its journal entry.

Pure functions, no database: `completion.py` writes what these decide.
"""

from __future__ import annotations

import dataclasses
import traceback as traceback_module
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django_venturi.conf import venturi_settings
from django_venturi.outcomes import Outcome, OutcomeKind, TaskError
from django_venturi.payloads import codec, text
from django_venturi.payloads.size import check_size
from django_venturi.registry import TaskSpec
from django_venturi.states import JournalOutcome, State
from django_venturi.store.backoff import Fibonacci, clamp_delay
from django_venturi.store.claim import ClaimedJob

ERROR_MESSAGE_LIMIT = 2000
TRACEBACK_LIMIT = 20_000
ERROR_TYPE_LIMIT = 300
"""The length of `JournalEntry.error_type`."""
GAVE_UP = "gave up"
"""How every reason of `gives_up` starts (the stats tell a give-up's journal entry by it)."""
OUTCOME_TYPE_PREFIX = "Outcome."
"""The error type of a failure the handler returned (`Outcome.retry`, `Outcome.failed`)."""
GAVE_UP_SEPARATOR = "; last error: "
"""Between why a job gave up and its last run's error, in the job's `last_error`."""


@dataclasses.dataclass(frozen=True, slots=True)
class ErrorInfo:
    """An error as the journal stores it: always text the database can store.

    However it is built, its fields are made storable (`text.storable`): NUL
    and surrogates become U+FFFD with a note, and the type is cut to its column.
    """

    type: str = ""
    message: str = ""
    traceback: str = ""

    def __post_init__(self) -> None:
        # Frozen: set through object. Text that is already storable is kept as is.
        object.__setattr__(self, "type", text.storable_name(_as_text(self.type), ERROR_TYPE_LIMIT))
        object.__setattr__(self, "message", text.storable(_as_text(self.message)))
        object.__setattr__(self, "traceback", text.storable(_as_text(self.traceback)))

    @classmethod
    def from_exception(cls, error: BaseException) -> ErrorInfo:
        """The error of a raised exception, even one whose `__str__` or traceback fails."""
        return cls(
            type=text.type_name(type(error)),
            message=text.text_of(error)[:ERROR_MESSAGE_LIMIT],
            traceback=_formatted_traceback(error)[-TRACEBACK_LIMIT:],
        )

    @classmethod
    def from_reason(cls, reason: str, type: str = "") -> ErrorInfo:
        return cls(type=type, message=_as_text(reason)[:ERROR_MESSAGE_LIMIT])

    def summary(self) -> str:
        """`ValueError: bad input`; the message alone for an `Outcome.*` reason, whose
        outcome (`retry`, `failed`) is said beside it already."""
        if self.type.startswith(OUTCOME_TYPE_PREFIX):
            return self.message
        name = self.type.rpartition(".")[2]
        return f"{name}: {self.message}" if name else self.message


def _as_text(value: object) -> str:
    return value if isinstance(value, str) else text.text_of(value)


def _formatted_traceback(error: BaseException) -> str:
    try:
        return "".join(traceback_module.format_exception(error))
    except BaseException as failure:  # formatting runs user code (__str__, __notes__)
        return f"(the traceback could not be formatted: {text.type_name(type(failure))})"


NO_ERROR = ErrorInfo()


@dataclasses.dataclass(slots=True)
class Verdict:
    """What to write for one finished run of a claimed job.

    Not frozen: a frozen dataclass sets each field through `object.__setattr__`,
    and each run builds one. Only `record_run` changes one, as its run ends."""

    job: ClaimedJob
    outcome: JournalOutcome
    """The journal entry's outcome."""
    state: State
    """The job's next state."""
    delay: timedelta = timedelta(0)
    """For a job going back to `ready`: run again this long after now (database time)."""
    set_carry: bool = False
    carry: Any = None
    """The encoded carry to store, when `set_carry`."""
    failed_run: bool = False
    """Whether this run counts against `max_attempts`."""
    error: ErrorInfo = NO_ERROR
    worker: str | None = None
    """The worker the journal names, when not the one writing (a recovered run)."""
    duration: float | None = None
    """Seconds the handler ran (None when it did not run: released, recovered)."""
    set_progress: bool = False
    progress: Any = None
    """The run's last `ctx.progress()`, to store with the verdict, when `set_progress`."""
    set_result: bool = False
    result: Any = None
    """The JSON return value to store in `Job.result`, when `set_result` (Django Tasks jobs)."""
    after_write: Callable[[bool], None] | None = None
    """Called by the worker once the verdict is written, with whether it applied."""
    written: bool = False
    """Already applied, in the transaction of an atomic handler (`atomic.py`): the
    worker only does what follows a write."""
    if_unapplied: Verdict | None = None
    """Set when an earlier write of this verdict may or may not have been applied (an
    atomic handler's commit whose answer was lost): the writer looks in the journal
    first (`lost_answers.py`), and writes this verdict instead if it was not."""


def record_run(
    verdict: Verdict, *, duration: float | None, progress: tuple[bool, Any] = (False, None)
) -> Verdict:
    """Add what the worker measured of the run to its fresh verdict: how long the handler
    ran, and its last `ctx.progress()` if not written yet (`progress`: dirty, value).

    In place: a verdict is built for one run and reaches no one before its run ends
    (`dataclasses.replace` rebuilt all its fields, 3 µs per job).
    """
    if duration is not None:
        verdict.duration = duration
    if progress[0]:
        verdict.set_progress = True
        verdict.progress = progress[1]
    return verdict


def completed(job: ClaimedJob) -> Verdict:
    return Verdict(job, JournalOutcome.COMPLETED, State.COMPLETED)


def released(job: ClaimedJob) -> Verdict:
    """Handed back at shutdown: ready at once, not a failure."""
    return Verdict(job, JournalOutcome.RELEASED, State.READY)


def cancelled(job: ClaimedJob) -> Verdict:
    """The job was cancelled while it ran: whatever the handler returned, it ends here."""
    return Verdict(job, JournalOutcome.CANCELLED, State.CANCELLED)


def timed_out(job: ClaimedJob, spec: TaskSpec | None, limit: timedelta, grace: str) -> Verdict:
    """The run passed its timeout: a retryable failure journalled as `timeout`."""
    error = ErrorInfo.from_reason(
        f"the run passed its timeout of {limit}{grace}", type="django_venturi.Timeout"
    )
    return retry(job, spec, error, outcome=JournalOutcome.TIMEOUT)


def failed(job: ClaimedJob, error: ErrorInfo) -> Verdict:
    """A permanent failure."""
    return Verdict(job, JournalOutcome.FAILED, State.FAILED, failed_run=True, error=error)


def retry(
    job: ClaimedJob,
    spec: TaskSpec | None,
    error: ErrorInfo,
    *,
    after: timedelta | None = None,
    outcome: JournalOutcome = JournalOutcome.RETRY,
) -> Verdict:
    """A retryable failure: back to `ready` after backoff, or `failed` if the task gives up."""
    failures = job.failures + 1
    give_up = gives_up(job, spec, failures)
    if give_up:
        return Verdict(
            job,
            JournalOutcome.FAILED if outcome is JournalOutcome.RETRY else outcome,
            State.FAILED,
            failed_run=True,
            error=dataclasses.replace(
                error, message=f"{give_up}{GAVE_UP_SEPARATOR}{error.message}"
            ),
        )
    backoff = spec.backoff if spec is not None else Fibonacci()
    delay = after if after is not None else backoff.delay(job_id=job.id, failures=failures)
    return Verdict(
        job, outcome, State.READY, delay=clamp_delay(delay), failed_run=True, error=error
    )


def gives_up(job: ClaimedJob, spec: TaskSpec | None, failures: int) -> str:
    """Return why the job must stop retrying after `failures` failures, or ''."""
    max_attempts = spec.max_attempts if spec is not None else None
    if max_attempts is None:
        max_attempts = venturi_settings.DEFAULT_MAX_ATTEMPTS
    if max_attempts is not None and failures >= max_attempts:
        attempts = "attempt" if failures == 1 else "attempts"
        return f"gave up after {failures} failed {attempts} (max_attempts={max_attempts})"
    give_up_after = spec.give_up_after if spec is not None else None
    if give_up_after is not None and job.started_at - job.enqueued_at >= give_up_after:
        return f"gave up: first enqueued more than {give_up_after} ago (give_up_after)"
    return ""


def from_outcome(job: ClaimedJob, spec: TaskSpec, result: object) -> Verdict:
    """Turn a handler's return value into a verdict."""
    if not isinstance(result, Outcome):
        handler = f"{spec.cls.__module__}.{spec.cls.__qualname__}.handle"
        return failed(
            job,
            ErrorInfo.from_reason(
                f"{handler} returned {type(result).__name__}, not a venturi.Outcome "
                "(return venturi.Outcome.completed() when the work is done)",
                type="django_venturi.InvalidOutcome",
            ),
        )
    if result.kind is OutcomeKind.COMPLETED:
        return _completed_with(job, result.result)
    if result.kind is OutcomeKind.PAUSED:
        try:
            carry = spec.encode_carry(result.carry)
            check_size(carry, f"{spec.cls.__name__}.carry", venturi_settings.MAX_PAYLOAD_BYTES)
        except Exception as error:  # a PayloadError, or whatever encoding user types raised
            return failed(job, ErrorInfo.from_exception(error))
        return Verdict(
            job,
            JournalOutcome.PAUSED,
            State.READY,
            delay=clamp_delay(result.after),
            set_carry=True,
            carry=carry,
        )
    if result.kind is OutcomeKind.RETRY:
        asked = ErrorInfo.from_reason(
            "the handler returned Outcome.retry()", type=f"{OUTCOME_TYPE_PREFIX}retry"
        )
        return retry(job, spec, asked, after=result.after)
    return failed(job, ErrorInfo.from_reason(result.reason, type=f"{OUTCOME_TYPE_PREFIX}failed"))


def _completed_with(job: ClaimedJob, result: Any) -> Verdict:
    """Completed, storing the handler's result (plain JSON) if it gave one."""
    if result is None:
        return completed(job)
    try:
        stored = codec.encode_value(result, Any, "result")
        check_size(stored, "result", venturi_settings.MAX_PAYLOAD_BYTES)
    except Exception as error:  # a PayloadError, or whatever the value's methods raised
        return failed(job, ErrorInfo.from_exception(error))
    return dataclasses.replace(completed(job), set_result=True, result=stored)


def from_exception(
    job: ClaimedJob,
    spec: TaskSpec,
    error: BaseException,
    *,
    outcome: JournalOutcome = JournalOutcome.RETRY,
) -> Verdict:
    """Turn an exception raised by a handler into a verdict (`outcome`: a retryable one's)."""
    info = ErrorInfo.from_exception(error)
    if isinstance(error, TaskError) and error.is_permanent:
        return failed(job, info)
    return retry(job, spec, info, outcome=outcome)
