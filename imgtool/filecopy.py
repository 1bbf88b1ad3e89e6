"""A file's bytes copied in the kernel from regions of other files (an uncompressed bundle's parts), and hashed from the
copy (issue 48's placement: `cp -r` copies with copy_file_range; a copy through Python's buffers took 3× as long).

`copy_regions` copies each region into an open file with `os.copy_file_range` (Python 3.8+), else `os.sendfile`
(Python 3.7, the pyz's), else reads and writes, and a worker thread reads the bytes back from the COPY as it grows and
hashes them (sha256, and the git blob sha1 where asked): what is checked is what was placed, so a source changed
during the copy cannot put unchecked bytes in place. The two run on two cores (the kernel's copy and hashlib both
release the GIL); memory is one read buffer, whatever the file's size. Stdlib only, Python 3.7.
"""

import errno
import hashlib
import os
from dataclasses import dataclass
from typing import Callable, Optional, Sequence, Tuple

from .fsutil import open_regular
from .worker import Worker

STEP = 8 << 20  # bytes per copy call: the hasher is told of each step
HASH_READ = 1 << 20
# the ways to copy, best first (tests take the fallbacks away); a way the kernel or file system refuses is dropped
METHODS: Tuple[str, ...] = ("copy_file_range", "sendfile", "read")
_FALLBACK_ERRNOS = {errno.ENOSYS, errno.EXDEV, errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EPERM,
                    errno.EBADF, errno.ETXTBSY}


@dataclass(frozen=True)
class Regions:
    """Where a file's bytes lie: (path, offset, length) of each region, in order (a member of a bundle's archive may
    span two parts)."""

    regions: Tuple[Tuple[str, int, int], ...]

    @property
    def size(self) -> int:
        return sum(n for _, _, n in self.regions)


@dataclass(frozen=True)
class Copied:
    """What `copy_regions` wrote and what the bytes it wrote hash to."""

    size: int
    sha256: str
    git_sha1: Optional[str]


def copy_regions(source: Regions, out_fd: int, out_path: str, git_header: Optional[bytes] = None,
                 methods: Optional[Sequence[str]] = None) -> Copied:
    """Copy `source` into `out_fd` (an empty file open for writing at `out_path`) and hash what was written, read back
    from `out_path`: sha256, and with `git_header` the git blob sha1 too. A region shorter than it says (its file
    shrank) ends the copy there: the caller compares `size`. Raises OSError, NotRegularFile."""
    ways = [m for m in (methods if methods is not None else METHODS)
            if m != "copy_file_range" or hasattr(os, "copy_file_range")]
    with Worker(_hasher(out_path, git_header), "placed-sha256", maxsize=1 << 12) as hasher:
        done = 0
        for path, offset, length in source.regions:
            with open_regular(path) as src:
                got = _copy(src.fileno(), out_fd, offset, length, ways, done, hasher.put)
            done += got
            if got < length:
                break
        sha, git = hasher.result()
    return Copied(done, sha, git)


def _copy(src: int, out: int, offset: int, length: int, ways: list, base: int, told: Callable[[int], None]) -> int:
    """`length` bytes of `src` from `offset` appended to `out`, `told` base + the count after each step; fewer only
    when `src` ends first. A way that fails before a byte of this region moved is dropped for the next one."""
    done = 0
    while done < length:
        want = min(STEP, length - done)
        try:
            n = _step(ways[0], src, out, offset + done, want)
        except OSError as e:
            if e.errno not in _FALLBACK_ERRNOS or len(ways) == 1 or done:
                raise
            ways.pop(0)
            continue
        if n == 0:
            break
        done += n
        told(base + done)
    return done


def _step(way: str, src: int, out: int, at: int, n: int) -> int:
    if way == "copy_file_range":
        return os.copy_file_range(src, out, n, at)  # type: ignore[attr-defined,unused-ignore]
    if way == "sendfile":
        return os.sendfile(out, src, at, n)
    data = os.pread(src, min(n, HASH_READ), at)
    view = memoryview(data)
    while view:
        view = view[os.write(out, view):]
    return len(data)


def _hasher(path: str, git_header: Optional[bytes]):
    """A Worker target: read `path` up to each count fed to it, hashing; returns (sha256 hex, git sha1 hex or None)."""
    def run(feed) -> Tuple[str, Optional[str]]:
        sha = hashlib.sha256()
        git = hashlib.sha1(git_header) if git_header is not None else None
        buf = bytearray(HASH_READ)
        view = memoryview(buf)
        at = 0
        with open(path, "rb", buffering=0) as f:
            for upto in feed:
                while at < upto:
                    n = f.readinto(view[:min(HASH_READ, upto - at)])
                    if not n:
                        raise OSError(errno.EIO, f"{path} is shorter than what was copied into it")
                    sha.update(view[:n])
                    if git is not None:
                        git.update(view[:n])
                    at += n
        return sha.hexdigest(), (git.hexdigest() if git is not None else None)

    return run
