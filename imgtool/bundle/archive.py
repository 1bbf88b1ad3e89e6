"""The one forward reader of a bundle's archive: every verb that reads the archive from its start reads it here.

The archive is read forward from the parts (reader.PartsStream: each part's size, and its sha256 where asked, as the
read that ends it returns), decompressed when it is compressed, and checked against what bundle.json implies
(layout.py): every tar header byte for byte with the one layout writes, each member where layout puts it and its
data against its digest, the padding and the trailer zeros, the archive's end at the tar size, the decompressed
stream's own end (nothing after it: a gzip trailer intact, no bytes behind it), then the rest of the parts. A bundle
that passes is byte for byte what the writer makes of its bundle.json. Members with a path that escapes, links,
devices, FIFOs, directories, unknown or duplicate names and wrong sizes are each named.

One reader, its modes as options (`Archive`):

- strict (`fail=None`: verify's `walk_archive`): every problem is collected and named with the part that holds it,
  and the walk goes on; layers are decompressed on worker threads for their diff_ids (`diff_ids="all"`).
- fail-fast (`fail`): the first deviation raises what `fail` makes of its words (load: landing.Cut; copy and push:
  a VerifyError naming the damaged part; serve --unpack-to: "cannot unpack").
- hand-over (`blob`): a member's data handed to the caller as it passes, the members before it read and checked on
  the way. With `digests="handed"` (copy, push) its last chunk is held back until its digest matched (a blob only
  passed over is not hashed: the consumer does not take it, or takes it in a later pass); with
  `digests="deferred"` (load) the digests are hashed on a worker beside the consumer and settled by `to_end`
  (the runtime destination holds its own last bytes until then); `diff_ids="handed"`: the layers handed over are
  also decompressed for their diff_ids (a runtime that does not check them).
- passed over (`passed_over`, an uncompressed archive whose parts are not hashed on the way): a member's header,
  place and padding checked, its data not read but handed over as where it lies in the parts, for a consumer that
  copies it in the kernel and checks every byte it copied against the digest (load's placement of model files).
- rewindable: a reader is one pass; the bundle source opens a new `Archive` for a second pass.
- `tee`: every archive byte also goes to a sink (serve --unpack-to writes the archive so, `digests="off"`: serve
  checks each blob it hands out itself).

Python 3.7, stdlib only (gz.py's inflate; zstandard only for a zstd bundle): imgtool.pyz reads bundles through this.
"""

import hashlib
import tarfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, Iterable, Iterator, List, Optional, Set, Tuple, Union

from ..errors import ImgtoolError
from ..filecopy import Regions
from ..model import LAYER_COMPRESSION, Digest
from ..worker import Worker
from . import layout
from . import reader as _reader
from .format import BundleIndex
from .reader import READ_SIZE, DecodeError, PartMap, PartsStream, Problem, decompressed

ZERO_BLOCK = bytes(layout.BLOCK)
MAX_PAX = 64 * 1024
# a blob that differs from its digest in parts that match their sums was written so by what made the bundle (a fetch,
# an export, a copy of another bundle: bundle.json does not say which): that is what to run again
REMADE = "the bundle itself is bad: make it again as it was made (imgtool fetch, export or copy)"
_LINK_KINDS = {
    tarfile.SYMTYPE: "a symbolic link",
    tarfile.LNKTYPE: "a hard link",
    tarfile.CHRTYPE: "a character device",
    tarfile.BLKTYPE: "a block device",
    tarfile.FIFOTYPE: "a FIFO",
    tarfile.DIRTYPE: "a directory",
}
_HEADER_ONLY = set(_LINK_KINDS)  # tar readers (Go's and Python's) read no data for these


@dataclass
class WalkResult:
    problems: List[Problem] = field(default_factory=list)
    blobs_checked: int = 0
    layers_checked: int = 0
    unpacked_size: Optional[int] = None  # sum over distinct layers, when diff_ids were checked


class Behind(ImgtoolError):
    """A member asked for that this pass has read already (the caller opens a new pass)."""


class _Stop(Exception):
    """Strict mode: a problem after which the archive cannot be read on (recorded already)."""


