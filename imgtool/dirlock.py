"""The lock of a bundle directory: `fetch` and `export` hold it exclusively while they write the directory,
`serve` shared while it serves it, so two writers never mix their parts and a served bundle is never
replaced under its server.

An flock(2) on `DIR/.imgtool-lock`: the kernel drops it when its holder exits, however it ends, so a crash
never leaves a lock to remove by hand (the empty file may stay: the next run takes it over). The holder
writes its verb and pid into the file, so a refusal names it. A lock is taken without waiting: the second
run refuses at once, naming the first. Releasing removes the file while still holding the lock; a run
that locked a file since removed sees that its inode is no longer the path's and takes the new one.
Standard library only: `serve` runs it on Python 3.7.
"""

import errno
import fcntl
import os
from pathlib import Path
from typing import Optional

from .bundle.format import LOCK_NAME
from .errors import ImgtoolError
from .fsutil import remove_quietly

_ATTEMPTS = 5  # a lock file removed and made again between our open and our flock, this many times in a row


class DirectoryBusy(ImgtoolError):
    """Another imgtool run holds the directory's lock: `holder` is what it wrote ("fetch 1234"), or ""."""

    def __init__(self, message: str, hint: Optional[str] = None, holder: str = ""):
        super().__init__(message, hint)
        self.holder = holder


class DirLock:
    """A held lock on a directory (see the module docstring); `release()` (or the with block's end) lets go."""

    def __init__(self, directory: Path, fd: int, verb: str, created: bool):
        self.directory, self.fd, self.verb, self.created = directory, fd, verb, created

    @property
    def path(self) -> Path:
        return self.directory / LOCK_NAME

    def release(self) -> None:
        """Remove the lock file (only an exclusive holder, or the last shared one: another server's lock
        stays), then the directory when this lock made it and nothing else came into it; let go."""
        if self.fd < 0:
            return
        try:
            if self.verb == "serve":  # shared: remove the file only when no other holder is left
                try:
                    fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    return
            remove_quietly(self.path)
            if self.created:
                try:
                    os.rmdir(str(self.directory))
                except OSError:
                    pass  # the bundle (or anything else) is in it: it stays
        finally:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> "DirLock":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def lock_output(directory: Path, verb: str) -> DirLock:
    """The exclusive lock of an output directory (made when missing) for `verb` (fetch, export); raises
    DirectoryBusy naming the run that holds it, ImgtoolError when it cannot be made."""
    directory = Path(directory)
    created = False
    if not directory.is_dir():
        try:
            directory.mkdir(parents=True)
            created = True
        except FileExistsError:
            pass  # made meanwhile (another run), or a file: the open below says which
        except OSError as e:
            raise ImgtoolError(f"cannot create the output directory {directory}: {e.strerror or e}",
                               hint="choose a writable --output directory") from None
    try:
        fd = _locked(directory, fcntl.LOCK_EX, writable=True)
    except BaseException:
        if created:
            try:
                os.rmdir(str(directory))
            except OSError:
                pass
        raise
    if fd is None:  # not reached: an exclusive lock needs a writable file, and _locked raises without one
        raise ImgtoolError(f"cannot lock {directory}")
    _say(fd, verb)
    return DirLock(directory, fd, verb, created)


def lock_served(directory: Path) -> Optional[DirLock]:
    """The shared lock `serve` holds on a bundle directory, so fetch and export --force refuse to replace it;
    None when the directory cannot be written here (then nothing run as this user can replace it either).
    Raises DirectoryBusy while a fetch or export writes it."""
    fd = _locked(Path(directory), fcntl.LOCK_SH, writable=False)
    if fd is None:
        return None
    _say(fd, "serve")
    return DirLock(Path(directory), fd, "serve", False)


def _locked(directory: Path, how: int, writable: bool) -> Optional[int]:
    path = directory / LOCK_NAME
    for _ in range(_ATTEMPTS):
        flags = getattr(os, "O_CLOEXEC", 0) | os.O_NOFOLLOW
        try:
            fd = os.open(str(path), os.O_RDWR | os.O_CREAT | flags, 0o644)
        except OSError as e:
            if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS) and not writable:
                try:  # a lock file this user may only read: a shared flock needs no more
                    fd = os.open(str(path), os.O_RDONLY | flags)
                except OSError:
                    return None  # nor make one: this user cannot change the directory, nor replace the bundle
            else:
                if e.errno == errno.ENOENT:
                    continue  # the directory went away with a released lock: the caller made it, try again
                if e.errno == errno.ENOTDIR:
                    raise ImgtoolError(f"output {directory} exists and is not a directory",
                                       hint="choose another --output") from None
                raise ImgtoolError(f"cannot lock {directory} ({LOCK_NAME}): {e.strerror or e}",
                                   hint="choose a writable --output directory") from None
        try:
            fcntl.flock(fd, how | fcntl.LOCK_NB)
        except OSError as e:
            holder = _holder(fd)
            os.close(fd)
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise ImgtoolError(f"cannot lock {directory} ({LOCK_NAME}): {e.strerror or e}") from None
            raise _busy(directory, holder) from None
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(str(path)))
        except OSError:
            same = False
        if same:
            return fd
        os.close(fd)  # released and removed between our open and our lock: lock the file there now
    raise ImgtoolError(f"cannot lock {directory}: its lock file keeps being replaced ({LOCK_NAME})")


def _busy(directory: Path, holder: str) -> DirectoryBusy:
    verb, _, pid = holder.partition(" ")
    if verb == "serve" and pid.isdigit():
        return DirectoryBusy(f"{directory} is being served by imgtool serve (pid {pid}); it was not changed",
                             hint="stop that server first, or write the new bundle to another --output", holder=holder)
    if verb in ("fetch", "export", "load") and pid.isdigit():
        return DirectoryBusy(f"{directory} is being written by imgtool {verb} (pid {pid}); nothing was done",
                             hint="wait for it to finish, or choose another directory", holder=holder)
    return DirectoryBusy(f"{directory} is in use by another imgtool run (its lock file {LOCK_NAME} names none); "
                         "nothing was done", hint="wait for it to finish, or choose another directory", holder=holder)


def _holder(fd: int) -> str:
    try:
        return os.pread(fd, 64, 0).decode("ascii", "replace").split("\n")[0].strip()
    except OSError:
        return ""


def _say(fd: int, verb: str) -> None:
    """Who holds it, for the refusal a second run gives: best effort (a read-only lock file says nothing)."""
    text = f"{verb} {os.getpid()}\n".encode()
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, text, 0)
    except OSError:
        pass


