"""Blobs of bundles read in place from their part files, each checked against its digest: `PartFiles`, the one
reader of a blob's bytes from the spans of the files holding it (catalog.py), which `imgtool serve` (InPlaceBlobs)
and the bundle source (ends/bundle_source.py: push) both read through.

For serve, every blob is hashed once in the background from the start (`check_all`), and again whenever a part file
holding it changed since (its inode, size, mtime or ctime: a write, a re-copy); a mismatch is refused per
request (BlobDamaged), never handed out. A blob asked for before its turn is hashed then (a small one, or a
range of a big one), or, asked for whole, hashed as it is sent (`Hashing`: the last piece goes out only
when all matched, so a client never receives a whole wrong blob, and the first pull of a 3 GB layer never
waits for its hash). The bytes themselves go out with sendfile from `open`'s file, at the catalog's spans.
"""

import hashlib
import io
import os
import shutil
import threading
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

from ..errors import BlobDamaged, ImgtoolError, UsageError, VerifyError
from ..fsutil import NotRegularFile, fsync_dir, open_regular, require_regular
from ..model import Digest, format_size
from ..progress import Progress
from .catalog import Blob, Catalog
from .format import BundleIndex, part_label
from .archive import Archive
from .reader import HASH_READ, part_problem, part_unreadable, unreadable


HASH_FIRST = 16 * 1024 * 1024  # a blob up to this is hashed before its first answer (milliseconds); bigger: on the way


class Stopped(Exception):
    """check_all was asked to stop."""


def unpacked_name(index: BundleIndex) -> str:
    """The file a compressed bundle's archive is unpacked into: named by the compressed archive's sha256."""
    return f"{index.archive.sha256}.tar"


def require_unpack_dir(into: Path) -> Path:
    """`into` when it is a directory; raises UsageError."""
    if not Path(into).is_dir():
        raise UsageError(f"--unpack-to {into} is not a directory",
                         hint="create it, on a disk with room for the unpacked archive")
    return Path(into)


def unpack_archive(bundle_dir: Path, index: BundleIndex, into: Path, progress: Progress) -> Path:
    """A compressed bundle's archive decompressed once into `into` (unpacked_name) by the archive's one reader
    (archive.py: each part, every header, the padding, the trailer and the stream's end checked on the way), written
    atomically; a file already there at the tar's size is taken as it is (every
    blob is still checked against its digest before it is first served). Raises UsageError (`into` not a
    directory), ImgtoolError (too little space, cannot write), VerifyError (a part missing or damaged, the
    archive not as bundle.json implies it)."""
    into = require_unpack_dir(into)
    target = into / unpacked_name(index)
    try:
        if require_regular(target).st_size == index.archive.tar_size:
            return target
    except FileNotFoundError:
        pass
    except OSError as e:
        raise UsageError(f"cannot use {target}: {e.strerror or e}", hint="remove it") from None
    free = shutil.disk_usage(str(into)).free
    if free < index.archive.tar_size:
        raise ImgtoolError(f"cannot unpack {bundle_dir} into {into}: it needs {format_size(index.archive.tar_size)}, "
                           f"{format_size(free)} free", hint="give --unpack-to a directory on a disk with room")
    partial = into / f".{target.name}.{os.getpid()}.partial"

    def refusal(message: str) -> VerifyError:
        return VerifyError(f"cannot unpack {bundle_dir}: {message}",
                           hint="run `imgtool verify` on the bundle and re-copy the parts it names")

    try:
        with open(partial, "wb") as out, \
                progress.bar(index.archive.tar_size, f"unpacking {Path(bundle_dir).name}") as bar:
            def write(data: bytes) -> None:
                out.write(data)
                bar.update(len(data))

            # the archive's one reader: every header, the padding, the trailer and the end checked on the way (not
            # the blobs' digests: serve checks each blob before it hands it out)
            with Archive(Path(bundle_dir), index, fail=refusal, digests="off", read_size=HASH_READ,
                         tee=write) as archive:
                archive.to_end()
            out.flush()
            os.fsync(out.fileno())
        os.chmod(partial, 0o444)
        os.replace(partial, target)
        fsync_dir(into)
    except OSError as e:
        raise ImgtoolError(f"cannot unpack {bundle_dir} into {into}: {e.strerror or e}",
                           hint="give --unpack-to a writable directory with room for the unpacked archive") from None
    finally:
        if partial.exists():
            partial.unlink()
    return target


