"""The models: the job table and its journal (`jobs.py`), and what the operators' side
remembers beside them (`operations.py`). Import them from here: `django_venturi.models`."""

from django_venturi.models.jobs import Dependency, Job, JournalEntry, PeriodicTask, StoredJSONField
from django_venturi.models.operations import (
    HISTOGRAM_BUCKETS,
    RUN_COLUMNS,
    WAIT_COLUMNS,
    HistoryRollup,
    MaintenanceRun,
    Pause,
    PeriodicTick,
    RateStart,
    RunTally,
    ScheduleState,
    WorkerProcess,
)

__all__ = [
    "HISTOGRAM_BUCKETS",
    "RUN_COLUMNS",
    "WAIT_COLUMNS",
    "Dependency",
    "HistoryRollup",
    "Job",
    "JournalEntry",
    "MaintenanceRun",
    "Pause",
    "PeriodicTask",
    "PeriodicTick",
    "RateStart",
    "RunTally",
    "ScheduleState",
    "StoredJSONField",
    "WorkerProcess",
]
