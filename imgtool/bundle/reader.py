"""Reading a bundle: bundle.json, the parts as one stream (hashed on the way), decompression.

Nothing here extracts anything to disk: the archive is only ever a stream of bytes that is
checked or handed on (archive.py: the one forward reader of the archive).
"""

import bisect
import errno
import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Callable, List, Optional, Sequence, Tuple

from .. import gz
from ..errors import UsageError, VerifyError
from ..fsutil import NotRegularFile, open_regular, require_regular
from ..worker import Worker, sha256_of
from .format import BUNDLE_JSON, LOCK_NAME, MAX_BUNDLE_JSON, BundleIndex, Part, part_label

READ_SIZE = 1024 * 1024
HASH_READ = 4 * 1024 * 1024


@dataclass(frozen=True)
class Problem:
    """One finding: what is wrong and what to do, and which parts (0-based) it concerns."""

    message: str
    parts: Tuple[int, ...] = ()
    kind: str = "problem"

    def __str__(self) -> str:
        return self.message

    def to_json(self) -> dict:
        return {"message": self.message, "parts": [i + 1 for i in self.parts], "kind": self.kind}


def bundle_directory(bundle_dir) -> Path:
    """DIR as a Path when it is a directory; raises UsageError (missing, or not a directory)."""
    bundle_dir = Path(bundle_dir)
    if not bundle_dir.is_dir():
        if bundle_dir.exists():
            raise UsageError(f"{bundle_dir} is not a directory", hint="give the bundle directory (it holds bundle.json)")
        raise UsageError(f"no such bundle directory: {bundle_dir}")
    return bundle_dir


def read_index(bundle_dir: Path) -> Tuple[BundleIndex, bytes]:
    """Read and validate DIR/bundle.json; raises UsageError (no such dir) or VerifyError."""
    bundle_dir = bundle_directory(bundle_dir)
    path = bundle_dir / BUNDLE_JSON
    try:
        with open_regular(path) as f:
            data = f.read(MAX_BUNDLE_JSON + 1)
    except NotRegularFile as e:
        raise VerifyError(f"bundle.json is not a regular file ({e.kind})",
                          hint="copy bundle.json from the source medium") from None
    except FileNotFoundError:
        writer = _writer(bundle_dir)
        if writer is not None:
            raise VerifyError(f"incomplete bundle: {bundle_dir} has no bundle.json (an imgtool {writer} was writing "
                              "it and has not finished)",
                              hint=f"let that imgtool {writer} finish, or run it again if it was stopped") from None
        raise VerifyError(f"incomplete bundle: {bundle_dir} has no bundle.json (what made it did not finish, "
                          "or bundle.json was not copied)",
                          hint="copy bundle.json from the source medium, or make the bundle again as it was made "
                               "(imgtool fetch, export or copy)") from None
    except OSError as e:
        raise VerifyError(f"cannot read {path}: {e.strerror or e}") from e
    return BundleIndex.from_bytes(data), data


WRITERS = ("fetch", "export", "copy")  # the verbs that write a bundle directory under its lock (dirlock.py)


def _writer(bundle_dir: Path) -> Optional[str]:
    """The verb that was writing DIR as its lock file names it (`fetch 1234`: a run killed leaves the file, and
    bundle.json is the last thing a writer puts there), or None: no lock file, or one that names no writer."""
    try:
        with open_regular(bundle_dir / LOCK_NAME) as f:
            said = f.read(64)
    except OSError:  # missing, not a regular file, unreadable: it says nothing
        return None
    verb = said.decode("ascii", "replace").split("\n")[0].split(" ")[0]
    return verb if verb in WRITERS else None


