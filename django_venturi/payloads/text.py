"""Text the database can store: what PostgreSQL refuses, found once for every path.

PostgreSQL stores neither the NUL character (U+0000) in `text` or `jsonb`, nor
surrogate code points (U+D800 to U+DFFF), which have no UTF-8 form. Python
strings hold both easily: NUL comes with binary protocols and subprocess
output, lone surrogates with bytes decoded with `errors="surrogateescape"`
(`os.fsdecode`, `sys.argv`, a subprocess's undecodable output).

Two policies, one per kind of text:

- Free text the worker writes for a run (error types, messages and
  tracebacks, `Outcome.failed` reasons, progress notes) is made storable:
  `storable()` replaces each unstorable character with U+FFFD and says so at
  the end of the text, so the verdict is always written.
- Data (payloads, carries, dedup keys, results) must read back as it was
  given, so it is refused: `problem()` describes the first unstorable
  character, and the caller raises `PayloadError` naming the field.

SQLite could store both, but the same rules apply there, so that a project
behaves the same on either database.
"""

from __future__ import annotations

import re

REPLACEMENT = "\ufffd"
"""What an unstorable character of free text becomes."""

_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def problem(text: str) -> str | None:
    """Describe the first character of `text` that PostgreSQL cannot store, or None.

    The description reads after a field's name: `payload.name contains ...`.
    """
    if text.isascii():  # the common case, and a much faster search
        if "\x00" not in text:
            return None
        return "contains a NUL character (\\x00), which PostgreSQL cannot store"
    found = _UNSTORABLE.search(text)
    if found is None:
        return None
    character = found.group()
    if character == "\x00":
        return "contains a NUL character (\\x00), which PostgreSQL cannot store"
    return (
        f"contains the surrogate code point U+{ord(character):04X} (not valid Unicode; "
        "often an undecodable byte kept by errors='surrogateescape'), "
        "which PostgreSQL cannot store"
    )


def replaced(text: str) -> tuple[str, int]:
    """`text` with every unstorable character replaced by U+FFFD, and how many were.

    A surrogate pair (one character split in two code points, as
    `errors="surrogatepass"` decoding leaves it) becomes that character again
    and is not counted; a lone surrogate and NUL become U+FFFD.
    """
    if problem(text) is None:
        return text, 0
    nuls = text.count("\x00")
    replacements_before = text.count(REPLACEMENT)
    # UTF-16 holds surrogates as they are: a pair decodes to its character, a
    # lone one to U+FFFD.
    joined = text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    lone = joined.count(REPLACEMENT) - replacements_before
    return joined.replace("\x00", REPLACEMENT), nuls + lone


def storable(text: str) -> str:
    """Return free text the database can store, with a note if anything was replaced.

    `"a\\x00b"` becomes `"a\\ufffdb [1 unstorable character replaced with U+FFFD]"`.
    """
    fixed, count = replaced(text)
    if not count:
        return fixed
    characters = "character" if count == 1 else "characters"
    return f"{fixed} [{count} unstorable {characters} replaced with U+FFFD]"


def storable_name(text: str, limit: int) -> str:
    """A short label (an error's type) made storable, at most `limit` characters, no note."""
    return replaced(text[:limit])[0][:limit]


def text_of(value: object) -> str:
    """`str(value)` that never raises: an object whose `__str__` fails is named instead."""
    try:
        return str(value)
    except BaseException as error:  # user code: it may raise anything, even SystemExit
        return (
            f"<str() of this {type_name(type(value))} raised {type_name(type(error))}; "
            "its text is unknown>"
        )


def type_name(kind: type) -> str:
    """`module.QualifiedName` of a class, whatever its attributes hold."""
    module = getattr(kind, "__module__", None)
    name = getattr(kind, "__qualname__", None)
    if not isinstance(name, str):
        name = getattr(kind, "__name__", None)
    name = name if isinstance(name, str) else "<unnamed>"
    return f"{module}.{name}" if isinstance(module, str) and module else name