class PartFiles:
    """The one reader of bundles' blobs in place: a blob's bytes from the spans of the files holding it (the part
    files, or a compressed bundle's unpacked archive: catalog.py's spans), opened as regular files only. serve's
    InPlaceBlobs and the bundle source (ends/bundle_source.py: push) both read through it; what each says of a
    file that cannot be read is its own (`_problem`, `_unreadable`): here, as `verify` says it of a part."""

    def __init__(self, dirs: Sequence[Path], catalog: Catalog, unpacked: Optional[Dict[int, Path]] = None):
        self.dirs = [Path(d) for d in dirs]
        self.catalog = catalog
        self.unpacked = dict(unpacked or {})  # bundle -> its archive unpacked, for a compressed bundle

    def _index(self, bundle: int) -> BundleIndex:
        return self.catalog.indexes[bundle]

    def _path(self, bundle: int, part: int) -> Path:
        if bundle in self.unpacked:
            return self.unpacked[bundle]
        return self.dirs[bundle] / self._index(bundle).parts[part].name

    def _problem(self, blob: Blob, part: int, what: str) -> ImgtoolError:
        """A file holding the blob is missing, short or not a regular file: named as `verify` names a part."""
        return VerifyError(part_problem(self._index(blob.bundle), part, what).message)

    def _unreadable(self, blob: Blob, part: int, e: OSError) -> ImgtoolError:
        if isinstance(e, FileNotFoundError):
            return self._problem(blob, part, "is missing")
        index = self._index(blob.bundle)
        return VerifyError(part_unreadable(index, part, self._path(blob.bundle, part), e).message)

    def open(self, blob: Blob, part: int) -> io.FileIO:
        try:
            return open_regular(self._path(blob.bundle, part))
        except NotRegularFile as e:
            raise self._problem(blob, part, f"is not a regular file ({e.kind})") from None
        except OSError as e:
            raise self._unreadable(blob, part, e) from None

    def chunks(self, blob: Blob, start: int, end: int, size: int = 4 * 1024 * 1024) -> Iterator[bytes]:
        """Bytes [start, end) of the blob from its files; raises what `_problem` makes (a file missing or short)."""
        for span in self.catalog.spans(blob, start, end):
            with self.open(blob, span.part) as f:
                f.seek(span.offset)
                left = span.length
                while left:
                    data = f.read(min(size, left))
                    if not data:
                        raise self._problem(blob, span.part, "is truncated")
                    left -= len(data)
                    yield data


