"""tox plugin (loaded by tox 4 from the project root): find pyenv interpreters.

Interpreters on PATH come first; pyenv's installed versions are appended, so
`tox` finds Python 3.12 and 3.13 on machines where only 3.11 is pyenv's
global version. Missing interpreters are skipped (see tox.ini).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path


def _pyenv_bin_dirs() -> list[str]:
    try:
        root = subprocess.run(
            ["pyenv", "root"], capture_output=True, text=True, check=True, timeout=10
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        root = os.environ.get("PYENV_ROOT", str(Path.home() / ".pyenv"))
    versions = Path(root) / "versions"
    if not versions.is_dir():
        return []
    return [str(path / "bin") for path in sorted(versions.iterdir()) if (path / "bin").is_dir()]


os.environ["PATH"] = os.pathsep.join(
    [os.environ.get("PATH", ""), *_pyenv_bin_dirs()]
)
