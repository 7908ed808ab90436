"""The store: every statement on job rows, the job state machine in the database.

Claiming, writing verdicts, dedup and merging, dependencies, rate limits,
pauses, cancel, leases, retention, the journal, retries and the clock they all
read. Each module here is called by a worker, by a producer or by the admin;
none of them runs a loop of its own.

May import: `payloads/` and the foundation at the top (`conf`, `states`,
`outcomes`, `models`, `registry`, `signals`). Never `worker/`, `observe/`,
`tasks_backend/` or `admin/`.
"""
