"""What the queue looks like from outside: the stats snapshot, rate-limit use, telemetry.

Reads job, journal and worker rows; writes nothing but metrics and spans.

May import: `store/` and `payloads/`. Never `worker/`, `tasks_backend/` or `admin/`.
"""