def unreadable(path: Path, e: OSError) -> Optional[Tuple[str, str]]:
    """For a file this user may not read (EACCES, EPERM): what to say instead of `cannot be read`, and what to do
    (it is not damaged: re-copying would not help); None for any other error."""
    if e.errno not in (errno.EACCES, errno.EPERM):
        return None
    try:
        st = os.stat(str(path))
        try:
            import pwd

            owner = pwd.getpwuid(st.st_uid).pw_name
        except (ImportError, KeyError):
            owner = f"uid {st.st_uid}"
        whose = f" (owner {owner}, mode {stat.S_IMODE(st.st_mode):04o})"
    except OSError:  # the directory itself is closed to this user
        whose = ""
    return (f"cannot be read by this user: permission denied{whose}: {path}",
            f"it is not damaged: let this user read it (chmod a+r {path}, or chown it), or run as its owner")


def part_unreadable(index: BundleIndex, i: int, path: Path, e: OSError) -> Problem:
    """A part that cannot be opened: a permission problem said as one (with the remedy), else `cannot be read`."""
    words = unreadable(path, e)
    if words is None:
        return part_problem(index, i, f"cannot be read ({e.strerror})")
    label = part_label(i, len(index.parts))
    return Problem(f"{label} ({index.parts[i].name}) {words[0]}; {words[1]}", (i,), kind="permission")


DAMAGED = "is damaged: its sha256 differs from bundle.json"
HELD_NAMES = 3  # a damaged part names at most this many of the members it holds, then "and N more"


def part_problem(index: BundleIndex, i: int, what: str) -> Problem:
    """The one line saying what is wrong with part `i` and what to do; a damaged part of an uncompressed archive
    also says what it holds (a layer, a model's file), so the user knows what the damage would have hit."""
    label = part_label(i, len(index.parts))
    name = index.parts[i].name
    verb = "copy" if what == "is missing" else "re-copy"
    if what == DAMAGED:
        held = part_holds(index, i)
        if held:
            more = f" and {len(held) - HELD_NAMES} more" if len(held) > HELD_NAMES else ""
            what += f" (it holds {', '.join(held[:HELD_NAMES])}{more})"
    return Problem(f"{label} ({name}) {what}; {verb} {label} from the source medium", (i,))


def part_holds(index: BundleIndex, i: int) -> List[str]:
    """What the data of part `i` of an uncompressed archive belongs to: its layers and model files, in archive order
    (`layer 3 of REF`, `PATH of hf:ORG/NAME@REV`); none for a compressed archive (a part is not a member's bytes)."""
    from . import layout

    if index.archive.compression != "none":
        return []
    start = sum(p.size for p in index.parts[:i])
    end = start + index.parts[i].size
    slots, _ = layout.arrange(layout.bundle_members(index))
    return [s.member.what for s in slots if s.member.kind in ("layer", "model")
            and s.data_offset < end and start < s.end]


def stat_parts(bundle_dir: Path, index: BundleIndex) -> List[Problem]:
    """Cheap checks: every part present with the right size."""
    problems = []
    for i, part in enumerate(index.parts):
        try:
            size = require_regular(bundle_dir / part.name).st_size
        except FileNotFoundError:
            problems.append(part_problem(index, i, "is missing"))
            continue
        except NotRegularFile as e:
            problems.append(part_problem(index, i, f"is not a regular file ({e.kind})"))
            continue
        except OSError as e:
            problems.append(part_unreadable(index, i, bundle_dir / part.name, e))
            continue
        if size < part.size:
            problems.append(part_problem(index, i, f"is truncated: {size} of {part.size} bytes"))
        elif size > part.size:
            problems.append(part_problem(index, i, f"is too long: {size} bytes, expected {part.size}"))
    return problems


def hash_part(path: Path, on_bytes: Callable[[int], None] = lambda n: None) -> str:
    """sha256 hex of a file, in big reads (hashlib releases the GIL: callers use threads)."""
    sha = hashlib.sha256()
    buf = bytearray(HASH_READ)
    view = memoryview(buf)
    with open_regular(path) as f:
        while True:
            n = f.readinto(buf)
            if not n:
                break
            sha.update(view[:n])
            on_bytes(n)
    return sha.hexdigest()


