"""An editor at work on a site that `wagtail start` made: Wagtail's own admin views, through a
logged-in test client that posts the forms the admin renders, as a browser would.

tests/wagtail_check/test_wagtail_site.py copies this file into the site's directory and
runs it there (`python editor.py STEP [ARGUMENT]`), with the site's own settings. Its
editing steps know nothing of venturi; `jobs` reads the jobs back, through the Tasks API.
Each step prints what it saw as JSON.
"""

from __future__ import annotations

import io
import json
import sys
from html.parser import HTMLParser
from typing import Any

import django

django.setup()

from django.contrib.auth import get_user_model  # noqa: E402 - after setup()
from django.core.files.uploadedfile import SimpleUploadedFile  # noqa: E402
from django.test import Client  # noqa: E402
from PIL import Image as PillowImage  # noqa: E402
from wagtail.documents import get_document_model  # noqa: E402
from wagtail.images import get_image_model  # noqa: E402
from wagtail.models import Page, ReferenceIndex  # noqa: E402

EDITOR = "editor"

Fields = list[tuple[str, str]]


class FormFields(HTMLParser):
    """The fields a browser submits, no button pressed, from the form posting to `action`."""

    def __init__(self, action: str) -> None:
        super().__init__(convert_charrefs=True)
        self.action = action
        self.fields: Fields = []
        self._forms: list[bool] = []
        """One entry per open <form>: whether it is the one read."""
        self._textarea: str | None = None
        self._text: list[str] = []
        self._select: str | None = None
        self._options: list[tuple[str, bool]] = []

    @property
    def _inside(self) -> bool:
        return any(self._forms)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = {name: value or "" for name, value in attrs}
        if tag == "form":
            self._forms.append(attributes.get("action") == self.action)
        elif not self._inside or "disabled" in attributes:
            return
        elif tag == "input":
            self._input(attributes)
        elif tag == "textarea" and attributes.get("name"):
            self._textarea, self._text = attributes["name"], []
        elif tag == "select" and attributes.get("name"):
            self._select, self._options = attributes["name"], []
        elif tag == "option" and self._select is not None:
            self._options.append((attributes.get("value", ""), "selected" in attributes))

    def _input(self, attributes: dict[str, str]) -> None:
        name, kind = attributes.get("name"), attributes.get("type", "text")
        if not name or kind in {"submit", "button", "image", "reset", "file"}:
            return
        if kind in {"checkbox", "radio"} and "checked" not in attributes:
            return
        self.fields.append((name, attributes.get("value", "on" if kind == "checkbox" else "")))

    def handle_data(self, data: str) -> None:
        if self._textarea is not None:
            self._text.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "form" and self._forms:
            self._forms.pop()
        elif tag == "textarea" and self._textarea is not None:
            self.fields.append((self._textarea, "".join(self._text).removeprefix("\n")))
            self._textarea = None
        elif tag == "select" and self._select is not None:
            chosen = [value for value, selected in self._options if selected]
            first = [value for value, _ in self._options[:1]]
            self.fields.extend((self._select, value) for value in chosen or first)
            self._select = None


def form_of(client: Client, url: str) -> dict[str, Any]:
    """GET `url` and read its form (the one posting back to `url`), filled in by default."""
    response = client.get(url)
    assert response.status_code == 200, (url, response.status_code)
    reader = FormFields(url)
    reader.feed(response.content.decode())
    assert reader.fields, f"no form posting to {url}"
    data: dict[str, Any] = {}
    for name, value in reader.fields:
        data.setdefault(name, []).append(value)
    return data


def submit(client: Client, url: str, data: dict[str, Any]) -> None:
    """POST a form; Wagtail's admin redirects after a success and re-renders on errors."""
    response = client.post(url, data)
    if response.status_code != 302:
        body = response.content.decode(errors="replace")
        errors = [line.strip() for line in body.splitlines() if "error" in line.lower()][:20]
        raise AssertionError(f"POST {url}: {response.status_code}\n" + "\n".join(errors))


