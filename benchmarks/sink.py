"""The shared sink: one fixed-width 27-byte line "%08d %.6f\\n" per handled job.

Every worker process appends to the same file, opened with O_APPEND and written
with one `os.write()` per job, so lines never interleave. The harness follows
the file by size (27 bytes per line) and parses only complete lines.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field

LINE_BYTES = 27
SINK_ENV = "VENTURI_BENCH_SINK"

_fd: int | None = None
_lock = threading.Lock()


def _open() -> int:
    global _fd
    with _lock:
        if _fd is None:
            _fd = os.open(os.environ[SINK_ENV], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        return _fd


def record(i: int, t: float) -> None:
    """Append `(i, t)`: one os.write of one 27-byte line."""
    fd = _fd if _fd is not None else _open()
    os.write(fd, b"%08d %.6f\n" % (i, t))


def handle(i: int) -> None:
    """What every benchmark handler does: read the wall clock on entry, then append."""
    record(i, time.time())


@dataclass
class SinkReader:
    """Follows a sink file: `poll()` parses the complete lines written since the last call."""

    path: str
    offset: int = 0
    times: dict[int, list[float]] = field(default_factory=dict)
    lines: int = 0
    malformed: int = 0

    def size(self) -> int:
        try:
            return os.stat(self.path).st_size
        except FileNotFoundError:
            return 0

    def poll(self) -> int:
        """Read new complete lines; return how many distinct `i` have been seen."""
        size = self.size()
        complete = (size - self.offset) // LINE_BYTES * LINE_BYTES
        if complete > 0:
            with open(self.path, "rb") as sink:
                sink.seek(self.offset)
                data = sink.read(complete)
            self.offset += len(data)
            for start in range(0, len(data), LINE_BYTES):
                line = data[start : start + LINE_BYTES]
                try:
                    index_text, time_text = line.split()
                    i, t = int(index_text), float(time_text)
                except ValueError:
                    self.malformed += 1
                    continue
                if len(line) != LINE_BYTES or line[-1:] != b"\n":
                    self.malformed += 1
                    continue
                self.times.setdefault(i, []).append(t)
                self.lines += 1
        return len(self.times)

    def duplicates(self) -> dict[int, int]:
        return {i: len(ts) for i, ts in self.times.items() if len(ts) > 1}

    def first_time(self, i: int) -> float | None:
        ts = self.times.get(i)
        return min(ts) if ts else None
