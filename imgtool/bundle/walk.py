"""The strict walk over a bundle's archive: every tar member checked against bundle.json.

The archive may hold only what bundle.json implies (layout.members): regular files with
exactly the header imgtool writes, the implied size, and content matching the digest in the
name. Paths with `..` or a leading `/`, links, devices, FIFOs, directories, unknown or
duplicate names, wrong sizes and bytes after the end are reported, so a bundle that passes
is byte-for-byte what the writer would produce from its bundle.json. Layers can also be
decompressed on worker threads (gz.py: ISA-L or zlib, both release the GIL) to check their
diff_ids and measure their unpacked size, the inflate and the hash of each on threads of their own.
"""

import hashlib
import os
import tarfile
import threading
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Set, Tuple

from ..errors import ImgtoolError
from ..model import LAYER_COMPRESSION, Digest
from . import layout
from .format import BundleIndex
from ..worker import Worker
from .reader import READ_SIZE, DecodeError, PartMap, Problem, decompressed

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


def layer_digester(media_type: str, slots: threading.Semaphore):
    """A Worker target: decompress one layer fed to it and return (diff_id, unpacked size).

    The unpacked bytes are hashed on a thread of their own: inflating (gz.py: ISA-L or zlib) and sha256 both
    release the GIL, so one layer keeps two cores busy instead of one. Raises DecodeError; releases its slot
    (the walk runs at most `jobs` of them) however it ends.
    """
    def run(feed) -> Tuple[str, int]:
        try:
            reader = decompressed(feed, LAYER_COMPRESSION.get(media_type, "gzip"))
            with Worker(_sha256_and_size, "diff-id-sha256") as hasher:
                for data in iter(lambda: reader.read(READ_SIZE), b""):
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


