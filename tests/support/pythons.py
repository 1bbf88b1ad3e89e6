"""The interpreters pyenv holds on every machine of this kind (3.6-3.13), found where pyenv says, never at a fixed path."""

import functools
import os
import subprocess
from pathlib import Path
from typing import Optional


@functools.lru_cache(maxsize=None)
def pyenv_root() -> str:
    """`pyenv root`, or ~/.pyenv where pyenv is not on PATH (asked once a process: pyenv is a shell script)."""
    try:
        found = subprocess.run(["pyenv", "root"], capture_output=True, text=True, timeout=30).stdout.strip()
    except OSError:
        found = ""
    return found or os.path.expanduser("~/.pyenv")


def pyenv_python(version: str) -> Optional[str]:
    """The newest pyenv python3.X (`pyenv root`/versions), or None."""
    found = sorted(Path(pyenv_root(), "versions").glob(f"{version}.*/bin/python{version}"))
    return str(found[-1]) if found else None
