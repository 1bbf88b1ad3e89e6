"""A bundle directory as a pipeline destination: what the offline side holds (a delta: `--have`, `--base`) is
skipped, the layers are taken in the archive's order, and `bundle.writer` writes the parts, SHA256SUMS, load.sh,
README.txt and bundle.json last (a bundle without bundle.json is not one: nothing half-written looks complete)."""

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Dict, Optional, Sequence, Set, Tuple

from .. import gz
from ..bundle import writer
from ..bundle.format import BundleModel, bundle_images
from ..delta import DeltaPlan, Have, Inventory, have_from_inventory
from ..errors import UsageError
from ..fsutil import NotRegularFile, open_regular
from ..model import Descriptor, Digest, PulledImage
from ..pipeline import Holding, Plan
from ..progress import Progress

if TYPE_CHECKING:
    from ..bundle.format import BundleModel
    from ..bundle.regions import Regions
    from ..bundle.writer import BundleResult
    from ..pipeline import Blobs


@dataclass(frozen=True)
class Bundled:
    """A bundle destination's planned data (pipeline.Holding.destination): what a layer transform tells the writer."""

    gzipped_layers: bool = False  # layers were gzipped on the way (rewritten zstd, a save): bundle.json says by what
    before_seal: Optional[Callable[[], Optional[Dict[Digest, int]]]] = None  # run once every byte is written, before the parts get names


@dataclass
class BundleDestination:
    output: Path
    progress: Progress
    chunk_size: Optional[int] = None
    compress: str = "none"
    force: bool = False
    gzip: Optional["gz.Gzip"] = None
    delta: Optional[DeltaPlan] = None  # what the offline side holds: its layers are left out
    created: Optional[str] = None
    extra_files: Dict[str, Path] = field(default_factory=dict)  # imgtool.pyz
    what: str = "bundle"
    # the layers' regions in the uncompressed archive go into the plan (bundle/regions.py): a downloading source
    # writes each there, once; the caller makes the directory ready (writer.prepare_regions) under its lock
    place: bool = False
    regions: Optional["Regions"] = None
    # the verb's check once what moves is known, before the first byte (fetch: the free space of its cache and the
    # output, which depends on what --layers rewrites)
    check: Optional[Callable[["Plan[Bundled]"], None]] = None
    # the models the bundle carries (format.bundle_model): their files' members follow the images', taken in that
    # order from the source as layers are
    models: Sequence[BundleModel] = ()
    # hash each carried model file's modelcar layer as its bytes pass (fetch; a copy keeps what its source records)
    modelcar: bool = False

    def plan(self, images: Sequence[PulledImage]) -> "Holding[Bundled]":
        """Every layer in the archive's order; a delta's left-out layers held (never read). Raises UsageError (the
        output directory)."""
        writer.check_output_dir(self.output, self.force)
        skip = not_carried(images, self.delta, self.progress) if self.delta is not None else set()
        if self.place and self.compress == "none":
            self.regions = writer.regions_for(writer.plan_bundle(self.output, images, self.delta,
                                                               chunk_size=self.chunk_size, compress=self.compress,
                                                               models=self.models))
        order = writer.archive_order(images, self.delta) + writer.model_order(self.models)
        return Holding(tuple(images), tuple(order), frozenset(skip), Bundled(), regions=self.regions)

    def before(self, plan: "Plan[Bundled]") -> None:
        """The verb's check (space), then the unfinished archive made ready for the layers downloaded into it (the
        caller holds the output's lock); raises ImgtoolError."""
        if self.check is not None:
            self.check(plan)
        if plan.regions is not None:
            writer.prepare_regions(plan.regions, self.force)

    def write(self, plan: "Plan[Bundled]", source: "Blobs") -> "BundleResult":
        """The bundle written, bundle.json last; raises ImgtoolError with no bundle.json written."""
        try:
            return writer.write_bundle(self.output, plan.images, source, chunk_size=self.chunk_size,
                                       compress=self.compress, force=self.force, progress=self.progress,
                                       gzip=self.gzip, gzipped_layers=plan.destination.gzipped_layers,
                                       delta=self.delta, created=self.created, extra_files=self.extra_files,
                                       before_seal=plan.destination.before_seal, regions=plan.regions,
                                       models=self.models, modelcar_layers=self.modelcar)
        finally:
            if plan.regions is not None:
                plan.regions.close()

    def abort(self) -> None:
        """write_bundle removes what it wrote on every failure; before it, nothing was. Blobs slots in the
        unfinished archive stay there with their records: the same command run again resumes."""
        if self.regions is not None:
            self.regions.close()


def not_carried(images: Sequence[PulledImage], delta: DeltaPlan, progress: Progress) -> Set[Digest]:
    """The layer blobs a delta leaves out of every image (none needs them): never read from the source."""
    planned = bundle_images(images, delta)
    omitted = {x.digest for im in planned for x in im.layers if x.omitted}
    skip = omitted - {x.digest for im in planned for x in im.layers if not x.omitted}
    if skip:
        progress.note(f"delta against {delta.have.what}: {len(skip)} layers are already on the offline side "
                      "and are not downloaded")
    return skip


def read_have(inventory: Optional[Path], base: Optional[Path]) -> Tuple[Optional[Have], Optional[dict]]:
    """The chains the offline side holds, from `--have FILE` and/or `--base DIR` (its bundle.json checked against
    SHA256SUMS as verify does); raises UsageError/VerifyError."""
    from ..bundle.verify import read_checked_index

    have: Optional[Have] = None
    described = []
    if inventory is not None:
        path = Path(inventory)
        try:
            with open_regular(path) as f:
                data = f.read()
        except NotRegularFile as e:
            raise UsageError(f"the inventory {path} is not a regular file ({e.kind})") from None
        except OSError as e:
            raise UsageError(f"cannot read the inventory {path}: {e.strerror or e}",
                             hint="write it on the offline host with `imgtool inventory -o FILE`") from e
        have = have_from_inventory(Inventory.from_bytes(data, str(path)), f"inventory {path.name}")
        described.append(("inventory", path.name))
    if base is not None:
        index = read_checked_index(Path(base), "base")  # an edited bundle.json would decide what is left out
        from_bundle = Have(f"base bundle {Path(base).name}")
        for im in index.images:
            from_bundle.add([x.diff_id for x in im.layers], im.ref, str(im.platform))
            from_bundle.add_blobs([x.diff_id for x in im.layers],
                                  [Descriptor(x.media_type, x.digest, x.size) for x in im.layers])
        for m in index.models:  # every file, those the base left out too: the offline side held them then
            from_bundle.add_model(m.ref, (f.sha256 for f in m.files))
            from_bundle.add_modelcar_layers((f.sha256, f.path, f.modelcar) for f in m.files if f.modelcar)
        if have is None:
            have = from_bundle
        else:
            have.merge(from_bundle)
        described.append(("bundle", Path(base).name))
    if have is None:
        return None, None
    kind = "+".join(k for k, _ in described)
    return have, {"kind": kind, "name": " + ".join(n for _, n in described)}
