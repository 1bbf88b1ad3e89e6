"""A bundle read as one checked stream: the source `imgtool load` sends from (bundle → runtime).

One forward pass over the parts (`PartsStream`, strict: each part's size, and a compressed archive's parts' sha256
as the read that ends each returns), decompressed when the archive is, and checked member by member against what
bundle.json implies, which checks every byte of an uncompressed archive (its parts are not hashed again): every
tar header byte-identical to layout's, every member's data hashed against its digest (on a worker beside the
upload: hashlib releases the GIL), padding and trailer zeros, nothing after the end. A destination asks for members
in archive order (`chunks`); the members between are read and checked as they pass, not handed over. The digests are
settled at the end (`settle`): the runtime destination holds the last member bytes back until it returned, so a
deviation anywhere cuts the upload short and the runtime, which registers nothing before an archive is complete,
drops it. For a runtime that does not check diff_ids itself (Podman where its records cannot be read), every layer
handed over is also decompressed and hashed for its diff_id (`diff_ids`).

What it raises: VerifyError (a part), `bundle.landing.Cut`, itself one (the archive deviates); either way the caller
checks the whole bundle to name every damaged part. Python 3.7 (the pyz loads through this).
"""

import hashlib
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Dict, FrozenSet, Iterable, Iterator, List, Tuple, Union

from ..bundle import layout
from ..bundle.format import BundleIndex
from ..bundle.landing import Cut
from ..bundle.reader import READ_SIZE, DecodeError, PartsStream, decompressed
from ..bundle.walk import layer_digester
from ..errors import ImgtoolError
from ..model import Digest, PulledImage
from ..worker import Worker

if TYPE_CHECKING:
    from ..pipeline import Plan


