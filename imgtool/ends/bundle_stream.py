"""A bundle read as one checked stream: the source `imgtool load` sends from (bundle → runtime).

The archive's one forward reader (bundle/archive.py) in its hand-over mode: one pass over the parts (each part's
size, and a compressed archive's parts' sha256 as the read that ends each returns; an uncompressed archive's every
byte is checked by the reader, so its parts are not hashed again), decompressed when the archive is, and checked
member by member against what bundle.json implies. A destination asks for members in archive order (`chunks`); the
members between are read and checked as they pass, not handed over. Their digests are hashed on a worker beside the
upload and settled at the end (`settle`, with the trailer and the stream's end): the runtime destination holds the
last member bytes back until it returned, so a deviation anywhere cuts the upload short and the runtime, which
registers nothing before an archive is complete, drops it. For a runtime that does not check diff_ids itself
(Podman where its records cannot be read), every layer handed over is also decompressed and hashed for its diff_id
(`diff_ids`).

What it raises: VerifyError (a part), `bundle.landing.Cut`, itself one (the archive deviates); either way the caller
checks the whole bundle to name every damaged part. Python 3.7 (the pyz loads through this).
"""

from pathlib import Path
from typing import TYPE_CHECKING, FrozenSet, Iterator, List

from ..bundle.archive import Archive, Behind
from ..bundle.format import BundleIndex
from ..bundle.landing import Cut
from ..errors import ImgtoolError
from ..model import Digest, PulledImage

if TYPE_CHECKING:
    from ..pipeline import Plan


class ArchiveSource:
    """The bundle in `bundle_dir` (its parsed `index`) as one checked stream; `diff_ids`: also compute the diff_id of
    every layer handed over (`jobs` at once). A context manager: every path out of it ends the stream and workers."""

    def __init__(self, bundle_dir: Path, index: BundleIndex, diff_ids: bool = False, jobs: int = 2):
        self.index = index
        self.what = f"bundle {Path(bundle_dir).name}"
        self.archive = Archive(Path(bundle_dir), index, fail=Cut, digests="deferred",
                               diff_ids="handed" if diff_ids else None, jobs=jobs,
                               hash_parts=index.archive.compression != "none")
        self.slots = {p.member.digest: p for p in self.archive.slots if p.member.kind != "meta"}

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
        return frozenset(self.slots)

    def start(self, plan: "Plan") -> None:
        """Nothing to start: the stream is read as the destination asks."""

    def path(self, digest: Digest) -> None:
        return None

    def chunks(self, digest: Digest, size: int, what: str) -> Iterator[bytes]:
        """The member's data, read forward from the stream (the members before it read and checked as they pass);
        raises ImgtoolError for a member behind the stream or not in the bundle, Cut (a deviation)."""
        p = self.slots.get(digest)
        if p is None:
            raise ImgtoolError(f"{self.what}: blob {digest} ({what}) is not in its archive")
        if p.member.size != size:
            raise ImgtoolError(f"blob {digest} ({what}) is {p.member.size} bytes in {self.what}, expected {size}")
        try:
            yield from self.archive.blob(p)
        except Behind:
            raise ImgtoolError(f"{self.what}: blob {digest} ({what}) is not ahead in its archive") from None

    def settle(self) -> None:
        """Read and check the rest of the archive, then every digest and diff_id: raises Cut or VerifyError."""
        self.archive.to_end()

    def settle_images(self) -> None:
        """Read and check the rest of the images' part of the archive (the models' members after it are left unread),
        then every digest and diff_id: raises Cut or VerifyError."""
        self.archive.through_images()

    def cancel(self) -> None:
        self.finish()

    def finish(self) -> None:
        self.archive.close()