def layer_digester(media_type: str, slots: threading.Semaphore):
    """A Worker target: decompress one layer fed to it and return (diff_id, unpacked size).

    The unpacked bytes are hashed on a thread of their own: inflating (gz.py: ISA-L or zlib) and sha256 both
    release the GIL, so one layer keeps two cores busy instead of one. Raises DecodeError; releases its slot
    (the reader runs at most `jobs` of them) however it ends.
    """
    def run(feed) -> Tuple[str, int]:
        try:
            unpacked = decompressed(feed, LAYER_COMPRESSION.get(media_type, "gzip"))
            with Worker(_sha256_and_size, "diff-id-sha256") as hasher:
                for data in iter(lambda: unpacked.read(READ_SIZE), b""):
                    hasher.put(data)
                return hasher.result()
        finally:
            slots.release()

    return run


def _sha256_and_size(feed) -> Tuple[str, int]:
    sha = hashlib.sha256()
    size = 0
    for data in feed:
        sha.update(data)
        size += len(data)
    return "sha256:" + sha.hexdigest(), size


def _bad_members(feed: Iterable[Union[bytes, layout.Member]]) -> List[layout.Member]:
    """A Worker target: the feed is each member's data chunks followed by the member; returns those whose
    data differs from their digest (hashlib releases the GIL, so this runs beside the consumer)."""
    bad = []
    sha = hashlib.sha256()
    for item in feed:
        if isinstance(item, layout.Member):
            if sha.hexdigest() != item.digest.hex:
                bad.append(item)
            sha = hashlib.sha256()
        else:
            sha.update(item)
    return bad


