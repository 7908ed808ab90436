"""Wagtail, a real third-party app, runs its own background tasks on venturi workers.

Wagtail enqueues its work through the Tasks API with the django-tasks backport
(`from django_tasks import task`, even on Django 6.1): saving a page enqueues
`update_reference_index_task`, deleting a document `delete_file_from_storage_task`.
Its code knows nothing of venturi; the project's TASKS setting names venturi's
backend, and real `venturi_worker --burst` subprocesses run the jobs against the
PostgreSQL test database. Run with `tox -e wagtail` (tests.wagtail_check.settings).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.core.files.base import ContentFile
from django.db import transaction
from django_tasks import TaskResultStatus
from wagtail.documents.models import Document
from wagtail.models import Page, ReferenceIndex
from wagtail.tasks import delete_file_from_storage_task, update_reference_index_task

from django_venturi.models import Job
from django_venturi.states import State
from tests.conftest import Workers
from tests.wagtail_check.site.models import LinkPage

# Committed transactions, as in production: the worker is another process. Wagtail's own
# data migrations (the root page, the root collection, the default locale) come back
# before every test.
pytestmark = pytest.mark.django_db(transaction=True, serialized_rollback=True)

REFERENCE_INDEX_KIND = "tasks:wagtail.tasks.update_reference_index_task"
DELETE_FILE_KIND = "tasks:wagtail.tasks.delete_file_from_storage_task"


class Rollback(Exception):
    pass


def jobs_of(kind: str) -> list[Job]:
    return list(Job.objects.filter(kind=kind).order_by("id"))


def job_for(kind: str, args: list[Any]) -> Job:
    """The one job of `kind` whose task arguments are `args`."""
    matching = [job for job in jobs_of(kind) if job.payload["args"] == args]
    assert len(matching) == 1, f"{kind} jobs: {[job.payload for job in jobs_of(kind)]}"
    return matching[0]


def page_args(page: Page) -> list[Any]:
    return [page._meta.app_label, page._meta.model_name, str(page.pk)]


def references_from(page: Page) -> set[tuple[str, str]]:
    """(field, referenced object id) of every ReferenceIndex row of `page`."""
    rows = ReferenceIndex.get_references_for_object(page)
    return {(row.model_path, row.to_object_id) for row in rows}


@pytest.fixture
def root() -> Page:
    root = Page.get_first_root_node()
    assert root is not None, "Wagtail's initial data migration creates the root page"
    return root


def test_saving_a_page_enqueues_wagtails_reference_index_task_that_a_worker_runs(
    root: Page, workers: Workers
) -> None:
    with transaction.atomic():
        target = root.add_child(instance=LinkPage(title="Target", slug="target"))
        source = root.add_child(
            instance=LinkPage(
                title="Source",
                slug="source",
                related_page=target,
                body=f'<p>See <a linktype="page" id="{target.pk}">the target</a>.</p>',
            )
        )

    # Wagtail's signal handler wrote a venturi job per save, in the page's transaction.
    job = job_for(REFERENCE_INDEX_KIND, page_args(source))
    job_for(REFERENCE_INDEX_KIND, page_args(target))
    assert job.state == State.READY
    assert job.payload["framework"] == "django_tasks"
    # Nothing ran before a worker did.
    assert references_from(source) == set()
    result = update_reference_index_task.get_result(str(job.pk))
    assert result.status == TaskResultStatus.READY

    workers.burst("default")

    assert {job.state for job in jobs_of(REFERENCE_INDEX_KIND)} == {State.COMPLETED}
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL, result.errors
    assert result.return_value is None
    assert len(result.worker_ids) == 1
    # The side effect: Wagtail's reference index now records both links of the source.
    assert references_from(source) == {
        ("related_page", str(target.pk)),
        ("body.", str(target.pk)),  # Wagtail's model path of a rich text link
    }


def test_a_rolled_back_page_save_leaves_no_job(root: Page) -> None:
    with pytest.raises(Rollback), transaction.atomic():
        page = root.add_child(instance=LinkPage(title="Draft", slug="draft"))
        assert job_for(REFERENCE_INDEX_KIND, page_args(page)).state == State.READY
        raise Rollback

    assert jobs_of(REFERENCE_INDEX_KIND) == []
    assert not LinkPage.objects.filter(slug="draft").exists()


def test_deleting_a_document_enqueues_wagtails_file_deletion_that_a_worker_runs(
    workers: Workers,
) -> None:
    document = Document(title="Report", file=ContentFile(b"quarterly numbers", name="report.txt"))
    document.save()
    path = Path(document.file.path)
    name = document.file.name
    assert name == "documents/report.txt"
    assert path.read_bytes() == b"quarterly numbers"

    with transaction.atomic():
        document.delete()
        # Wagtail enqueues the deletion on commit: no job while the transaction is open.
        assert jobs_of(DELETE_FILE_KIND) == []

    (job,) = jobs_of(DELETE_FILE_KIND)
    assert job.state == State.READY
    assert job.payload["args"][1] == name
    assert path.exists(), "nothing runs before a worker does"

    workers.burst("default")

    job.refresh_from_db()
    assert job.state == State.COMPLETED
    result = delete_file_from_storage_task.get_result(str(job.pk))
    assert result.status == TaskResultStatus.SUCCESSFUL, result.errors
    # The side effect: the worker deleted the file from Wagtail's storage.
    assert not path.exists()
