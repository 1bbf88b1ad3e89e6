"""A registry (and its mirrors) as a pipeline source: the images resolved, their blobs downloaded into the cache
(`puller.download` on a thread, in the destination's order) and read from there as each lands, or, where the
destination placed them (`Plan.regions`), downloaded straight into its archive.

Where the destination cannot check the layers' diff_ids itself (`Plan.diff_ids`: a Podman whose records cannot be
read), every layer that moves is also decompressed and hashed as it lands (`transcode.LayerCheck`, fetch
--check-diff-ids' check, on threads beside the stream); `settle`, which the destination calls before its last bytes
go out, raises the first mismatch, so the runtime drops the cut stream as it drops load's."""

import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, FrozenSet, List, Optional, Sequence, Tuple

from ..model import Digest, PulledImage
from ..progress import Progress
from ..puller import PullStats, download
from ..store import FileBlobs, Store
from ..transcode import LayerCheck
from ..worker import join

if TYPE_CHECKING:
    from ..pipeline import Plan


class RegistrySource:
    """`images`: the resolved platform images with the sources that serve each (`resolve.resolve_image`);
    `jobs`: (connections per source, at most at once)."""

    def __init__(self, pulled: Sequence[Tuple[PulledImage, list]], store: Store, progress: Progress,
                 jobs: Tuple[int, int], what: str = "registry"):
        self.pulled, self.store, self.progress, self.jobs, self.what = list(pulled), store, progress, jobs, what
        self.stats = PullStats()
        self.error: Optional[BaseException] = None
        self.stop = threading.Event()
        self.ended = False  # the download thread has returned (or raised)
        self.thread: Optional[threading.Thread] = None
        self.check: Optional[LayerCheck] = None  # the diff_ids of the layers that move, where the destination asks
        # blobs this run downloaded and checked (filled as the download goes on): read without hashing again
        self.blobs = FileBlobs(self.path, self.stats.fresh)

    def images(self) -> List[PulledImage]:
        return [im for im, _ in self.pulled]

    def has(self) -> FrozenSet[Digest]:
        """Every blob of its images (manifests and configs are in the cache once the images resolved)."""
        return frozenset(d for im, _ in self.pulled for d in [im.manifest_digest, im.manifest.config.digest]
                         + [x.digest for x in im.manifest.layers])

    def start(self, plan: "Plan[Any]") -> None:
        """Download exactly what moves, in the destination's order, on a thread; with `plan.diff_ids`, the diff_id
        of every layer that moves checked as it lands."""
        if plan.diff_ids:
            moving = set(plan.moves)
            self.check = LayerCheck(plan.images, "as-is", self.path, self.store,
                                    skip=[x.digest for im in plan.images for x in im.manifest.layers
                                          if x.digest not in moving])
        self.thread = threading.Thread(target=self._run, args=(list(plan.moves), plan.regions),
                                       name="download", daemon=True)
        self.thread.start()

    def _run(self, blobs, regions) -> None:
        try:
            self._download(blobs, regions)
        except BaseException as e:  # raised in the reading thread by path/finish
            self.error = e
        finally:
            self.ended = True
            self.store.announce()  # a reader waiting for a blob that will not come wakes up
            if regions is not None:
                regions.ended(self.error)

    def _download(self, blobs: List[Digest], regions) -> None:
        download(self.pulled, self.store, self.progress, jobs=self.jobs[0], stats=self.stats, blobs=blobs,
                 cancel=self.stop, connections=self.jobs[1], regions=regions)

    def path(self, digest: Digest) -> Path:
        """The blob's path once the store has it; raises the download's error if it ended without it."""
        self.store.wait_for(digest, lambda: self.ended)
        if self.error is not None:
            raise self.error
        return self.store.blob_path(digest)

    def chunks(self, digest: Digest, size: int, what: str):
        return self.blobs.chunks(digest, size, what)

    def settle(self) -> None:
        """Every blob was checked before its last chunk was handed over; the layers' diff_ids, where the plan asked,
        once each is in (raises VerifyError naming the layer)."""
        if self.check is not None:
            self.check.wait()

    def cancel(self) -> None:
        """Stop downloading: every started blob's partial record is kept."""
        self.stop.set()
        if self.thread is not None and self.thread.ident is not None:  # started (Ctrl-C can land inside start())
            join(self.thread)
        self._close_check()

    def finish(self) -> PullStats:
        try:
            if self.thread is not None:
                join(self.thread)
        finally:
            self._close_check()
        if self.error is not None:
            raise self.error
        return self.stats

    def _close_check(self) -> None:
        if self.check is not None:
            self.check.close()