class _Walk:
    def __init__(self, stream, index: BundleIndex, part_map: PartMap, diff_ids: bool, jobs: int):
        self.stream, self.index, self.map = stream, index, part_map
        self.check_diff_ids = diff_ids
        self.members, self.tar_size = layout.arrange(layout.members(index.images, index.legacy_names))
        self.expected = {p.member.name: p for p in self.members}
        self.diff: Dict[Digest, Set[Digest]] = {}
        for image in index.images:
            for layer in image.layers:
                self.diff.setdefault(layer.digest, set()).add(layer.diff_id)
        self.slots = threading.Semaphore(max(1, jobs))
        self.jobs: List[Tuple[layout.Member, Worker[Tuple[str, int]]]] = []
        self.damaged: Set[Digest] = set()  # blobs whose sha256 differs from their digest
        self.seen: Set[str] = set()
        self.offset = 0
        self.result = WalkResult()

    # -- reading -------------------------------------------------------------------------------

    def read_exact(self, n: int) -> bytes:
        chunks = []
        while n > 0:
            data = self.stream.read(min(n, READ_SIZE))
            if not data:
                break
            chunks.append(data)
            n -= len(data)
            self.offset += len(data)
        return b"".join(chunks)

    def skip(self, n: int, sink=None) -> int:
        """Read n bytes, passing each chunk to sink; returns how many there were."""
        got = 0
        while got < n:
            data = self.stream.read(min(n - got, READ_SIZE))
            if not data:
                break
            got += len(data)
            self.offset += len(data)
            if sink:
                sink(data)
        return got

    def problem(self, message: str, start: int, end: Optional[int] = None) -> None:
        parts = self.map.parts(start, end if end is not None else start + 1)
        self.result.problems.append(Problem(f"{message} ({self.map.describe(parts)})", parts))

    # -- the walk ------------------------------------------------------------------------------

    def run(self) -> WalkResult:
        try:
            try:
                self._members()
            except DecodeError as e:
                self.problem(f"the archive cannot be decompressed: {e}", self.offset)
            self._layer_results()
        except BaseException:
            for _, job in self.jobs:  # every worker ends before the error leaves the walk
                job.abandon()
            raise
        missing = [p for name, p in self.expected.items() if name not in self.seen]
        for p in missing:
            self.problem(f"the archive lacks {p.member.name} ({p.member.what})", p.offset, p.end)
        return self.result

    def _members(self) -> None:
        while True:
            start = self.offset
            block = self.read_exact(layout.BLOCK)
            if len(block) < layout.BLOCK:
                self.problem(f"the archive ends early, at byte {start}", start)
                return
            if block == ZERO_BLOCK:
                self._trailer(start)
                return
            raw = block
            try:
                info = tarfile.TarInfo.frombuf(block, "utf-8", "surrogateescape")
            except tarfile.HeaderError:
                self.problem(f"the archive is damaged: no valid tar header at byte {start}", start)
                return
            pax: Dict[str, str] = {}
            if info.type in (tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK):
                if info.type != tarfile.XHDTYPE or info.size > MAX_PAX:
                    self.problem(f"the archive uses a tar extension imgtool does not write (type {info.type!r}) "
                                 f"at byte {start}", start)
                    return
                body = self.read_exact(info.size + layout.padding(info.size))
                parsed = _parse_pax(body[:info.size])
                block = self.read_exact(layout.BLOCK)
                raw += body + block
                try:
                    info = tarfile.TarInfo.frombuf(block, "utf-8", "surrogateescape")
                except tarfile.HeaderError:
                    self.problem(f"the archive is damaged: no valid tar header at byte {start}", start)
                    return
                if parsed is None or info.type in (tarfile.XHDTYPE, tarfile.XGLTYPE):
                    self.problem(f"the archive has a malformed pax header at byte {start}", start)
                    return
                pax = parsed
            name = pax.get("path", info.name)
            linkname = pax.get("linkpath", info.linkname)
            try:
                size = int(pax.get("size", info.size))
            except ValueError:
                self.problem(f"the archive has a malformed pax header at byte {start}", start)
                return
            if info.type in _HEADER_ONLY:
                size = 0
            self._member(name, linkname, info.type, size, raw, start)

    def _member(self, name: str, linkname: str, kind: bytes, size: int, raw: bytes, start: int) -> None:
        data_start = self.offset
        bad = self._refusal(name, linkname, kind, size)
        if bad is not None:
            self.problem(f"archive member {name!r} {bad}", start, data_start + size)
            self.skip(size + layout.padding(size))
            if name in self.expected and _path_problem(name) is None:
                self.seen.add(name)
            return
        self.seen.add(name)
        slot = self.expected[name]
        member = slot.member
        if raw != slot.header:
            self.problem(f"archive member {name} has a tar header imgtool does not write "
                         "(owner, mode, time or name encoding differ)", start)
        sha = hashlib.sha256()
        job = None
        if member.kind == "layer" and self.check_diff_ids:
            self.slots.acquire()
            # 16 MiB of read-ahead per layer: the walk moves on to the next layer while this one inflates
            job = Worker(layer_digester(member.media_type, self.slots), f"diff-id-{member.digest.short}", maxsize=16)
            self.jobs.append((member, job))

        def sink(data: bytes) -> None:
            sha.update(data)
            if job is not None:
                job.put(data)

        try:
            got = self.skip(size, sink)
        finally:
            if job is not None:
                job.close()  # the layer's data ends here, or the walk stops here
        if got < size:
            self.problem(f"the archive ends early, inside {name} ({member.what})", start)
            return
        self.result.blobs_checked += member.kind != "meta"
        if sha.hexdigest() != member.digest.hex:
            if member.kind == "meta":
                self.problem(f"archive member {name} differs from what bundle.json implies; {REMADE}", start,
                             data_start + size)
            else:
                self.damaged.add(member.digest)
                self.problem(f"{member.what} (blob {member.digest.short}) is damaged: its sha256 differs from "
                             f"its digest; {REMADE}", start, data_start + size)
        pad = self.read_exact(layout.padding(size))
        if pad.strip(b"\0"):
            self.problem(f"the archive has non-zero padding after {name}", data_start + size)

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
        if size != self.expected[name].member.size:
            return f"is {size} bytes, but bundle.json implies {self.expected[name].member.size}"
        return None

    def _trailer(self, start: int) -> None:
        nonzero = []
        self.skip(1 << 62, lambda data: nonzero.append(True) if data.strip(b"\0") else None)
        if nonzero:
            self.problem(f"the archive has data after its end-of-archive marker (byte {start})", start, self.offset)

    def _layer_results(self) -> None:
        total = 0
        for m, job in self.jobs:
            pos = self.expected[m.name]
            where = (pos.offset, pos.end)
            try:
                diff_id, size = job.result()
            except DecodeError as e:
                self.problem(f"{m.what} (blob {m.digest.short}) cannot be decompressed: {e}", *where)
                continue
            except ImgtoolError as e:  # e.g. the zstandard package missing for a zstd layer
                self.problem(f"{m.what} (blob {m.digest.short}) cannot be decompressed: {e.message}", *where)
                continue
            self.result.layers_checked += 1
            total += size
            if Digest.parse(diff_id) not in self.diff.get(m.digest, set()):
                # a blob that matches its digest is what the registry serves: fetching again gives the same bytes
                # (fetch checks diff_ids only with --check-diff-ids)
                why = REMADE if m.digest in self.damaged else \
                    ("its blob matches its digest, so the image is published this way (fetching again gives the "
                     "same bytes): report it to the image's publisher")
                self.problem(f"{m.what} (blob {m.digest.short}): its uncompressed content does not match the "
                             f"diff_id in the image config; {why}", *where)
        if self.check_diff_ids:
            self.result.unpacked_size = total


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


def walk_archive(stream, index: BundleIndex, part_map: PartMap, *, diff_ids: bool,
                 jobs: Optional[int] = None) -> WalkResult:
    """Walk the decompressed archive `stream` (read(n)) and report every deviation from bundle.json."""
    return _Walk(stream, index, part_map, diff_ids, jobs or os.cpu_count() or 2).run()