class Archive:
    """The archive of the bundle in `bundle_dir` (its parsed `index`) read forward once; see the module's text for
    the modes. `fail`: None collects problems (strict), else makes the exception a deviation raises from its words.
    `digests`: "inline" (every member as it passes) | "handed" (inline, the members handed over and the generated
    ones) | "deferred" | "off"; `diff_ids`: None | "all" | "handed" (`jobs` layers at once);
    `hash_parts`, `strict_parts`, `on_bytes`: the PartsStream's. Close it (`with`) on every path: its workers end."""

    def __init__(self, bundle_dir: Path, index: BundleIndex, *, fail: Optional[Callable[[str], BaseException]] = None,
                 digests: str = "inline", diff_ids: Optional[str] = None, jobs: int = 2, hash_parts: bool = True,
                 strict_parts: bool = True, on_bytes: Callable[[int], None] = lambda n: None,
                 read_size: int = READ_SIZE, tee: Optional[Callable[[bytes], None]] = None):
        self.index, self.fail, self.digests, self.diff_mode = index, fail, digests, diff_ids
        self.read_size, self.tee = read_size, tee
        self.map = PartMap(index)
        self.slots, self.tar_size = layout.arrange(layout.bundle_members(index))
        self.expected: Dict[str, Tuple[int, layout.Slot]] = {p.member.name: (i, p) for i, p in enumerate(self.slots)}
        self.diff: Dict[Digest, Set[Digest]] = {}
        for image in index.images:
            for layer in image.layers:
                self.diff.setdefault(layer.digest, set()).add(layer.diff_id)
        self.slots_free = threading.Semaphore(max(1, jobs))
        self.jobs: List[Tuple[layout.Member, Worker[Tuple[str, int]]]] = []
        self.hashes: Optional[Worker[List[layout.Member]]] = None
        self.damaged: Set[Digest] = set()  # blobs whose sha256 differs from their digest
        self.seen: Set[str] = set()
        self.at = 0  # the index in `slots` of the next member the archive must hold
        self.offset = 0  # tar bytes read
        self.ended = False  # the archive was read to its end (or, strict, as far as it could be)
        self.strays = False  # a member bundle.json does not list was found: what it adds to the length is said
        self.result = WalkResult()
        self.dir = Path(bundle_dir)
        self.parts = PartsStream(Path(bundle_dir), index, strict=strict_parts, on_bytes=on_bytes,
                                 hash_parts=hash_parts)
        try:  # a zstd bundle on a Python without zstandard fails here: the parts' worker ends all the same
            self.stream = _reader.decompressed(self.parts, index.archive.compression)
        except BaseException:
            self.parts.close()
            raise
        if digests == "deferred":
            self.hashes = Worker(_bad_members, "member-sha256")

    def __enter__(self) -> "Archive":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """End every worker and the parts' stream (on every path)."""
        if self.hashes is not None:
            self.hashes.abandon()
        for _, job in self.jobs:
            job.abandon()
        self.parts.close()

    # -- findings ------------------------------------------------------------------------------

    def _problem(self, message: str, start: int, end: Optional[int] = None, stop: bool = False) -> None:
        """Strict: record it (and stop the walk when `stop`); else raise what `fail` makes of it."""
        parts = self.map.parts(start, end if end is not None else start + 1)
        said = f"{message} ({self.map.describe(parts)})"
        if self.fail is not None:
            raise self.fail(said)
        self.result.problems.append(Problem(said, parts))
        if stop:
            raise _Stop()

    # -- reading -------------------------------------------------------------------------------

    def _read(self, n: int) -> bytes:
        try:
            data = self.stream.read(n)
        except DecodeError as e:
            self._problem(f"the archive cannot be decompressed: {e}", self.offset, stop=True)
            raise  # not reached: _problem raised
        self.offset += len(data)
        if self.tee is not None and data:
            self.tee(data)
        return data

    def _exactly(self, n: int) -> bytes:
        chunks = []
        while n > 0:
            data = self._read(min(n, self.read_size))
            if not data:
                break
            chunks.append(data)
            n -= len(data)
        return b"".join(chunks)

    def _chunks(self, n: int) -> Iterator[bytes]:
        """Up to n bytes in reads of read_size; fewer only when the archive ends."""
        while n > 0:
            data = self._read(min(n, self.read_size))
            if not data:
                return
            n -= len(data)
            yield data

    # -- the walk ------------------------------------------------------------------------------

    def _next(self) -> Optional[layout.Slot]:
        """The next member's header read and checked; its slot (the data follows), or None at the archive's end
        (the trailer and the stream's end checked). Strict: a member refused is passed over."""
        while True:
            start = self.offset
            block = self._exactly(layout.BLOCK)
            if len(block) < layout.BLOCK:
                self._problem(f"the archive ends early, at byte {start}", start, stop=True)
            if block == ZERO_BLOCK:
                if self.fail is not None and self.at < len(self.slots):
                    p = self.slots[self.at]
                    self._problem(f"the archive lacks {p.member.name} ({p.member.what})", p.offset, p.end)
                self._trailer(start)
                return None
            name, linkname, kind, size, raw = self._header(block, start)
            data_start = self.offset
            bad = self._refusal(name, linkname, kind, size)
            if bad is not None:
                self._problem(f"archive member {name!r} {bad}", start, data_start + size)
                self.strays = self.strays or name not in self.expected
                for _ in self._chunks(size + layout.padding(size)):
                    pass
                if name in self.expected and _path_problem(name) is None:
                    self.seen.add(name)
                continue
            self.seen.add(name)
            i, slot = self.expected[name]
            if raw != slot.header:
                self._problem(f"archive member {name} has a tar header imgtool does not write "
                              "(owner, mode, time or name encoding differ)", start)
            if i < self.at:  # strict mode reports a member it lacks at the end, once it knows
                self._problem(f"archive member {name} is out of order: bundle.json puts it before "
                              f"{self.slots[self.at - 1].member.name}", start)
            elif i > self.at and self.fail is not None:
                lacks = self.slots[self.at]
                self._problem(f"the archive lacks {lacks.member.name} ({lacks.member.what})", lacks.offset, lacks.end)
            self.at = max(self.at, i + 1)
            return slot

    def _header(self, block: bytes, start: int) -> Tuple[str, str, bytes, int, bytes]:
        """(name, link name, type, data size, the header's raw bytes) of the header in `block` (and a pax header
        before it); a header imgtool cannot read stops the walk."""
        raw = block
        try:
            info = tarfile.TarInfo.frombuf(block, "utf-8", "surrogateescape")
        except tarfile.HeaderError:
            self._problem(f"the archive is damaged: no valid tar header at byte {start}", start, stop=True)
        pax: Dict[str, str] = {}
        if info.type in (tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK):
            if info.type != tarfile.XHDTYPE or info.size > MAX_PAX:
                self._problem(f"the archive uses a tar extension imgtool does not write (type {info.type!r}) "
                              f"at byte {start}", start, stop=True)
            body = self._exactly(info.size + layout.padding(info.size))
            parsed = _parse_pax(body[:info.size])
            block = self._exactly(layout.BLOCK)
            raw += body + block
            try:
                info = tarfile.TarInfo.frombuf(block, "utf-8", "surrogateescape")
            except tarfile.HeaderError:
                self._problem(f"the archive is damaged: no valid tar header at byte {start}", start, stop=True)
            if parsed is None or info.type in (tarfile.XHDTYPE, tarfile.XGLTYPE):
                self._problem(f"the archive has a malformed pax header at byte {start}", start, stop=True)
            pax = parsed or {}
        try:
            size = int(pax.get("size", info.size))
        except ValueError:
            self._problem(f"the archive has a malformed pax header at byte {start}", start, stop=True)
            size = 0  # not reached
        if info.type in _HEADER_ONLY:
            size = 0
        return pax.get("path", info.name), pax.get("linkpath", info.linkname), info.type, size, raw

    def _refusal(self, name: str, linkname: str, kind: bytes, size: int) -> Optional[str]:
        """Why a member may not be in the archive (its path, its type, not listed, twice, its size), or None."""
        bad = _path_problem(name)
        if bad is not None:
            return bad
        if kind in _LINK_KINDS:
            target = f" to {linkname!r}" if kind in (tarfile.SYMTYPE, tarfile.LNKTYPE) else ""
            return f"is {_LINK_KINDS[kind]}{target}: the archive may hold only regular files"
        if kind not in (tarfile.REGTYPE, tarfile.AREGTYPE):
            return f"has tar type {kind!r}: the archive may hold only regular files"
        if name not in self.expected:
            return "is not listed by bundle.json"
        if name in self.seen:
            return "appears twice"
        implied = self.expected[name][1].member.size
        if size != implied:
            return f"is {size} bytes, but bundle.json implies {implied}"
        return None

    def _data(self, slot: layout.Slot, hand_over: bool) -> Iterator[bytes]:
        """One member's data (handed over when asked, the last chunk held back until its digest matched when
        digests are checked inline), then its padding."""
        m = slot.member
        start = self.offset
        inline = self.digests in ("inline", "handed")
        # "handed": a blob passed over is not hashed: a pass that passes it hands it over in a later pass (and
        # hashes it then) or the consumer does not take it; its header, size, padding and place are checked all the
        # same (a compressed bundle's first pass for the manifests passes layers: hashing them was a second sha256
        # of them on copy's path)
        sha = hashlib.sha256() if self.digests == "inline" or (inline and (hand_over or m.kind == "meta")) else None
        job = self._diff_job(m, hand_over)
        held = None
        got = 0
        try:
            for data in self._chunks(m.size):
                got += len(data)
                self._feed(data, sha, job)
                if hand_over:
                    if held is not None:
                        yield held
                    held = data if inline else None
                    if not inline:
                        yield data
        finally:
            if job is not None:
                job.close()  # the layer's data ends here, or the reader stops here
        self._member_read(slot, start, got, sha)
        if held is not None:
            yield held
        if self._exactly(layout.padding(m.size)).strip(b"\0"):
            self._problem(f"the archive has non-zero padding after {m.name}", start + m.size)

    def _diff_job(self, m: "layout.Member", hand_over: bool) -> Optional[Worker]:
        """The worker that inflates a layer for its diff_id, when this mode asks for it (None otherwise)."""
        if m.kind != "layer" or not (self.diff_mode == "all" or (self.diff_mode == "handed" and hand_over)):
            return None
        self.slots_free.acquire()
        # 16 MiB of read-ahead per layer: the reader moves on to the next layer while this one inflates
        job = Worker(layer_digester(m.media_type, self.slots_free), f"diff-id-{m.digest.short}", maxsize=16)
        self.jobs.append((m, job))
        return job

    def _feed(self, data: bytes, sha: Optional["hashlib._Hash"], job: Optional[Worker]) -> None:
        if sha is not None:
            sha.update(data)
        if self.hashes is not None:
            self.hashes.put(data)
        if job is not None:
            job.put(data)

    def _member_read(self, slot: layout.Slot, start: int, got: int, sha: Optional["hashlib._Hash"]) -> None:
        """After a member's data: was all of it there, and (inline) its digest; the deferred hash told its end."""
        m = slot.member
        if got < m.size:
            self._problem(f"the archive ends early, inside {m.name} ({m.what})", slot.offset, stop=True)
        self.result.blobs_checked += m.kind != "meta"
        if self.hashes is not None:
            self.hashes.put(m)
        if sha is not None and sha.hexdigest() != m.digest.hex:
            self.damaged.add(m.digest)
            self._problem(_differs(m), start, start + m.size)

    def _trailer(self, start: int) -> None:
        """The end-of-archive blocks and record padding up to the tar size: zeros; then nothing more, and the
        decompressed stream's own end; then the rest of the parts."""
        self.ended = True
        nonzero = False
        for data in self._chunks(max(0, self.tar_size - self.offset)):
            nonzero = nonzero or bool(data.strip(b"\0"))
        if nonzero:
            self._problem(f"the archive has data after its end-of-archive marker (byte {start})", start, self.offset)
        if self.offset < self.tar_size:
            self._problem(f"the archive ends early, at byte {self.offset}", self.offset, stop=True)
        tee, self.tee = self.tee, None  # bytes past the tar's end are not the archive
        longer = self._read(self.read_size)
        self.tee = tee
        if longer and not self.strays:  # a stray member's bytes make it longer: that member is named already
            self._problem(f"the archive is longer than bundle.json says: it goes on after byte {self.tar_size}",
                          self.tar_size, stop=True)
        self.parts.drain()  # a compressed archive may end before its last part does: check that part too

    def _settle_workers(self) -> None:
        """What the workers found: members whose digest differs (deferred), layers whose diff_id does."""
        if self.hashes is not None:
            hashes, self.hashes = self.hashes, None
            for m in hashes.result():
                self.damaged.add(m.digest)
                p = self.expected[m.name][1]
                self._problem(_differs(m), p.data_offset, p.end)
        total = 0
        jobs, self.jobs = self.jobs, []
        try:
            for m, job in jobs:
                p = self.expected[m.name][1]
                where = (p.offset, p.end)
                try:
                    diff_id, size = job.result()
                except DecodeError as e:
                    self._problem(f"{m.what} (blob {m.digest.short}) cannot be decompressed: {e}", *where)
                    continue
                except ImgtoolError as e:  # e.g. the zstandard package missing for a zstd layer
                    self._problem(f"{m.what} (blob {m.digest.short}) cannot be decompressed: {e.message}", *where)
                    continue
                self.result.layers_checked += 1
                total += size
                if Digest.parse(diff_id) not in self.diff.get(m.digest, set()):
                    # a blob that matches its digest is what the registry serves: fetching again gives the same
                    # bytes (fetch checks diff_ids only with --check-diff-ids)
                    why = REMADE if m.digest in self.damaged else \
                        ("its blob matches its digest, so the image is published this way (fetching again gives the "
                         "same bytes): report it to the image's publisher")
                    self._problem(f"{m.what} (blob {m.digest.short}): its uncompressed content does not match the "
                                  f"diff_id in the image config; {why}", *where)
        except BaseException:
            for _, job in jobs:
                job.abandon()
            raise
        if self.diff_mode == "all":
            self.result.unpacked_size = total

    # -- the modes -----------------------------------------------------------------------------

    def walk(self) -> WalkResult:
        """Strict: the whole archive, every problem collected (nothing raised for a deviation)."""
        try:
            while True:
                slot = self._next()
                if slot is None:
                    break
                for _ in self._data(slot, False):
                    pass
        except _Stop:
            pass
        self._settle_workers()
        for name, (_, p) in self.expected.items():
            if name not in self.seen:
                self._problem(f"the archive lacks {p.member.name} ({p.member.what})", p.offset, p.end)
        return self.result

    def blob(self, slot: layout.Slot, then_end: bool = False) -> Iterator[bytes]:
        """The member's data, handed over as it passes (the members before it read and checked on the way);
        `then_end`: the rest of the archive read and checked (`to_end`) before its last chunk. Raises Behind (a
        member this pass has read already), what `fail` makes (a deviation)."""
        self._walk_to(slot)
        held = None
        for data in self._data(slot, True):
            if held is not None:
                yield held
            held = data
        if then_end:
            self.to_end()
        if held is not None:
            yield held

    @property
    def can_pass_over(self) -> bool:
        """Whether `passed_over` can hand a member over by where it lies: an uncompressed archive whose parts are not
        hashed on the way (every byte is checked by the one who reads it) and whose bytes go nowhere else."""
        return self.map.exact and not self.parts.hash_parts and self.tee is None and self.fail is not None

    def passed_over(self, slot: layout.Slot) -> Regions:
        """Where the member's data lies in the parts, its header and the members before it read and checked on the
        way, its data passed over unread and unhashed (the caller copies it in the kernel and checks every byte it
        copied against the digest: load's placement of a model file), then its padding checked. Raises Behind, what
        `fail` makes (a deviation)."""
        assert self.can_pass_over
        self._walk_to(slot)
        m = slot.member
        start = self.offset
        got_bytes = self.parts.skip(m.size)
        self.offset += got_bytes
        if got_bytes < m.size:
            self._problem(f"the archive ends early, inside {m.name} ({m.what})", slot.offset, stop=True)
        if self._exactly(layout.padding(m.size)).strip(b"\0"):
            self._problem(f"the archive has non-zero padding after {m.name}", start + m.size)
        return Regions(tuple((str(self.dir / name), at, n) for name, at, n in self.map.regions(start, start + m.size)))

    def _walk_to(self, slot: layout.Slot) -> None:
        """Read and check forward to `slot`'s member: its header read, its data next. Raises Behind, what `fail`
        makes."""
        if slot.offset < self.offset:
            raise Behind(f"{slot.member.name} lies behind this pass over the archive")
        while True:
            got = self._next()
            if got is None:
                raise self._fail_now(f"the archive ends before {slot.member.name} ({slot.member.what})")
            if got.member.name == slot.member.name:
                break
            for _ in self._data(got, False):
                pass

    def to_end(self) -> None:
        """The rest of the archive read and checked to its end and the parts', then every deferred digest and
        diff_id; raises what `fail` makes (fail-fast). Once per pass."""
        while not self.ended:
            got = self._next()
            if got is None:
                break
            for _ in self._data(got, False):
                pass
        self._settle_workers()

    def through_images(self) -> None:
        """The images' part of the archive read and checked (up to the first model member, or to the end when there is
        none), then every deferred digest and diff_id; the models' members are left unread (a load that places no
        model reads none of their bytes). Raises what `fail` makes."""
        while not self.ended:
            got = self._next()
            if got is None or got.member.kind in ("model", "model-meta"):
                break
            for _ in self._data(got, False):
                pass
        self._settle_workers()

    def _fail_now(self, message: str) -> BaseException:
        assert self.fail is not None, "hand-over needs fail-fast"
        return self.fail(message)


