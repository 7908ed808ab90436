"""Migration operations that keep a busy job table writable while its schema changes.

On PostgreSQL, `CREATE INDEX` holds a lock that blocks every enqueue and claim
until the whole table is read; `CREATE INDEX CONCURRENTLY` does not. These
operations build and drop indexes concurrently there, and fall back to Django's
plain operations elsewhere (SQLite has no such lock to avoid). A migration that
uses them must set `atomic = False`: PostgreSQL refuses concurrent index builds
inside a transaction.
"""

from __future__ import annotations

from typing import Any

from django.db import models
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.migrations.operations import AddConstraint, AddIndex, RemoveIndex
from django.db.migrations.state import StateApps


def _on_postgresql(schema_editor: BaseDatabaseSchemaEditor) -> bool:
    return bool(schema_editor.connection.vendor == "postgresql")


class AddIndexConcurrently(AddIndex):
    """`AddIndex`, built with `CONCURRENTLY` on PostgreSQL."""

    atomic = False

    def database_forwards(
        self,
        app_label: str,
        schema_editor: BaseDatabaseSchemaEditor,
        from_state: Any,
        to_state: Any,
    ) -> None:
        if not _on_postgresql(schema_editor):
            super().database_forwards(app_label, schema_editor, from_state, to_state)
            return
        model = to_state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            schema_editor.execute(
                str(self.index.create_sql(model, schema_editor, concurrently=True))
            )

    def database_backwards(
        self,
        app_label: str,
        schema_editor: BaseDatabaseSchemaEditor,
        from_state: Any,
        to_state: Any,
    ) -> None:
        if not _on_postgresql(schema_editor):
            super().database_backwards(app_label, schema_editor, from_state, to_state)
            return
        model = from_state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            _drop_index_concurrently(schema_editor, self.index.name)


class RemoveIndexConcurrently(RemoveIndex):
    """`RemoveIndex`, dropped with `CONCURRENTLY` on PostgreSQL."""

    atomic = False

    def database_forwards(
        self,
        app_label: str,
        schema_editor: BaseDatabaseSchemaEditor,
        from_state: Any,
        to_state: Any,
    ) -> None:
        if not _on_postgresql(schema_editor):
            super().database_forwards(app_label, schema_editor, from_state, to_state)
            return
        model = from_state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            _drop_index_concurrently(schema_editor, self.name)

    def database_backwards(
        self,
        app_label: str,
        schema_editor: BaseDatabaseSchemaEditor,
        from_state: Any,
        to_state: Any,
    ) -> None:
        if not _on_postgresql(schema_editor):
            super().database_backwards(app_label, schema_editor, from_state, to_state)
            return
        model = to_state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            index = _index_named(to_state.apps, app_label, self.model_name, self.name)
            schema_editor.execute(str(index.create_sql(model, schema_editor, concurrently=True)))


class AddUniqueIndexConcurrently(AddConstraint):
    """`AddConstraint` for a partial `UniqueConstraint` (a unique index), built concurrently
    on PostgreSQL."""

    atomic = False

    def database_forwards(
        self,
        app_label: str,
        schema_editor: BaseDatabaseSchemaEditor,
        from_state: Any,
        to_state: Any,
    ) -> None:
        if not _on_postgresql(schema_editor):
            super().database_forwards(app_label, schema_editor, from_state, to_state)
            return
        model = to_state.apps.get_model(app_label, self.model_name)
        if not self.allow_migrate_model(schema_editor.connection.alias, model):
            return
        sql = str(self.constraint.create_sql(model, schema_editor))
        if not sql.startswith("CREATE UNIQUE INDEX "):
            raise ValueError(f"{self.constraint.name} is not built as an index: {sql}")
        concurrent = sql.replace("CREATE UNIQUE INDEX ", "CREATE UNIQUE INDEX CONCURRENTLY ", 1)
        schema_editor.execute(concurrent)

    def database_backwards(
        self,
        app_label: str,
        schema_editor: BaseDatabaseSchemaEditor,
        from_state: Any,
        to_state: Any,
    ) -> None:
        if not _on_postgresql(schema_editor):
            super().database_backwards(app_label, schema_editor, from_state, to_state)
            return
        model = from_state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            _drop_index_concurrently(schema_editor, self.constraint.name)


def _drop_index_concurrently(schema_editor: BaseDatabaseSchemaEditor, name: str) -> None:
    schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {schema_editor.quote_name(name)}")


def _index_named(apps: StateApps, app_label: str, model_name: str, name: str) -> models.Index:
    model = apps.get_model(app_label, model_name)
    indexes: list[models.Index] = list(model._meta.indexes)
    for index in indexes:
        if index.name == name:
            return index
    raise LookupError(f"no index {name} on {app_label}.{model_name}")
