"""One copy between where an image lives and where it goes (issue 37; docs/design.md "One copy").

Every verb that moves an image is a pair of ends: a **source** (the images it has: their manifests and configs; each
blob by digest) and a **destination** (what it already holds, the order it takes blobs in, the blobs and manifests
written, then committed or aborted). `copy` is the one order of steps between them:

1. `source.images()`: the images, each a `model.PulledImage` (manifest and config bytes, digest-checked);
2. `destination.plan(images)`: what it already holds (skipped: a delta falls out of it) and the order it takes
   the rest in;
3. `source.start(plan)`: the source starts producing blobs in that order (a registry downloads them, several at once);
4. an optional layer transform (`--layers compat|plain`: zstd rewritten as gzip, or unpacked) on the plan;
5. `destination.write(plan, source)`: every blob read through `source.chunks` (digest-checked by the source as it
   is read, unless this run already checked it), then the manifests; the destination commits only once every
   byte is in (a bundle's bundle.json written last, a runtime's image tagged, a registry's manifest pushed);
6. on any failure the source is cancelled and the destination aborts: nothing half-written stays.

Signing and printing are the verb's, after the copy. Python 3.7: the offline side (load) runs through this too.
"""

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, FrozenSet, Generic, Optional, Tuple, TypeVar

from ..model import Digest, PulledImage

if TYPE_CHECKING:  # typing.Protocol is 3.8+: the protocols exist for mypy only, the offline side never meets them
    from pathlib import Path

    from ..bundle.regions import Regions
    from typing import Iterator, List, Protocol, Sequence

    class Blobs(Protocol):
        """What a destination reads blobs through (every source is one)."""

        def chunks(self, digest: Digest, size: int, what: str) -> "Iterator[bytes]":
            """The blob's bytes in big reads; raises ImgtoolError (missing, wrong size, wrong digest: checked
            before the last chunk is handed over, so a consumer never commits a damaged blob)."""

        def path(self, digest: Digest) -> "Optional[Path]":
            """The blob as a whole file, once it is there (waits for a download), or None when the source has no
            file per blob (a bundle read in place): a transform reads files."""

    class Source(Blobs, Protocol):
        what: str  # for messages: "quay.io (https://quay.io)", "bundle vllm-ascend-v0.22.1rc1", "Docker at ..."

        def images(self) -> "List[PulledImage]": ...

        def start(self, plan: "Plan") -> None:
            """Begin producing the plan's blobs in its order (a registry: the download thread)."""

        def finish(self) -> Any:
            """Wait for the source's work to end; its statistics (a registry: `puller.PullStats`). Raises what the
            source's own thread raised."""

        def cancel(self) -> None:
            """Stop producing (the copy failed): what a download finished or started stays in the cache."""

        def settle(self) -> None:
            """Raise what a check the source defers found (a bundle read as one stream: its digests, its parts,
            its trailer); a destination calls it before its last bytes go out. Nothing for a source whose
            `chunks` checks each blob before its last chunk."""

    R = TypeVar("R", covariant=True)

    class Destination(Protocol[R]):
        what: str

        def plan(self, images: "Sequence[PulledImage]") -> "Plan": ...

        def write(self, plan: "Plan", source: "Source") -> R:
            """Every blob of the plan and the manifests, committed; raises ImgtoolError with nothing committed."""

        def abort(self) -> None:
            """Remove what `write` began (called on every failure, including before `write`)."""


@dataclass(frozen=True)
class Plan:
    """What a copy moves: decided before the first blob byte is read."""

    images: Tuple[PulledImage, ...]
    order: Tuple[Digest, ...]  # the layer blobs to read, in the order the destination takes them
    skip: FrozenSet[Digest] = frozenset()  # layer blobs the destination already holds: never read
    extra: dict = field(default_factory=dict, compare=False)  # what the destination planned and wants back in write
    # where the destination wants layer blobs written (a bundle's unfinished archive, bundle/regions.py): a source
    # that downloads writes them there instead of its cache, and the destination reads them back only to hash
    regions: Optional["Regions"] = field(default=None, compare=False)


T = TypeVar("T")


@dataclass
class Copied(Generic[T]):
    plan: Plan
    result: T
    stats: Any  # the source's


# a layer transform: the plan (images with their rewritten layers), given the source to read the old ones from
Transform = Callable[[Plan, "Source"], Plan]


def copy(source: "Source", destination: "Destination[T]", transform: Optional[Transform] = None,
         plan: Optional[Plan] = None) -> Copied[T]:
    """The one copy: images → plan → blobs (transformed) → manifests → commit; on any failure the source is
    cancelled and the destination aborted. `plan`: the destination's, when the verb made it first (fetch checks
    the free space for it before the first byte is downloaded)."""
    started = False
    try:
        if plan is None:
            plan = destination.plan(source.images())
        started = True  # before: Ctrl-C can land inside start(), after the source's thread began
        source.start(plan)
        if transform is not None:
            plan = transform(plan, source)
        result = destination.write(plan, source)
        stats = source.finish()
    except BaseException:
        if started:
            source.cancel()
        destination.abort()
        raise
    return Copied(plan, result, stats)
