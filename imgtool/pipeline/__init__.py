"""One copy between where an image lives and where it goes (issue 37; docs/design.md "One copy").

Every verb that moves an image is a pair of ends: a **source** (the images it has: their manifests and configs; each
blob by digest) and a **destination** (what it already holds, the order it takes blobs in, the blobs and manifests
written, then committed or aborted). `copy` is the one order of steps between them:

1. `source.images()`: the images, each a `model.PulledImage` (manifest and config bytes, digest-checked);
2. `destination.plan(images)`: a `Holding` — the images it takes, every blob it takes in its order, those it already
   holds (a delta falls out of it), and its own planned data (`Holding.destination`: a typed value per destination);
3. `bind`: the pipeline computes what moves — the destination's order less what it holds — and checks that the
   source has each (`source.has()`); the `Plan` carries only that (`Plan.moves`), so a skipped blob is never read;
4. `destination.before(plan)`: the destination's checks before the first byte (space, zstd, a delta's base);
5. `source.start(plan)`: the source starts producing exactly `plan.moves`, in that order (a registry downloads them,
   several at once, and nothing else);
6. an optional layer transform (`--layers compat|plain`: zstd rewritten as gzip, or unpacked) on the plan;
7. `destination.write(plan, source)`: every blob read through `source.chunks` (digest-checked by the source as it
   is read, unless this run already checked it), then the manifests; the destination commits only once every
   byte is in (a bundle's bundle.json written last, a runtime's image tagged, a registry's manifest pushed);
8. on any failure the source is cancelled and the destination aborts: nothing half-written stays.

No verb plans: each builds its two ends and calls `copy(source, destination)`.
Signing and printing are the verb's, after the copy. Python 3.7: the offline side (load) runs through this too.
"""

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, FrozenSet, Generic, Optional, Tuple, TypeVar

from ..errors import ImgtoolError
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

        def has(self) -> "FrozenSet[Digest]":
            """Every blob (layers and configs) it can hand over; called after `images`."""

        def start(self, plan: "Plan[Any]") -> None:
            """Begin producing exactly `plan.moves`, in that order (a registry: the download thread)."""

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
    DD = TypeVar("DD")

    class Destination(Protocol[DD, R]):
        what: str

        def plan(self, images: "Sequence[PulledImage]") -> "Holding[DD]":
            """What it takes of `images`, in its order, what it holds already, and its own planned data; raises
            ImgtoolError (what it cannot take: a platform, a delta's base)."""

        def before(self, plan: "Plan[DD]") -> None:
            """Its checks once what moves is known, before the first byte (space, zstd); raises ImgtoolError."""

        def write(self, plan: "Plan[DD]", source: "Source") -> R:
            """Every blob of the plan and the manifests, committed; raises ImgtoolError with nothing committed."""

        def abort(self) -> None:
            """Remove what `write` began (called on every failure, including before `write`)."""


D = TypeVar("D")


@dataclass(frozen=True)
class Holding(Generic[D]):
    """What a destination states before a blob moves. `destination`: its own planned data, handed back to its
    `before` and `write` (a bundle's `bundle_dest.Bundled`, a registry's `registry_dest.Pushing`, a runtime's
    `runtime_dest.Landing`)."""

    images: Tuple[PulledImage, ...]  # the images it takes (a runtime: its platform's)
    order: Tuple[Digest, ...]  # every blob it takes, in the order it takes them
    held: FrozenSet[Digest]  # of those, what it holds already (a delta's base, a registry's blobs): never read
    destination: D
    # where the destination wants layer blobs written (a bundle's unfinished archive, bundle/regions.py): a source
    # that downloads writes them there instead of its cache, and the destination reads them back only to hash
    regions: Optional["Regions"] = None
    # the destination cannot check the layers' diff_ids itself (a Podman whose records cannot be read): a source
    # that can hashes each layer's unpacked bytes as it streams, and fails the copy on a mismatch
    diff_ids: bool = False


@dataclass(frozen=True)
class Plan(Generic[D]):
    """What a copy moves, decided by `bind` before the first blob byte is read."""

    images: Tuple[PulledImage, ...]
    moves: Tuple[Digest, ...]  # the blobs read from the source, in the destination's order: nothing else is
    held: FrozenSet[Digest]  # what the destination holds already
    destination: D
    regions: Optional["Regions"] = None
    diff_ids: bool = False


class Unheld(ImgtoolError):
    """The destination needs a blob it does not hold and the source does not have (a delta bundle's base)."""


def bind(holding: Holding[D], has: FrozenSet[Digest], source: str, destination: str) -> Plan[D]:
    """What moves: the destination's order less what it holds; raises Unheld when the source lacks one of them."""
    moves = tuple(d for d in dict.fromkeys(holding.order) if d not in holding.held)
    lacking = [d for d in moves if d not in has]
    if lacking:
        n = f"{len(lacking)} blob" + ("s" if len(lacking) > 1 else "")
        raise Unheld(f"{source} lacks {n} {destination} needs and does not hold "
                     f"(first: {lacking[0]}); nothing was copied",
                     hint="copy the full source, or the base it was cut against first")
    return Plan(holding.images, moves, holding.held, holding.destination, holding.regions, holding.diff_ids)


T = TypeVar("T")


@dataclass
class Copied(Generic[D, T]):
    plan: "Plan[D]"
    result: T
    stats: Any  # the source's


# a layer transform: the plan (images with their rewritten layers), given the source to read the old ones from
Transform = Callable[["Plan[D]", "Source"], "Plan[D]"]


def copy(source: "Source", destination: "Destination[D, T]",
         transform: "Optional[Callable[[Plan[D], Source], Plan[D]]]" = None) -> "Copied[D, T]":
    """The one copy: images → what the destination holds → what moves (bound) → its checks → blobs (transformed) →
    manifests → commit; on any failure the source is cancelled and the destination aborted. Raises ImgtoolError."""
    started = False
    try:
        holding = destination.plan(source.images())
        plan = bind(holding, source.has(), source.what, destination.what)
        destination.before(plan)
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
