"""The local content-addressed blob store (the cache under `$IMGTOOL_CACHE`).

A blob becomes visible under `blobs/sha256/<hex>` only after its size and digest were
checked, via temp file + rename. No blob's data is fsynced, downloaded or made here (that would write
every image twice before the bundle holds it once); whatever reads a blob for a bundle checks
its digest on the way (bundle/writer.py), so one torn by a power cut is caught, not bundled,
unless the same process made it (then it is still in the page cache, and a blob made again
replaces the copy in the cache).
Downloads in progress live in `partial/` with a small JSON record of the byte ranges
already written, so a later run (even after SIGKILL) resumes where this one stopped.
A per-blob `flock` keeps two imgtool processes from downloading the same blob at once.
A blob produced here (export's gzip, a rewritten layer) is written to `partial/LABEL.PID.*.tmp`
under an `flock` of its own: one that a killed process left behind (its pid gone, nobody holding
its lock) is removed by the next fetch or export (`remove_stale`), since nothing can resume it.
"""

import errno
import fcntl
import hashlib
import json
import os
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, Callable, Collection, Iterator, List, Optional, Sequence, Tuple

from .errors import ImgtoolError, StoreError, VerifyError
from .fsutil import fsync_dir, open_regular, process_alive, remove_quietly, write_atomic
from .model import Digest, format_size, json_object
from .worker import SIGNAL_SLICE

COPY_CHUNK = 1024 * 1024
COPY_BUFFER = 1024 * 1024  # big reads for copies: 16 KiB ones cost a third more time on real disks


def _disk_error(e: OSError, where: Path) -> StoreError:
    if e.errno == errno.ENOSPC:
        return StoreError(f"no space left on the device holding the cache ({where})",
                          hint="free some space or point IMGTOOL_CACHE at a bigger disk")
    return StoreError(f"cannot write to the cache {where}: {e.strerror or e}",
                      hint="check permissions, or point IMGTOOL_CACHE somewhere writable")


def merge_ranges(ranges: List[Tuple[int, int]]) -> List[Tuple[int, int]]:
    """Union of half-open byte ranges, sorted and coalesced."""
    out: List[List[int]] = []
    for start, end in sorted(ranges):
        if start >= end:
            continue
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return [(a, b) for a, b in out]


MAX_RECORD = 16 * 1024 * 1024  # a partial's record of done ranges (a few dozen bytes per range)


def _partial_paths(root: Path, digest: Digest) -> Tuple[Path, Path]:
    """(the sparse .part file, the .json record of its done ranges) of a blob being downloaded."""
    part = root / "partial" / digest.algorithm / f"{digest.hex}.part"
    return part, part.with_suffix(".json")


def read_record(path: Path, digest: Digest, size: int) -> Optional[List[Tuple[int, int]]]:
    """The done ranges a partial's record holds, merged; None when there is none or it does not fit this
    blob (another size or digest, a range outside it, torn or not JSON: the download starts over)."""
    try:
        obj = json_object(path.read_bytes(), MAX_RECORD, ValueError)
        if obj.get("size") != size or obj.get("digest") != str(digest):
            return None
        ranges = [(int(a), int(b)) for a, b in obj.get("done", [])]
    except (OSError, ValueError, TypeError):
        return None
    if any(a < 0 or b > size for a, b in ranges):
        return None
    return merge_ranges(ranges)


def recorded_bytes(path: Path, digest: Digest, size: int) -> int:
    """How many bytes of the blob the record at `path` says are written (0 with no record that fits)."""
    state = read_record(path, digest, size)
    return sum(b - a for a, b in state) if state else 0