def logged_in() -> Client:
    user_model = get_user_model()
    user = user_model.objects.filter(username=EDITOR).first()
    if user is None:
        user = user_model.objects.create_superuser(EDITOR, "editor@example.com", None)
    client = Client()
    client.force_login(user)
    return client


def png() -> bytes:
    buffer = io.BytesIO()
    PillowImage.new("RGB", (64, 48), (200, 120, 40)).save(buffer, format="PNG")
    return buffer.getvalue()


# ---------------------------------------------------------------- steps


def publish(word: str) -> dict[str, Any]:
    """Add a page under the home page and publish it, edit and publish it again, add a
    redirect to it, upload an image and a document; say what search finds already."""
    client = logged_in()
    home = Page.objects.get(depth=2)
    model = home.specific_class._meta
    add_url = f"/admin/pages/add/{model.app_label}/{model.model_name}/{home.pk}/"
    data = form_of(client, add_url)
    data.update(title=f"First draft {word}", slug=word, **{"action-publish": "action-publish"})
    submit(client, add_url, data)
    page = Page.objects.get(slug=word)

    edit_url = f"/admin/pages/{page.pk}/edit/"
    data = form_of(client, edit_url)
    data.update(title=f"Venturi {word}", **{"action-publish": "action-publish"})
    submit(client, edit_url, data)

    # A redirect: Wagtail enqueues a purge of its old URL from the frontend cache.
    data = form_of(client, "/admin/redirects/add/")
    data.update(old_path=f"/old-{word}", redirect_page=str(page.pk))
    submit(client, "/admin/redirects/add/", data)

    data = form_of(client, "/admin/images/add/")
    data.update(title=f"Image {word}", file=SimpleUploadedFile(f"{word}.png", png(), "image/png"))
    submit(client, "/admin/images/add/", data)
    image = get_image_model().objects.get(title=f"Image {word}")

    document_file = SimpleUploadedFile(f"{word}.txt", b"the minutes", "text/plain")
    data = form_of(client, "/admin/documents/add/")
    data.update(title=f"Document {word}", file=document_file)
    submit(client, "/admin/documents/add/", data)
    document = get_document_model().objects.get(title=f"Document {word}")
    return {
        "page": page.pk,
        "image": image.pk,
        "document": document.pk,
        "document_path": document.file.path,
        "search": search(word),
    }


def delete_document(document_id: str) -> dict[str, Any]:
    client = logged_in()
    url = f"/admin/documents/delete/{document_id}/"
    submit(client, url, form_of(client, url))
    return {"exists": get_document_model().objects.filter(pk=document_id).exists()}


def jobs() -> list[dict[str, Any]]:
    """Every job of the site, read back through the Tasks API as Wagtail's code would."""
    from django_tasks import task_backends

    from django_venturi.models import Job

    backend = task_backends["default"]
    found = []
    for job_id, kind, state in Job.objects.order_by("id").values_list("id", "kind", "state"):
        result = backend.get_result(str(job_id))
        errors = [f"{error.exception_class_path}: {error.traceback}" for error in result.errors]
        found.append({"kind": kind, "state": state, "status": str(result.status), "errors": errors})
    return found


def search(word: str) -> list[int]:
    """The live pages that Wagtail's search backend finds for `word`."""
    return [page.pk for page in Page.objects.live().search(word)]


def indexes(word: str) -> dict[str, Any]:
    """What the search index holds of the page `word`, and the reference index of its
    image and document (the template's page model has no field that refers to anything,
    so pages have no rows of their own)."""
    page = Page.objects.get(slug=word)
    image = get_image_model().objects.get(title=f"Image {word}")
    document = get_document_model().objects.get(title=f"Document {word}")
    return {
        "live": page.live,
        "title": page.title,
        "search": search(word),
        "image_references": references_of(image),
        "document_references": references_of(document),
    }


def references_of(instance: Any) -> list[str]:
    return sorted(row.model_path for row in ReferenceIndex.get_references_for_object(instance))


STEPS: dict[str, Any] = {
    "publish": publish,
    "delete-document": delete_document,
    "indexes": indexes,
    "jobs": jobs,
}

if __name__ == "__main__":
    step, *arguments = sys.argv[1:]
    print(json.dumps(STEPS[step](*arguments)))
