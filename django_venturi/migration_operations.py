"""Migration operations that keep a busy job table writable while its schema changes.

On PostgreSQL, `CREATE INDEX` holds a lock that blocks every enqueue and claim
until the whole table is read; `CREATE INDEX CONCURRENTLY` does not. These
operations build and drop indexes concurrently there, and fall back to Django's
plain operations elsewhere (SQLite has no such lock to avoid). A migration that
uses them must set `atomic = False`: PostgreSQL refuses concurrent index builds
inside a transaction.

MariaDB and MySQL index at most 3,072 bytes of a row, and a text column only by a
prefix: there, an index over a `TextField` covers its first TEXT_PREFIX characters
(`AddIndexWithTextPrefixes`, and the concurrent addition). They have no partial
indexes: Django builds such an index over the whole table, without its condition.
"""

from __future__ import annotations

from typing import Any

from django.db import models
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.migrations.operations import AddConstraint, AddIndex, RemoveIndex
from django.db.migrations.operations.base import Operation

TEXT_PREFIX = 191
"""Characters of a text column that a MariaDB or MySQL index covers (764 bytes in utf8mb4)."""


def _on_postgresql(schema_editor: BaseDatabaseSchemaEditor) -> bool:
    return bool(schema_editor.connection.vendor == "postgresql")


def _on_mysql(schema_editor: BaseDatabaseSchemaEditor) -> bool:
    return bool(schema_editor.connection.vendor == "mysql")


def _indexes_text(model: type[models.Model], index: models.Index) -> bool:
    return any(isinstance(model._meta.get_field(name), models.TextField) for name in index.fields)


def _prefixed_index_sql(
    model: type[models.Model], index: models.Index, schema_editor: BaseDatabaseSchemaEditor
) -> str:
    """`CREATE INDEX` for MariaDB and MySQL, text columns indexed by their prefix."""
    quote = schema_editor.quote_name
    columns = []
    for name in index.fields:
        field = model._meta.get_field(name)
        column = quote(str(getattr(field, "column", name)))
        prefix = f"({TEXT_PREFIX})" if isinstance(field, models.TextField) else ""
        columns.append(column + prefix)
    table = quote(model._meta.db_table)
    return f"CREATE INDEX {quote(str(index.name))} ON {table} ({', '.join(columns)})"


def _added_with_prefixes(
    operation: AddIndex, app_label: str, schema_editor: BaseDatabaseSchemaEditor, to_state: Any
) -> bool:
    """Build the index of `operation` with text prefixes on MariaDB and MySQL when it covers
    a text column; whether it did (if not, Django's own operation builds it)."""
    model = to_state.apps.get_model(app_label, operation.model_name)
    if not (_on_mysql(schema_editor) and _indexes_text(model, operation.index)):
        return False
    if operation.allow_migrate_model(schema_editor.connection.alias, model):
        schema_editor.execute(_prefixed_index_sql(model, operation.index, schema_editor))
    return True


class AddIndexWithTextPrefixes(AddIndex):
    """`AddIndex`; on MariaDB and MySQL, its text columns are indexed by their prefix."""

    def database_forwards(
        self,
        app_label: str,
        schema_editor: BaseDatabaseSchemaEditor,
        from_state: Any,
        to_state: Any,
    ) -> None:
        if not _added_with_prefixes(self, app_label, schema_editor, to_state):
            super().database_forwards(app_label, schema_editor, from_state, to_state)


class _Concurrently(Operation):
    """What the three operations share: off PostgreSQL, the plain operation; on it, the
    index is created (from the state that has it) or dropped, concurrently.

    `creates_forwards` says which way creates: an addition creates going forwards
    and drops going backwards, a removal the other way round.
    """

    atomic = False
    creates_forwards: bool
    model_name: str

    def database_forwards(
        self,
        app_label: str,
        schema_editor: BaseDatabaseSchemaEditor,
        from_state: Any,
        to_state: Any,
    ) -> None:
        if _on_postgresql(schema_editor):
            create = self.creates_forwards
            self._concurrently(app_label, schema_editor, from_state, to_state, create)
        elif isinstance(self, AddIndex) and _added_with_prefixes(
            self, app_label, schema_editor, to_state
        ):
            return
        else:
            super().database_forwards(app_label, schema_editor, from_state, to_state)

    def database_backwards(
        self,
        app_label: str,
        schema_editor: BaseDatabaseSchemaEditor,
        from_state: Any,
        to_state: Any,
    ) -> None:
        if _on_postgresql(schema_editor):
            create = not self.creates_forwards
            self._concurrently(app_label, schema_editor, from_state, to_state, create)
        else:
            super().database_backwards(app_label, schema_editor, from_state, to_state)

    def _concurrently(
        self,
        app_label: str,
        schema_editor: BaseDatabaseSchemaEditor,
        from_state: Any,
        to_state: Any,
        create: bool,
    ) -> None:
        # The index exists in the state being migrated to when creating, from when dropping.
        state = to_state if create else from_state
        model = state.apps.get_model(app_label, self.model_name)
        if not self.allow_migrate_model(schema_editor.connection.alias, model):
            return
        if create:
            schema_editor.execute(self._create_sql(model, schema_editor))
        else:
            _drop_index_concurrently(schema_editor, self._index_name())

    def _create_sql(
        self, model: type[models.Model], schema_editor: BaseDatabaseSchemaEditor
    ) -> str:
        raise NotImplementedError

    def _index_name(self) -> str:
        raise NotImplementedError


