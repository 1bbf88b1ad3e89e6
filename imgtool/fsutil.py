"""Writing files so that a crash never leaves a half-written one under the final name, and
opening files to read so that what is not a regular file (a FIFO) never blocks the reader."""

import io
import os
import stat
import threading
from pathlib import Path


def write_atomic(path: Path, data: bytes, mode: int = 0o644, sync: bool = True) -> None:
    """Write `data` to a temp file beside `path`, fsync (unless not `sync`: a file that may be lost, never torn),
    chmod, rename; raises OSError."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{threading.get_ident()}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            if sync:
                os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        remove_quietly(tmp)
        raise


def fsync_dir(path: Path, strict: bool = False) -> None:
    """fsync a directory so a rename in it survives a crash; OSError only when `strict`."""
    try:
        fd = os.open(str(path), os.O_RDONLY)
    except OSError:
        if strict:
            raise
        return
    try:
        os.fsync(fd)
    except OSError:
        if strict:
            raise
    finally:
        os.close(fd)


class NotRegularFile(OSError):
    """A path names a directory, FIFO, device or socket where a regular file is expected."""

    def __init__(self, path, kind: str):
        super().__init__(f"{path} is not a regular file ({kind})")
        self.path, self.kind = str(path), kind


def file_kind(mode: int) -> str:
    """What a non-regular st_mode is, in words: 'a directory', 'a FIFO', 'a device', 'a socket'."""
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a file"


def require_regular(path) -> os.stat_result:
    """os.stat(path) (symlinks followed) when it is a regular file; raises NotRegularFile or OSError."""
    st = os.stat(str(path))
    if not stat.S_ISREG(st.st_mode):
        raise NotRegularFile(path, file_kind(st.st_mode))
    return st


def open_regular(path) -> io.FileIO:
    """Open a regular file for reading without ever blocking on what is not one: the open is
    non-blocking (a FIFO with no writer would block a plain open forever), the kind is checked on
    the open descriptor (no race with a rename), then the descriptor is made blocking again.
    Unbuffered (callers read in big blocks). Raises NotRegularFile (a directory, FIFO, device,
    socket; symlinks are followed) or OSError."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)
    fd = os.open(str(path), flags)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFile(path, file_kind(st.st_mode))
        if flags & getattr(os, "O_NONBLOCK", 0):
            import fcntl

            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
        return io.FileIO(fd, "rb", closefd=True)
    except BaseException:
        os.close(fd)
        raise


def remove_quietly(path) -> bool:
    """Remove the file at `path`; whether it was removed (one already gone or not removable is left as it is)."""
    try:
        os.unlink(path)
    except OSError:
        return False
    return True


def process_alive(pid: int) -> bool:
    """Whether process `pid` exists (one of another user's counts): the holder named in a lock or a staged
    file's name, before what it left is taken for debris."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return pid > 0  # 0 would name this process group, not a process


def allocate(fd: int, size: int) -> None:
    """Reserve the disk blocks of a file's first `size` bytes (Linux fallocate, mode 0: the file reads as before), so
    a disk too small fails here, before anything is written into it; raises OSError (ENOSPC). A file system without
    fallocate, or a system without it, reserves nothing (glibc's posix_fallocate would write zeros instead: a second
    write of every byte)."""
    import ctypes
    import errno

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        call = libc.fallocate
    except (OSError, AttributeError):
        return
    call.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64)
    if call(fd, 0, 0, size) != 0:
        err = ctypes.get_errno()
        if err not in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
            raise OSError(err, os.strerror(err))


def tree_size(path: str) -> int:
    """The bytes of the files under `path` (links not followed; what vanishes meanwhile not counted)."""
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total