def _differs(m: layout.Member) -> str:
    if m.kind == "meta":
        return f"archive member {m.name} differs from what bundle.json implies; {REMADE}"
    return f"{m.what} (blob {m.digest.short}) is damaged: its sha256 differs from its digest; {REMADE}"


def _path_problem(name: str) -> Optional[str]:
    if name.startswith("/"):
        return "is an absolute path"
    if ".." in name.replace("\\", "/").split("/"):
        return "escapes the archive (a `..` path)"
    if "\0" in name or "\\" in name or not name:
        return "has an invalid name"
    return None


def _parse_pax(body: bytes) -> Optional[Dict[str, str]]:
    """Records `<len> <key>=<value>\\n`; None when malformed."""
    out: Dict[str, str] = {}
    pos = 0
    while pos < len(body):
        sp = body.find(b" ", pos)
        if sp < 0:
            return None
        try:
            length = int(body[pos:sp])
        except ValueError:
            return None
        record = body[sp + 1:pos + length]
        if length <= 0 or pos + length > len(body) or not record.endswith(b"\n") or b"=" not in record:
            return None
        key, _, value = record[:-1].partition(b"=")
        out[key.decode("utf-8", "replace")] = value.decode("utf-8", "surrogateescape")
        pos += length
    return out


def walk_archive(bundle_dir: Path, index: BundleIndex, *, diff_ids: bool, jobs: int,
                 on_bytes: Callable[[int], None] = lambda n: None) -> Tuple[WalkResult, PartsStream]:
    """verify's strict walk: every deviation from bundle.json reported (the parts hashed, a damaged one recorded
    in the returned stream's `bad`, not raised); raises only what reading a part raises (missing, wrong size)."""
    with Archive(bundle_dir, index, diff_ids="all" if diff_ids else None, jobs=jobs, strict_parts=False,
                 on_bytes=on_bytes) as archive:
        result = archive.walk()
        archive.parts.drain()
    return result, archive.parts