class AddIndexConcurrently(_Concurrently, AddIndex):
    """`AddIndex`, built with `CONCURRENTLY` on PostgreSQL."""

    creates_forwards = True

    def _create_sql(
        self, model: type[models.Model], schema_editor: BaseDatabaseSchemaEditor
    ) -> str:
        return str(self.index.create_sql(model, schema_editor, concurrently=True))

    def _index_name(self) -> str:
        return str(self.index.name)


class RemoveIndexConcurrently(_Concurrently, RemoveIndex):
    """`RemoveIndex`, dropped with `CONCURRENTLY` on PostgreSQL."""

    creates_forwards = False

    def _create_sql(
        self, model: type[models.Model], schema_editor: BaseDatabaseSchemaEditor
    ) -> str:
        index = _index_named(model, self.name)
        return str(index.create_sql(model, schema_editor, concurrently=True))

    def _index_name(self) -> str:
        return str(self.name)


class AddUniqueIndexConcurrently(_Concurrently, AddConstraint):
    """`AddConstraint` for a partial `UniqueConstraint` (a unique index), built concurrently
    on PostgreSQL."""

    creates_forwards = True

    def _create_sql(
        self, model: type[models.Model], schema_editor: BaseDatabaseSchemaEditor
    ) -> str:
        sql = str(self.constraint.create_sql(model, schema_editor))
        if not sql.startswith("CREATE UNIQUE INDEX "):
            raise ValueError(f"{self.constraint.name} is not built as an index: {sql}")
        return sql.replace("CREATE UNIQUE INDEX ", "CREATE UNIQUE INDEX CONCURRENTLY ", 1)

    def _index_name(self) -> str:
        return str(self.constraint.name)


def _drop_index_concurrently(schema_editor: BaseDatabaseSchemaEditor, name: str) -> None:
    schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {schema_editor.quote_name(name)}")


def _index_named(model: type[models.Model], name: str) -> models.Index:
    indexes: list[models.Index] = list(model._meta.indexes)
    for index in indexes:
        if index.name == name:
            return index
    raise LookupError(f"no index {name} on {model._meta.label}")


class SetStorageParameters(Operation):
    """`ALTER TABLE ... SET (parameter = value, ...)` on PostgreSQL; nothing elsewhere.

    Going backwards resets the same parameters to the server's defaults. Storage
    parameters change no column, so the migration state is untouched.
    """

    reversible = True

    def __init__(self, model_name: str, parameters: dict[str, int | float]) -> None:
        if not parameters:
            raise ValueError("parameters must name at least one storage parameter")
        for name in parameters:
            if not name.replace("_", "").isalpha():
                raise ValueError(f"parameters: {name!r} is not a storage parameter's name")
        self.model_name = model_name
        self.parameters = dict(parameters)

    def deconstruct(self) -> tuple[str, list[Any], dict[str, Any]]:
        kwargs = {"model_name": self.model_name, "parameters": self.parameters}
        return self.__class__.__qualname__, [], kwargs

    def state_forwards(self, app_label: str, state: Any) -> None:
        pass

    def database_forwards(
        self,
        app_label: str,
        schema_editor: BaseDatabaseSchemaEditor,
        from_state: Any,
        to_state: Any,
    ) -> None:
        settings = ", ".join(f"{name} = {value!r}" for name, value in self.parameters.items())
        self._alter(app_label, schema_editor, to_state, f"SET ({settings})")

    def database_backwards(
        self,
        app_label: str,
        schema_editor: BaseDatabaseSchemaEditor,
        from_state: Any,
        to_state: Any,
    ) -> None:
        self._alter(app_label, schema_editor, from_state, f"RESET ({', '.join(self.parameters)})")

    def _alter(
        self, app_label: str, schema_editor: BaseDatabaseSchemaEditor, state: Any, change: str
    ) -> None:
        if not _on_postgresql(schema_editor):
            return
        model = state.apps.get_model(app_label, self.model_name)
        if not self.allow_migrate_model(schema_editor.connection.alias, model):
            return
        table = schema_editor.quote_name(model._meta.db_table)
        schema_editor.execute(f"ALTER TABLE {table} {change}")

    def describe(self) -> str:
        return f"Set storage parameters of {self.model_name} (PostgreSQL)"