class PartsStream:
    """The parts of a bundle read in order as one file-like stream, each part hashed on the way.

    A missing, short or long part raises VerifyError. A part whose sha256 differs from
    bundle.json either raises before the read that ends the part returns (strict: used while
    streaming into Docker: the upload is cut there, so Docker never gets a complete archive with a bad part), or is
    recorded in `bad` (to report every bad part in one pass).

    `hash_parts=False`: the parts' sizes and files are checked, not their sha256: for a reader that checks every
    byte of an uncompressed archive itself (load's stream: each header against the layout, each member against its
    digest, the padding and the end), where hashing each part again was a second sha256 over the archive on load's
    critical path (issue 38).
    """

    def __init__(self, bundle_dir: Path, index: BundleIndex, strict: bool,
                 on_bytes: Callable[[int], None] = lambda n: None, hash_parts: bool = True):
        self.dir, self.index, self.strict, self.on_bytes = Path(bundle_dir), index, strict, on_bytes
        self.hash_parts = hash_parts
        self.parts: Sequence[Part] = index.parts
        self.i = -1
        self.f: Optional[BinaryIO] = None
        self.left = 0
        self.hasher: Optional[Worker[str]] = None
        self.bad: List[int] = []
        self.position = 0
        self._next()

    def _next(self) -> None:
        if self.f is not None:
            self.f.close()
            self.f = None
        self.i += 1
        if self.i >= len(self.parts):
            return
        part = self.parts[self.i]
        try:
            self.f = open_regular(self.dir / part.name)
        except FileNotFoundError:
            raise VerifyError(part_problem(self.index, self.i, "is missing").message) from None
        except NotRegularFile as e:
            raise VerifyError(part_problem(self.index, self.i, f"is not a regular file ({e.kind})").message) from None
        except OSError as e:
            raise VerifyError(part_unreadable(self.index, self.i, self.dir / part.name, e).message) from None
        size = os.fstat(self.f.fileno()).st_size
        if size != part.size:
            self.f.close()
            self.f = None
            what = f"is truncated: {size} of {part.size} bytes" if size < part.size else \
                f"is too long: {size} bytes, expected {part.size}"
            raise VerifyError(part_problem(self.index, self.i, what).message)
        self.left = part.size
        self.hasher = Worker(sha256_of, "part-sha256") if self.hash_parts else None

    def _end_part(self) -> None:
        assert self.f is not None  # a part is open: read() checked
        if self.f.read(1):
            raise VerifyError(part_problem(self.index, self.i, "grew while being read").message)
        hasher, self.hasher = self.hasher, None
        if hasher is not None and hasher.result() != self.parts[self.i].sha256:
            if self.strict:
                raise VerifyError(part_problem(self.index, self.i, DAMAGED
                                               ).message)
            self.bad.append(self.i)
        self._next()

    def read(self, n: int = READ_SIZE) -> bytes:
        while self.f is not None and self.left == 0:
            self._end_part()
        if self.f is None:
            return b""
        if n is None or n < 0:
            n = READ_SIZE
        data = self.f.read(min(n, self.left, 8 * READ_SIZE))
        if not data:
            raise VerifyError(part_problem(self.index, self.i, "shrank while being read").message)
        self.left -= len(data)
        if self.hasher is not None:
            self.hasher.put(data)
        self.position += len(data)
        self.on_bytes(len(data))
        if self.left == 0:
            self._end_part()  # before returning the last bytes of the part
        return data

    def skip(self, n: int) -> int:
        """Move `n` bytes on without reading them (their reader copies and checks them itself: load's placement of an
        uncompressed bundle's model files); the parts' ends and sizes are checked as by read. Only without
        `hash_parts`. Returns the bytes passed over: fewer only at the last part's end."""
        assert self.hasher is None and not self.hash_parts, "a part hashed on the way cannot be skipped"
        done = 0
        while done < n:
            while self.f is not None and self.left == 0:
                self._end_part()
            if self.f is None:
                break
            k = min(n - done, self.left)
            self.f.seek(k, os.SEEK_CUR)
            self.left -= k
            self.position += k
            self.on_bytes(k)
            done += k
            if self.left == 0:
                self._end_part()
        return done

    def readinto(self, buf) -> int:
        data = self.read(len(buf))
        buf[:len(data)] = data
        return len(data)

    def readable(self) -> bool:
        return True

    def drain(self) -> None:
        """Read (and hash) whatever is left, so every part gets checked."""
        while self.read(HASH_READ):
            pass

    def __enter__(self) -> "PartsStream":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close()

    def close(self) -> None:
        """Close the current part and end its hash worker (on every exit path: use it in `with`)."""
        if self.hasher is not None:
            self.hasher.abandon()
            self.hasher = None
        if self.f is not None:
            self.f.close()
            self.f = None


