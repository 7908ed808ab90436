"""Tasks of the workflow tests: steps that record their order and pass results on."""

from __future__ import annotations

import dataclasses

import django_venturi as venturi
from tests.testapp.models import Record


@venturi.task(kind="tests.workflow.step")
@dataclasses.dataclass
class Step(venturi.Task):
    name: str
    fail: bool = False

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        Record.objects.using(ctx.database).create(
            job_id=ctx.job_id,
            kind="step",
            attempt=ctx.attempt,
            value={"name": self.name, "seen": sorted(ctx.dependency_results().values(), key=str)},
        )
        if self.fail:
            return venturi.Outcome.failed(f"{self.name} fails on purpose")
        return venturi.Outcome.completed(result=self.name)


@venturi.task(kind="tests.workflow.summary")
@dataclasses.dataclass
class Summary(venturi.Task):
    batch: int

    def handle(self, ctx: venturi.Context) -> venturi.Outcome:
        results = ctx.dependency_results()
        Record.objects.using(ctx.database).create(
            job_id=ctx.job_id, kind="summary", attempt=ctx.attempt, value=len(results)
        )
        return venturi.Outcome.completed(result={"members": len(results)})