class ArchiveSource:
    """The bundle in `bundle_dir` (its parsed `index`) as one checked stream; `diff_ids`: also compute the diff_id of
    every layer handed over (`jobs` at once). A context manager: every path out of it ends the stream and workers."""

    def __init__(self, bundle_dir: Path, index: BundleIndex, diff_ids: bool = False, jobs: int = 2):
        self.index = index
        self.what = f"bundle {Path(bundle_dir).name}"
        self.slots, self.tar_size = layout.arrange(layout.members(index.images, index.legacy_names))
        # an uncompressed archive's every byte is checked below (headers, member digests, padding, the end): its
        # parts are not hashed again; a compressed one's parts are (bytes the decompressor skips are checked so)
        self.parts = PartsStream(Path(bundle_dir), index, strict=True, hash_parts=index.archive.compression != "none")
        try:  # a zstd bundle on a Python without zstandard fails here: the parts' worker ends all the same
            self.stream = decompressed(self.parts, index.archive.compression)
        except BaseException:
            self.parts.close()
            raise
        self.hashes: Worker = Worker(_bad_members, "member-sha256")
        self.diff_ids = _DiffIds(index, jobs) if diff_ids else None
        self.at = 0  # the next member of `slots` to read
        self.consumed = 0  # tar bytes read

    def __enter__(self) -> "ArchiveSource":
        return self

    def __exit__(self, *exc: object) -> None:
        self.finish()

    def images(self) -> List[PulledImage]:
        """None: a runtime destination plans a bundle from its bundle.json (runtime_dest.BundleLoad), and reads its
        manifests and configs, like every blob, from the stream."""
        return []

    def has(self) -> FrozenSet[Digest]:
        """Every blob its archive holds (a delta bundle's left-out layers are not)."""
        return frozenset(p.member.digest for p in self.slots if p.member.kind != "meta")

    def start(self, plan: "Plan") -> None:
        """Nothing to start: the stream is read as the destination asks."""

    def path(self, digest: Digest) -> None:
        return None

    def _take(self, n: int) -> Iterator[bytes]:
        while n > 0:
            try:
                data = self.stream.read(min(n, READ_SIZE))
            except DecodeError as e:
                raise Cut(f"the archive cannot be decompressed: {e}") from e
            if not data:
                raise Cut("the archive ends early")
            n -= len(data)
            self.consumed += len(data)
            yield data

    def _exactly(self, n: int) -> bytes:
        return b"".join(self._take(n))

    def _member(self, p: layout.Slot, hand_over: bool) -> Iterator[bytes]:
        """One member: its header checked, its data hashed (handed over when asked), its padding checked."""
        m = p.member
        if self._exactly(len(p.header)) != p.header:
            raise Cut(f"archive member {m.name} is not where bundle.json puts it")
        job = self.diff_ids.start(m) if self.diff_ids is not None and hand_over and m.kind == "layer" else None
        for data in self._take(m.size):
            self.hashes.put(data)
            if job is not None:
                job.put(data)
            if hand_over:
                yield data
        if job is not None:
            job.close()
        self.hashes.put(m)
        if self._exactly(layout.padding(m.size)).strip(b"\0"):
            raise Cut(f"the archive has non-zero padding after {m.name}")

    def chunks(self, digest: Digest, size: int, what: str) -> Iterator[bytes]:
        """The member's data, read forward from the stream (the members before it read and checked as they pass);
        raises ImgtoolError for a member behind the stream or not in the bundle."""
        while self.at < len(self.slots):
            p = self.slots[self.at]
            self.at += 1
            if p.member.digest == digest and p.member.kind != "meta":
                if p.member.size != size:
                    raise ImgtoolError(f"blob {digest} ({what}) is {p.member.size} bytes in {self.what}, "
                                       f"expected {size}")
                yield from self._member(p, True)
                return
            for _ in self._member(p, False):
                pass
        raise ImgtoolError(f"{self.what}: blob {digest} ({what}) is not ahead in its archive")

    def settle(self) -> None:
        """Read and check the rest of the archive, then every digest and diff_id: raises Cut or VerifyError."""
        while self.at < len(self.slots):
            p = self.slots[self.at]
            self.at += 1
            for _ in self._member(p, False):
                pass
        for data in self._take(self.tar_size - self.consumed):
            if data.strip(b"\0"):
                raise Cut("the archive has data after its end-of-archive marker")
        try:
            longer = self.stream.read(READ_SIZE)  # the last read ended the last part (its sha256 checked then, if hashed)
        except DecodeError as e:  # the compressed stream's own end (a gzip trailer, its CRC) is damaged
            raise Cut(f"the archive cannot be decompressed: {e}") from e
        if longer:
            raise Cut("the archive is longer than bundle.json says")
        self.parts.drain()  # a compressed archive may end before its last part does: check that part too
        bad = [f"{m.what} differs from its digest" for m in self.hashes.result()]
        bad += self.diff_ids.bad() if self.diff_ids is not None else []
        if bad:
            raise Cut(", ".join(bad))

    def cancel(self) -> None:
        self.finish()

    def finish(self) -> None:
        self.hashes.abandon()
        if self.diff_ids is not None:
            self.diff_ids.close()
        self.parts.close()


def _bad_members(feed: Iterable[Union[bytes, layout.Member]]) -> List[layout.Member]:
    """A Worker target: the feed is each member's data chunks followed by the member; returns those whose
    data differs from their digest (hashlib releases the GIL, so this runs beside the upload)."""
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


class _DiffIds:
    """Every layer's diff_id computed while the archive streams (for a runtime that does not check them):
    a decompressing hasher per layer, `jobs` at once; `bad()` names the layers whose content differs."""

    def __init__(self, index: BundleIndex, jobs: int):
        self.expected: Dict[Digest, set] = {}
        for image in index.images:
            for layer in image.layers:
                self.expected.setdefault(layer.digest, set()).add(layer.diff_id)
        self.slots = threading.Semaphore(max(1, jobs))
        self.jobs: List[Tuple[layout.Member, Worker[Tuple[str, int]]]] = []

    def start(self, member: layout.Member) -> "Worker[Tuple[str, int]]":
        self.slots.acquire()
        job = Worker(layer_digester(member.media_type, self.slots), f"diff-id-{member.digest.short}")
        self.jobs.append((member, job))
        return job

    def bad(self) -> List[str]:
        out = []
        for member, job in self.jobs:
            try:
                diff_id, _ = job.result()
            except (DecodeError, ImgtoolError) as e:
                out.append(f"{member.what} cannot be decompressed: {e}")
                continue
            if Digest.parse(diff_id) not in self.expected.get(member.digest, set()):
                out.append(f"{member.what}'s uncompressed content does not match its diff_id")
        return out

    def close(self) -> None:
        for _, job in self.jobs:
            job.abandon()