class InPlaceBlobs(PartFiles):
    """Blobs read in place from the bundles' part files (a compressed bundle's: from its unpacked archive), each
    blob's digest checked before it is first served (again when a file holding it changed since: its inode, size,
    mtime or ctime), a manifest's on every read."""

    def __init__(self, dirs: Sequence[Path], catalog: Catalog, unpacked: Optional[Dict[int, Path]] = None):
        super().__init__(dirs, catalog, unpacked)
        self._lock = threading.Lock()
        self._locks: Dict[Digest, threading.Lock] = {}
        # digest -> (the stat of its parts when it was checked, whether it matched)
        self._checked: Dict[Digest, Tuple[tuple, bool]] = {}

    def _unreadable(self, blob: Blob, part: int, e: OSError) -> BlobDamaged:
        """A part (or the unpacked archive) this user may not read: said as that, with its remedy, not as damage."""
        path = self.unpacked.get(blob.bundle) or self._path(blob.bundle, part)
        words = unreadable(Path(path), e)
        if words is None:
            return self._problem(blob, part, f"cannot be read ({e.strerror})")
        return BlobDamaged(f"{blob.what} (blob {blob.digest.short}) cannot be served: {words[0]}", hint=words[1])

    def _problem(self, blob: Blob, part: int, what: str) -> BlobDamaged:
        if blob.bundle in self.unpacked:
            return BlobDamaged(f"{blob.what} (blob {blob.digest.short}) cannot be served: the unpacked archive "
                               f"{self.unpacked[blob.bundle]} of {self.dirs[blob.bundle]} {what}",
                               hint="remove it and start imgtool serve again (it unpacks the bundle anew)")
        index = self._index(blob.bundle)
        label = part_label(part, len(index.parts))
        return BlobDamaged(f"{blob.what} (blob {blob.digest.short}) cannot be served: {label} "
                       f"({index.parts[part].name}) of {self.dirs[blob.bundle]} {what}",
                       hint="run `imgtool verify` on the bundle and re-copy the parts it names")

    def _stamp(self, blob: Blob) -> tuple:
        """What identifies the contents of the parts holding the blob: a write changes it (mtime, ctime)."""
        out = []
        for part in sorted({s.part for s in self.catalog.spans(blob)}):
            try:
                st = os.stat(self._path(blob.bundle, part))
            except OSError as e:
                raise self._unreadable(blob, part, e) from None
            out.append((part, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
        return tuple(out)

    def check(self, blob: Blob, whole: bool = False, stop: Optional[threading.Event] = None) -> Optional["Hashing"]:
        """Raise BlobDamaged unless the blob's bytes in the parts match its digest (hashed now unless known for
        the parts as they are). `whole`: the caller sends the whole blob; a big one never checked yet is then
        not hashed first: a Hashing is returned, to be fed every byte as it goes out. Raises Stopped when
        `stop` is set while hashing."""
        if whole and blob.size > HASH_FIRST:
            stamp = self._stamp(blob)
            with self._lock:
                known = self._checked.get(blob.digest)
            if known is None:  # never checked (a part changed since its check: checked now, as a range would be)
                return Hashing(self, blob, stamp)
        with self._lock:
            lock = self._locks.setdefault(blob.digest, threading.Lock())
        with lock:
            stamp = self._stamp(blob)
            known = self._checked.get(blob.digest)
            if known is None or known[0] != stamp:
                known = (stamp, self._sha256(blob, stop) == blob.digest.hex)
                self._record(blob, stamp, known[1])
            if not known[1]:
                raise self._damaged(blob)
        return None

    def _record(self, blob: Blob, stamp: tuple, matched: bool) -> None:
        """What a hash found, unless a part changed while it was read (then it is checked again next time)."""
        try:
            same = self._stamp(blob) == stamp
        except BlobDamaged:
            same = False
        if same:
            with self._lock:
                self._checked[blob.digest] = (stamp, matched)

    def check_all(self, stop: threading.Event, damaged: Callable[[BlobDamaged], None]) -> Optional[Tuple[int, int, int]]:
        """Every blob checked (those known already skipped), in the order they lie in the parts, each damaged one
        handed to `damaged`: (blobs, bytes, damaged), or None when `stop` was set first."""
        blobs = sorted(self.catalog.blobs.values(), key=lambda b: (b.bundle, b.start))
        bad: List[BlobDamaged] = []
        try:
            for blob in blobs:
                if stop.is_set():
                    return None
                try:
                    self.check(blob, stop=stop)
                except BlobDamaged as e:
                    bad.append(e)
                    damaged(e)
        except Stopped:
            return None
        return len(blobs), sum(b.size for b in blobs), len(bad)

    def _sha256(self, blob: Blob, stop: Optional[threading.Event] = None) -> str:
        """The blob's sha256 read from its files into one 1 MiB buffer (fresh 4 MiB reads in every worker thread
        left tens of MiB in glibc's per-thread arenas); raises BlobDamaged (a file missing or short), Stopped."""
        sha = hashlib.sha256()
        buf = bytearray(1 << 20)
        view = memoryview(buf)
        for span in self.catalog.spans(blob):
            with self.open(blob, span.part) as f:
                f.seek(span.offset)
                left = span.length
                while left:
                    if stop is not None and stop.is_set():
                        raise Stopped()
                    n = f.readinto(view[:min(left, len(buf))])
                    if not n:
                        raise self._problem(blob, span.part, "is truncated")
                    sha.update(view[:n])
                    left -= n
        return sha.hexdigest()

    def _damaged(self, blob: Blob) -> BlobDamaged:
        if blob.bundle in self.unpacked:
            return BlobDamaged(f"{blob.what} (blob {blob.digest.short}) is damaged in the unpacked archive "
                               f"{self.unpacked[blob.bundle]} of {self.dirs[blob.bundle]}: its sha256 differs from its "
                               "digest; it is not served",
                               hint="remove it and start imgtool serve again (it unpacks the bundle anew)")
        index = self._index(blob.bundle)
        parts = sorted({s.part for s in self.catalog.spans(blob)})
        where = ", ".join(part_label(p, len(index.parts)) for p in parts)
        return BlobDamaged(f"{blob.what} (blob {blob.digest.short}) is damaged in {self.dirs[blob.bundle]} "
                       f"({where}): its sha256 differs from its digest; it is not served",
                       hint="run `imgtool verify` on the bundle and re-copy the parts it names")

    def read(self, blob: Blob) -> bytes:
        """A small blob (a manifest) whole, its digest checked on every read; raises BlobDamaged."""
        data = b"".join(self.chunks(blob, 0, blob.size))
        if Digest.of(data) != blob.digest:
            raise self._damaged(blob)
        return data


class Hashing:
    """A whole blob hashed as it is sent, for a blob not checked yet: `update` with every byte in order, then
    `finish()` -> (matched, what to say when not); what it found is remembered as a check's would be."""

    def __init__(self, parts: InPlaceBlobs, blob: Blob, stamp: tuple):
        self.parts, self.blob, self.stamp = parts, blob, stamp
        self.sha = hashlib.sha256()

    def update(self, data: bytes) -> None:
        self.sha.update(data)

    def finish(self) -> Tuple[bool, str]:
        matched = self.sha.hexdigest() == self.blob.digest.hex
        self.parts._record(self.blob, self.stamp, matched)
        if matched:
            return True, ""
        return False, self.parts._damaged(self.blob).message + " (cut before its last bytes)"