class Partial:
    """A half-downloaded blob: a sparse file of the final size plus the ranges already written.

    Where the bytes live is the subclass's (`RegionPartial`: in a bundle's unfinished archive, bundle/regions.py);
    the record of done ranges, the hashing and the check are the same for both."""

    # The record of done ranges is rewritten after every write (in place, see _save), so a SIGKILL
    # loses only the bytes still in flight: a time-throttled record lost up to a second's worth.

    def __init__(self, store: "Store", digest: Digest, size: int):
        self.store, self.digest, self.size = store, digest, size
        self.path, self.state_path = _partial_paths(store.root, digest)
        self._setup()

    def _setup(self) -> None:
        self._lock = threading.Lock()
        self._state_fd = -1  # the record, open for in-place rewrites after its first save
        self._state_len = 0
        self.done: List[Tuple[int, int]] = []
        self.closed = False
        self._open()

    def _error(self, e: OSError) -> StoreError:
        return _disk_error(e, self.store.root)

    def _open(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            state = self._recorded()
            if state is None or not self.path.exists() or self.path.stat().st_size != self.size:
                self.done = []
                with open(self.path, "wb") as f:
                    f.truncate(self.size)
                self._save()
            else:
                self.done = state
            self._fd = os.open(str(self.path), os.O_RDWR)
        except OSError as e:
            raise self._error(e) from e

    def _recorded(self) -> Optional[List[Tuple[int, int]]]:
        return read_record(self.state_path, self.digest, self.size)

    # where the bytes live: one sparse file here

    def _pwrite(self, data, offset: int) -> int:
        return os.pwrite(self._fd, data, offset)

    def _pread(self, n: int, offset: int) -> bytes:
        return os.pread(self._fd, n, offset)

    def _publish(self) -> Optional[Path]:
        """The checked blob into blobs/ (no fsync of the data: see the module docstring)."""
        final = self.store.blob_path(self.digest)
        self.closed = True
        os.close(self._fd)
        self._fd = -1
        final.parent.mkdir(parents=True, exist_ok=True)
        os.chmod(self.path, 0o444)
        os.replace(self.path, final)
        fsync_dir(final.parent)
        self._remove_state()
        return final

    def _announce(self) -> None:
        self.store.announce()

    def _forget_data(self) -> None:
        remove_quietly(self.path)

    def _save(self) -> None:
        """Persist the done ranges: first by temp file + rename, then by one pwrite at offset 0.

        The rewrite is padded with spaces to the old length (JSON ignores them), so a kill never
        leaves old and new mixed; a short write (disk full) leaves invalid JSON, which a later run
        reads as "no record"; after a power loss the digest check at commit catches a record that
        claims bytes the disk lost. Only the holder of the blob lock writes it.
        """
        data = json.dumps({"digest": str(self.digest), "size": self.size, "done": self.done}).encode()
        if self._state_fd < 0:
            tmp = self.state_path.with_suffix(f".json.{os.getpid()}.{threading.get_ident()}")
            tmp.write_bytes(data)
            os.replace(tmp, self.state_path)
            self._state_fd = os.open(str(self.state_path), os.O_RDWR)
        else:
            data = data.ljust(self._state_len)
            os.pwrite(self._state_fd, data, 0)
        self._state_len = len(data)

    def done_ranges(self) -> List[Tuple[int, int]]:
        """The ranges written so far (a snapshot: other threads may be writing)."""
        with self._lock:
            return list(self.done)

    @property
    def done_bytes(self) -> int:
        return sum(b - a for a, b in self.done)

    def missing(self) -> List[Tuple[int, int]]:
        """The byte ranges still to download, in order."""
        out, pos = [], 0
        for a, b in self.done:
            if a > pos:
                out.append((pos, a))
            pos = max(pos, b)
        if pos < self.size:
            out.append((pos, self.size))
        return out

    def write(self, offset: int, data) -> None:
        """Write downloaded bytes at `offset` and record them as done."""
        try:
            view = memoryview(data)
            while view:
                n = self._pwrite(view, offset)
                offset += n
                view = view[n:]
            end = offset
            start = end - len(data)
            with self._lock:
                self.done = merge_ranges(self.done + [(start, end)])
                self._save()
        except OSError as e:
            raise self._error(e) from e

    def read_range(self, start: int, end: int) -> Iterator[bytes]:
        pos = start
        while pos < end:
            chunk = self._pread(min(COPY_CHUNK, end - pos), pos)
            if not chunk:
                break
            pos += len(chunk)
            yield chunk

    def flush_state(self) -> None:
        """Persist the done ranges now (no-op once committed or discarded)."""
        if self.closed:
            return
        with self._lock:
            try:
                self._save()
            except OSError:
                pass

    def commit(self, hexdigest: Optional[str] = None) -> Optional[Path]:
        """Check size and digest (hashing the bytes unless `hexdigest` is given), then publish.

        Raises VerifyError (and discards the partial) when the digest does not match. Returns the blob's file in
        the store (None for a blob placed elsewhere).
        """
        if self.missing():
            raise ImgtoolError(f"internal: commit of incomplete blob {self.digest.short}")
        if hexdigest is None:
            h = self.digest.hasher()
            for chunk in self.read_range(0, self.size):
                h.update(chunk)
            hexdigest = h.hexdigest()
        if hexdigest != self.digest.hex:
            self.discard()
            raise VerifyError(f"blob {self.digest} arrived with digest {self.digest.algorithm}:{hexdigest}")
        try:
            final = self._publish()
        except OSError as e:
            raise self._error(e) from e
        self._announce()
        return final

    def reset(self) -> None:
        """Record nothing as done (what was written is to be written again)."""
        with self._lock:
            self.done = []
            try:
                self._save()
            except OSError as e:
                raise self._error(e) from e

    def discard(self) -> None:
        """Forget this partial (after a corrupt download)."""
        self.close()
        self._forget_data()
        remove_quietly(self.state_path)
        self.done = []

    def _remove_state(self) -> None:
        self._close_state()
        remove_quietly(self.state_path)

    def _close_state(self) -> None:
        if getattr(self, "_state_fd", -1) >= 0:
            os.close(self._state_fd)
            self._state_fd = -1

    def close(self) -> None:
        self.closed = True
        self._close_state()
        if getattr(self, "_fd", -1) >= 0:
            os.close(self._fd)
            self._fd = -1


class Store:
    """Content-addressed blobs under `root` (`blobs/`, `partial/`, `locks/`)."""

    def __init__(self, root: Path, create: bool = True):
        """`create` False: no directory is made until `create()` (commands/ builds the store before the verb
        has checked its input, which must fail with nothing written)."""
        self.root = Path(root)
        self._arrived = threading.Condition()  # notified whenever a blob is published (see wait_for)
        if create:
            self.create()

    def create(self) -> None:
        """Make the store's directories (idempotent); raises StoreError when the disk cannot hold them."""
        try:
            for sub in ("blobs/sha256", "partial/sha256", "locks", "diffids", "located/sha256"):
                (self.root / sub).mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise _disk_error(e, self.root) from e

    def blob_path(self, digest: Digest) -> Path:
        return self.root / "blobs" / digest.algorithm / digest.hex

    def announce(self) -> None:
        """Wake every `wait_for`: a blob was published, or a producer stopped (it has its own flag)."""
        with self._arrived:
            self._arrived.notify_all()

    def wait_for(self, digest: Digest, give_up: Callable[[], bool]) -> bool:
        """Block until the blob is in the store or `give_up()` is true, rechecked at every `announce()`
        (this process publishing a blob announces it); returns whether the blob is here.

        The wait is cut into slices (`worker.SIGNAL_SLICE`): one unbroken wait held Ctrl-C until the blob came."""
        with self._arrived:
            while not (self.has(digest) or give_up()):
                self._arrived.wait(SIGNAL_SLICE)
        return self.has(digest)

    def has(self, digest: Digest, size: Optional[int] = None) -> bool:
        try:
            st = self.blob_path(digest).stat()
        except OSError:
            return False
        return size is None or st.st_size == size

    def lock_blob(self, digest: Digest, waiting: Optional[Callable[[str], None]] = None) -> Callable[[], None]:
        """Take the per-blob lock; returns the release function. When another process holds it, say so
        once through `waiting` (naming its pid, which each holder writes into the lock file), then block
        until it lets go."""
        path = self.root / "locks" / f"{digest.hex}.lock"
        try:
            fd = os.open(str(path), os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise _disk_error(e, self.root) from e
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if waiting is not None:
                    waiting(f"waiting for another imgtool fetching {digest.short}{_holder(fd)}")
                fcntl.flock(fd, fcntl.LOCK_EX)
            _stamp(fd)
        except BaseException:
            os.close(fd)
            raise

        def unlock() -> None:
            try:
                fcntl.flock(fd, fcntl.LOCK_UN)
            finally:
                os.close(fd)
        return unlock

    def partial(self, digest: Digest, size: int) -> Partial:
        return Partial(self, digest, size)

    def partial_bytes(self, digest: Digest, size: int) -> int:
        """How many bytes of this blob a previous run left in `partial/` (0 if none)."""
        return recorded_bytes(_partial_paths(self.root, digest)[1], digest, size)

    # A blob a fetch wrote straight into a bundle's archive (bundle/regions.py) is not copied into blobs/: the
    # store keeps where it is (`located/`), and a later fetch copies it from there, digest-checked, before
    # downloading it (the bundle may have been moved, edited or removed since: then it downloads).

    def locate(self, digest: Digest, size: int, regions: Sequence[Tuple[Path, int, int]]) -> None:
        """Remember that the blob's bytes are the concatenation of `regions` (file, offset, length): best effort."""
        doc = {"digest": str(digest), "size": size,
               "regions": [[str(Path(path).resolve()), offset, length] for path, offset, length in regions]}
        try:
            # no fsync: a locator lost to a power cut costs a download, and an fsync during a fetch waits for the
            # journal, which on ext4 (data=ordered) writes the bundle's dirty pages first
            write_atomic(self.root / "located" / digest.algorithm / digest.hex, json.dumps(doc).encode(), 0o644,
                         sync=False)
        except OSError:
            pass

    def local_chunks(self, digest: Digest, size: int) -> Optional[Iterator[bytes]]:
        """The blob's bytes from this machine, unchecked (the caller hashes them): the cache's file, or the regions a
        locator names; None when neither is there. The iterator raises OSError when a file changed under it."""
        if self.has(digest, size):
            return _file_chunks([(self.blob_path(digest), 0, size)])
        try:
            doc = json_object((self.root / "located" / digest.algorithm / digest.hex).read_bytes(), MAX_RECORD,
                              ValueError)
            regions = [(Path(p), int(o), int(n)) for p, o, n in doc["regions"]]
        except (OSError, ValueError, TypeError, KeyError):
            return None
        if doc.get("digest") != str(digest) or doc.get("size") != size or sum(n for _, _, n in regions) != size \
                or any(o < 0 or n < 0 for _, o, n in regions):
            return None
        return _file_chunks(regions)

    @contextmanager
    def new_blob(self, label: str) -> Iterator["BlobWriter"]:
        """A blob produced here (export, a rewritten layer): write() it, then publish() it under the sha256
        of what was written; a block left by an exception (or without publish) removes the temp file."""
        writer = BlobWriter(self, self.temp_file(label))
        try:
            yield writer
        finally:
            writer.discard()

    def remove_stale(self) -> Optional[str]:
        """Remove the temp files of blobs being produced (`new_blob`) that killed processes left; says what went.

        A file is stale when the pid in its name is not ours and not alive, and nobody holds its lock:
        the lock covers a pid reused by another process, or a writer in another pid namespace."""
        count = size = 0
        for path in (self.root / "partial").glob("*.tmp"):
            fields = path.name.split(".")
            if len(fields) < 3 or not fields[1].isdigit():
                continue
            pid = int(fields[1])
            if pid == os.getpid() or process_alive(pid):
                continue
            try:
                fd = os.open(str(path), os.O_RDONLY)
            except OSError:
                continue  # gone already (another imgtool removed it)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                n = os.fstat(fd).st_size
                path.unlink()
            except OSError:
                continue  # held by a writer, or not ours to remove
            finally:
                os.close(fd)
            count, size = count + 1, size + n
        if not count:
            return None
        return (f"removed {count} temp file{'s' if count != 1 else ''} ({format_size(size)}) that killed imgtool "
                f"processes left in {self.root / 'partial'}")

    def temp_file(self, label: str) -> Path:
        """A fresh path under partial/ for a blob being produced locally (see `ingest`)."""
        return self.root / "partial" / f"{label}.{os.getpid()}.{threading.get_ident()}.{time.monotonic_ns()}.tmp"

    def ingest(self, path: Path, digest: Digest) -> Path:
        """Publish a fully written local file whose digest the caller computed as it wrote it.

        It replaces a blob already there: the cache's data is not fsynced, so an old copy may have been torn by a
        power cut, and the caller trusts what it made without reading it again (FileBlobs' `verified`)."""
        final = self.blob_path(digest)
        try:
            os.chmod(path, 0o444)
            os.replace(path, final)
            fsync_dir(final.parent)
        except OSError as e:
            raise _disk_error(e, self.root) from e
        self.announce()
        return final

    def put_bytes(self, data: bytes, digest: Optional[Digest] = None) -> Digest:
        """Store a small blob held in memory (manifest, config) after checking its digest."""
        actual = Digest.of(data)
        if digest is not None and actual != digest:
            raise VerifyError(f"blob {digest} has digest {actual}")
        final = self.blob_path(actual)
        if final.exists():
            return actual
        try:
            write_atomic(final, data, 0o444)
        except OSError as e:
            raise _disk_error(e, self.root) from e
        self.announce()
        return actual

    def read_bytes(self, digest: Digest) -> bytes:
        return self.blob_path(digest).read_bytes()

    def diff_id(self, digest: Digest) -> Optional[str]:
        """The diff_id (sha256 of the unpacked tar) found for this layer blob by an earlier check, or None.

        A function of the blob's bytes, which its digest pins: a later fetch need not unpack it again."""
        found = self.unpacked(digest)
        return found[0] if found else None

    def unpacked(self, digest: Digest) -> Optional[Tuple[str, Optional[int]]]:
        """(diff_id, unpacked size or None when an older imgtool recorded only the diff_id) of an earlier check."""
        try:
            lines = (self.root / "diffids" / digest.hex).read_text(encoding="ascii").split()
        except (OSError, UnicodeDecodeError):
            return None
        try:
            diff_id = str(Digest.parse(lines[0])) if lines else ""
        except ImgtoolError:
            return None
        size = int(lines[1]) if len(lines) > 1 and lines[1].isdigit() else None
        return (diff_id, size) if diff_id else None

    def remember_diff_id(self, digest: Digest, diff_id: str, size: Optional[int] = None) -> None:
        """Record what a check found, the unpacked size too (best effort: a full disk only costs a later check)."""
        text = diff_id + ("" if size is None else f"\n{size}") + "\n"
        try:
            write_atomic(self.root / "diffids" / digest.hex, text.encode("ascii"), 0o444)
        except OSError:
            pass

    # A hub's small git file has a git blob id and no sha256 (hubs.HubResolution.complete hashes it as it arrives):
    # `gitblobs/<oid>` says which blob it became, so a later run finds it without downloading it again.

    def blob_for_git_oid(self, oid: str, size: int) -> Optional[Digest]:
        """The blob recorded for the git blob id `oid`, if the store holds it at `size` bytes and its bytes are that
        git blob (checked here: the record is a hint, the bytes decide); else None."""
        if not (len(oid) == 40 and all(c in "0123456789abcdef" for c in oid)):
            return None
        try:
            digest = Digest.parse((self.root / "gitblobs" / oid).read_text(encoding="ascii").strip())
        except (OSError, UnicodeDecodeError, ImgtoolError):
            return None
        if not self.has(digest, size):
            return None
        git = hashlib.sha1(b"blob %d\0" % size)
        try:
            for chunk in _file_chunks([(self.blob_path(digest), 0, size)]):
                git.update(chunk)
        except OSError:
            return None
        return digest if git.hexdigest() == oid else None

    def remember_git_oid(self, oid: str, digest: Digest) -> None:
        """Record the blob a git blob id's bytes are (best effort: a full disk only costs a later download)."""
        try:
            (self.root / "gitblobs").mkdir(exist_ok=True)
            write_atomic(self.root / "gitblobs" / oid, f"{digest}\n".encode("ascii"), 0o444)
        except OSError:
            pass


def _file_chunks(regions: Sequence[Tuple[Path, int, int]]) -> Iterator[bytes]:
    """The bytes of each (file, offset, length) in turn, in COPY_BUFFER reads; OSError when one is short."""
    for path, offset, length in regions:
        with open_regular(path) as f:  # a part swapped for a FIFO or a device is an error, never a hang
            f.seek(offset)
            while length:
                chunk = f.read(min(COPY_BUFFER, length))
                if not chunk:
                    raise OSError(errno.EIO, f"{path} ends before the blob it should hold")
                length -= len(chunk)
                yield chunk


def _holder(fd: int) -> str:
    """" (pid N)": who holds a blob lock, as it wrote itself into the file ("" when it did not yet)."""
    try:
        text = os.pread(fd, 32, 0).decode("ascii").strip()
    except (OSError, UnicodeDecodeError):
        return ""
    return f" (pid {text})" if text.isdigit() else ""


def _stamp(fd: int) -> None:
    """Write our pid into a blob lock we took, for whoever waits for it (best effort)."""
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except OSError:
        pass


class BlobWriter:
    """Bytes written to a temp file under partial/, hashed on the way; publish() ingests them."""

    def __init__(self, store: Store, path: Path):
        self.store, self.path = store, path
        self.sha = hashlib.sha256()
        self.size = 0
        self.digest: Optional[Digest] = None
        try:
            self._f: Optional[BinaryIO] = open(path, "wb")
        except OSError as e:
            raise _disk_error(e, store.root) from e
        # held until the file is closed: Store.remove_stale never takes a file someone is writing
        fcntl.flock(self._f.fileno(), fcntl.LOCK_EX)

    def write(self, data: bytes) -> None:
        try:
            self._f.write(data)  # type: ignore[union-attr]
        except OSError as e:
            raise _disk_error(e, self.store.root) from e
        self.sha.update(data)
        self.size += len(data)

    def publish(self) -> Digest:
        """Put the file into the store under its sha256 (no fsync: see the module docstring); returns that digest.

        The fsync was 1.2 s of a 1.6 GB export on its reading thread (docs/benchmarks.md, "export reads the save
        once"): the bundle that is written from the blob is fsynced, and the blob is read for it from the page
        cache."""
        try:
            self._f.close()  # type: ignore[union-attr]
        except OSError as e:
            raise _disk_error(e, self.store.root) from e
        self._f = None
        self.digest = Digest("sha256", self.sha.hexdigest())
        self.store.ingest(self.path, self.digest)
        return self.digest

    def discard(self) -> None:
        """Close and remove the temp file unless it was published (idempotent)."""
        if self._f is not None:
            self._f.close()
            self._f = None
        if self.digest is None:
            remove_quietly(self.path)


class FileBlobs:
    """Blobs that are whole files (the cache's, or a test's): a pipeline source's `chunks` and `path`.

    `path_of` may block until the blob is there (fetch reads while it downloads). The cache does not fsync its
    blobs (the bundle is what must survive a power cut), so a blob is checked against its digest as it is read,
    unless this very process downloaded and checked it (`verified`, read as the copy goes on: still in the page
    cache, no power cut in between)."""

    def __init__(self, path_of: Callable[[Digest], Path], verified: Collection[Digest] = ()):
        self.path_of, self.verified = path_of, verified

    def path(self, digest: Digest) -> Optional[Path]:
        return self.path_of(digest)

    def chunks(self, digest: Digest, size: int, what: str) -> Iterator[bytes]:
        """The blob's bytes in COPY_BUFFER reads; raises ImgtoolError (unreadable, wrong size, wrong digest) before
        the last chunk is handed over."""
        path = self.path_of(digest)
        try:
            f = open(path, "rb", buffering=0)
        except OSError as e:
            raise ImgtoolError(f"cannot read blob {digest} ({what}) from the cache: {e.strerror}: {path}",
                               hint="fetch again: the puller puts missing blobs back into the cache") from e
        with f:
            actual = os.fstat(f.fileno()).st_size
            if actual != size:
                raise ImgtoolError(f"blob {digest} ({what}) in the cache is {actual} bytes, expected {size}",
                                   hint="remove it from the cache and fetch again")
            hasher = digest.hasher() if digest not in self.verified else None
            left = size
            while left:
                chunk = f.read(min(COPY_BUFFER, left))
                if not chunk:
                    raise ImgtoolError(f"blob {digest} ({what}) shrank while being read")
                left -= len(chunk)
                if hasher is not None:
                    hasher.update(chunk)
                    if not left and hasher.hexdigest() != digest.hex:
                        raise ImgtoolError(f"blob {digest} ({what}) in the cache does not match its digest: {path}",
                                           hint="remove that file (or the whole cache) and fetch again")
                yield chunk
