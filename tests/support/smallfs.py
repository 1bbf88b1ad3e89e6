"""A real small file system for disk-full cases: an ext4 image file loop-mounted (the suite runs as root).

Not a tmpfs: a tmpfs has no blocks, journal or metadata of its own, so what fits in it is not
what fits on a disk. ext4 is made without reserved blocks (`-m 0`), so root's free space and
statvfs's f_bavail agree.
"""

import os
import subprocess
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest


@contextmanager
def small_fs(where: Path, size: int) -> Iterator[Path]:
    """An ext4 file system of `size` bytes mounted at `where` (made), unmounted and removed afterwards."""
    where.mkdir(parents=True, exist_ok=True)
    image = where.with_name(where.name + ".ext4")
    with open(image, "wb") as f:
        f.truncate(size)
    r = subprocess.run(["mkfs.ext4", "-q", "-F", "-m", "0", str(image)], capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        pytest.fail(f"mkfs.ext4 failed: {r.stderr.strip()}", pytrace=False)
    r = subprocess.run(["mount", "-o", "loop", str(image), str(where)], capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        image.unlink()
        pytest.fail(f"cannot loop-mount an ext4 image (the suite runs as root): {r.stderr.strip()}", pytrace=False)
    try:
        (where / "lost+found").rmdir()  # an empty directory a user's disk would not show in the listing
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=False, timeout=60)  # the loop device goes with it (autoclear)
        image.unlink()


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def fill(path: Path, leave: int) -> None:
    """Write a file under `path` so that about `leave` bytes stay free."""
    n = free_bytes(path) - leave
    if n > 0:
        with open(path / ".filler", "wb") as f:
            f.write(b"\0" * n)  # real blocks (not a sparse truncate)
            f.flush()
            os.fsync(f.fileno())
