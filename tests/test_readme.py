"""The README's quick start, followed verbatim in a new project, as a new user pastes it.

Its code blocks are the steps, in order: each shell line runs as written (with
`python` and `django-admin` being this interpreter), and each Python block is
written to the file its first line names (`# shop/tasks.py`), or appended to it
(`# mysite/settings.py: add at the end`). The database blocks are alternatives
(`..., for PostgreSQL` / `..., for SQLite instead`): the test runs once with each.
Only two things differ from a user's run: `createdb` becomes a database of this
run's own on DATABASE_URL's server, and the PostgreSQL settings get its name and
address after the README's lines. The signup posted from the shell must end with
its welcome email sent by a burst worker.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import environ
import pytest
from django.conf import settings

import django_venturi
from tests.conftest import ROOT
from tests.database import create_database, drop_database, url_of

README = ROOT / "README.md"
DATABASE = f"venturi_readme{settings.RUN_SUFFIX}"
FILE_HEADER = re.compile(
    r"# (?P<path>[\w/.]+)"
    r"(?P<append>: add at the end(?:, for (?P<database>PostgreSQL|SQLite)\b.*)?)?"
)
FENCE = re.compile(r"^```(?P<language>\w*)\n(?P<body>.*?)^```$", re.M | re.S)


@dataclasses.dataclass(frozen=True)
class Command:
    """One shell line of the quick start."""

    line: str


@dataclasses.dataclass(frozen=True)
class File:
    """One Python block of the quick start: a file to write, or lines to add to one."""

    path: str
    text: str
    append: bool
    database: str | None
    """"PostgreSQL" or "SQLite" for the database alternatives, else None."""


def section(text: str, title: str) -> str:
    """The body of the README's `## title` section."""
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def quick_start_steps(text: str) -> list[Command | File]:
    """The quick start's code blocks, in order, as commands and files."""
    steps: list[Command | File] = []
    for block in FENCE.finditer(section(text, "Quick start")):
        body = block["body"]
        if block["language"] == "sh":
            steps += [
                Command(line)
                for line in body.splitlines()
                if line.strip() and not line.startswith("#")
            ]
            continue
        assert block["language"] == "python", f"a quick-start block in {block['language']!r}"
        header = body.partition("\n")[0]
        match = FILE_HEADER.fullmatch(header)
        assert match, f"a Python block of the quick start must name its file first: {header!r}"
        steps.append(File(match["path"], body, bool(match["append"]), match["database"]))
    return steps


def shims(directory: Path) -> dict[str, str]:
    """The README's `python` and `django-admin`, as this interpreter: its environment."""
    directory.mkdir()
    for name, command in (("python", ""), ("django-admin", " -m django")):
        shim = directory / name
        shim.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)}{command} "$@"\n')
        shim.chmod(0o755)
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in {"DJANGO_SETTINGS_MODULE", "DATABASE_URL"} and not key.startswith("VENTURI_")
    }
    env["PATH"] = f"{directory}{os.pathsep}{env['PATH']}"
    env["PYTHONPATH"] = str(ROOT)  # this checkout's django_venturi, as if installed
    return env


class NewProject:
    """Follows the quick start in a temporary directory, on one of its databases."""

    def __init__(self, tmp_path: Path, database: str) -> None:
        self.cwd = tmp_path / "work"
        self.cwd.mkdir()
        self.database = database
        self.env = shims(tmp_path / "bin")
        self.outputs: dict[str, str] = {}

    def follow(self, steps: list[Command | File]) -> None:
        for step in steps:
            if isinstance(step, Command):
                self.run(step.line)
            elif step.database in (None, self.database):
                self.write(step)

    def run(self, line: str) -> None:
        if line.startswith("cd "):
            self.cwd = self.cwd / line.removeprefix("cd ").strip()
            return
        if line.startswith("createdb "):
            if self.database == "PostgreSQL":
                create_database(DATABASE)  # this run's own database, not `mysite`
            return
        self.outputs[line] = self.shell(line)

    def shell(self, line: str) -> str:
        result = subprocess.run(
            line,
            shell=True,
            cwd=self.cwd,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        output = result.stdout + result.stderr
        assert result.returncode == 0, f"`{line}` exited {result.returncode}:\n{output}"
        return output

    def write(self, step: File) -> None:
        path = self.cwd / step.path
        if not step.append:
            path.write_text(step.text)
            return
        with path.open("a") as file:
            file.write("\n" + step.text)
            if step.database == "PostgreSQL":
                file.write(self.own_database())

    def own_database(self) -> str:
        """Settings lines that point the README's PostgreSQL settings at this run's database."""
        config = environ.Env.db_url_config(url_of(DATABASE))
        address = {key: config[key] for key in ("NAME", "USER", "PASSWORD", "HOST", "PORT")}
        return (
            "\n# tests/test_readme.py: this run's own database on DATABASE_URL's server\n"
            f'DATABASES["default"].update({address!r})\n'
        )


CHECK = """
from django_venturi.models import Job
from shop.models import Signup

job = Job.objects.get()
assert (job.kind, job.state) == ("shop.send_email", "completed"), (job.state, job.last_error)
assert list(Signup.objects.values_list("email", flat=True)) == ["ada@example.com"]
print("checked", job.kind, job.state)
"""


@pytest.fixture
def readme_database() -> Iterator[None]:
    yield
    drop_database(DATABASE)


@pytest.mark.parametrize("database", ["PostgreSQL", "SQLite"])
def test_the_quick_start_works_verbatim_in_a_new_project(
    tmp_path: Path, database: str, readme_database: None
) -> None:
    steps = quick_start_steps(README.read_text())
    project = NewProject(tmp_path, database)
    project.follow(steps)

    [posted] = [out for line, out in project.outputs.items() if "/signup/" in line]
    assert "Thanks! A welcome email to ada@example.com is on its way." in posted, posted
    [worked] = [out for line, out in project.outputs.items() if "venturi_worker" in line]
    assert "Subject: Welcome" in worked and "To: ada@example.com" in worked, worked
    assert "Thanks for signing up!" in worked, worked

    assert "checked shop.send_email completed" in project.shell(
        f"python manage.py shell -c {shlex.quote(CHECK)}"
    )


def test_the_quick_start_covers_every_step() -> None:
    """The path is complete: a project, an app, its settings, model, task, view and URL,
    both databases, migrations, a request and a worker."""
    steps = quick_start_steps(README.read_text())
    lines = [step.line for step in steps if isinstance(step, Command)]
    files = {(step.path, step.database) for step in steps if isinstance(step, File)}
    assert lines[:3] == [
        "django-admin startproject mysite",
        "cd mysite",
        "python manage.py startapp shop",
    ]
    assert {
        ("mysite/settings.py", None),
        ("mysite/settings.py", "PostgreSQL"),
        ("mysite/settings.py", "SQLite"),
        ("shop/models.py", None),
        ("shop/tasks.py", None),
        ("shop/views.py", None),
        ("mysite/urls.py", None),
    } <= files
    assert "python manage.py migrate" in lines
    assert lines[-1] == "python manage.py venturi_worker --burst"


def test_the_install_instructions_name_this_version_s_wheel() -> None:
    """The README's and the guide's `pip install dist/django_venturi-<version>-...whl`."""
    texts = section(README.read_text(), "Install") + (ROOT / "docs" / "guide.md").read_text()
    wheels = re.findall(r"django_venturi-([^-]+)-py3-none-any\.whl", texts)
    assert len(wheels) == 2 and set(wheels) == {django_venturi.__version__}, wheels