class PartMap:
    """Which parts hold a byte range of the archive (only meaningful when it is uncompressed)."""

    def __init__(self, index: BundleIndex):
        self.index = index
        self.starts = []
        pos = 0
        for p in index.parts:
            self.starts.append(pos)
            pos += p.size
        self.exact = index.archive.compression == "none"

    def parts(self, start: int, end: int) -> Tuple[int, ...]:
        if not self.exact:
            return ()
        first = max(bisect.bisect_right(self.starts, start) - 1, 0)
        last = max(bisect.bisect_right(self.starts, max(end - 1, start)) - 1, 0)
        return tuple(range(first, last + 1))

    def regions(self, start: int, end: int) -> Tuple[Tuple[str, int, int], ...]:
        """(the part's file name, offset in it, length) of each piece of the archive's bytes [start, end)."""
        assert self.exact, "a compressed archive's bytes are not where the parts hold them"
        out = []
        for i in self.parts(start, end) if end > start else ():
            lo, hi = max(start, self.starts[i]), min(end, self.starts[i] + self.index.parts[i].size)
            if hi > lo:
                out.append((self.index.parts[i].name, lo - self.starts[i], hi - lo))
        return tuple(out)

    def describe(self, parts: Tuple[int, ...]) -> str:
        if not self.exact:
            return "in the compressed archive"
        labels = [part_label(i, len(self.index.parts)) for i in parts]
        if len(labels) == 1:
            return "in " + labels[0]
        return f"in parts {labels[0].split()[-1]}-{labels[-1].split()[-1]}"


class _ZstdReader:
    """zstandard's stream reader, imported only when a bundle is zstd-compressed."""

    def __init__(self, raw):
        try:
            import zstandard
        except ImportError:
            raise VerifyError("this bundle is zstd-compressed and the zstandard Python package is missing",
                              hint="install it (pip install zstandard, or the system's python3-zstandard package), "
                                   "or run `sh load.sh` on a host with the zstd command") from None
        self.r = zstandard.ZstdDecompressor().stream_reader(raw, read_size=READ_SIZE, read_across_frames=True)
        self.error = zstandard.ZstdError

    def read(self, n: int) -> bytes:
        try:
            return self.r.read(n)
        except self.error as e:
            raise DecodeError(f"not valid zstd data ({e})") from e


class _GzipReader:
    """gz.py's reader: ISA-L where the installed package brings it, zlib in imgtool.pyz."""

    def __init__(self, raw):
        self.r = gz.Reader(raw, read_size=READ_SIZE)

    def read(self, n: int) -> bytes:
        try:
            return self.r.read(n)
        except gz.GzipError as e:
            raise DecodeError(f"not valid gzip data: {e}") from e


class _RawReader:
    def __init__(self, raw):
        self.raw = raw

    def read(self, n: int) -> bytes:
        return self.raw.read(n)


class DecodeError(VerifyError):
    """A compressed stream could not be decoded. Each reader of a stream says where (a part, a layer); one that
    escapes is still a verification failure (exit 3), never an internal error."""


def decompressed(raw, compression: str):
    """A reader with read(n) giving the decompressed bytes of `raw` (bounded memory per call)."""
    if compression == "gzip":
        return _GzipReader(raw)
    if compression == "zstd":
        return _ZstdReader(raw)
    return _RawReader(raw)
