"""A bundle's models as modelcar images (modelcar.py): a pipeline source whose layers are framed, as they pass, from
the raw files the bundle stores once (bundle → runtime: `imgtool load` of a model as an image).

Each model that records its modelcar form (bundle.json `files[].modelcar`) is one image, named
`models.local/HUB/org/name:COMMIT-modelcar` (catalog.model_repository + modelcar.tag), for the runtime's platform
only (its manifest and config are modelcar.image's for that platform: a runtime holds the one platform's image as
it holds an image's). A layer is `modelcar.layer_chunks`: the ustar head, the raw member's bytes read forward from
the archive's one checked reader (ends/bundle_stream.py: every header, every member's sha256 deferred to `settle`,
padding, the trailer, every part), the padding and the tar's end. The runtime destination holds the last bytes back
until `settle` returned, so a damaged part cuts the upload and the runtime registers nothing; containerd and Docker
also check each layer against its diff_id (the recorded modelcar digest) while they unpack.

The destination asks for the layers in `order`: the archive's order of the raw members (the forward read never
goes back). A delta bundle's model leaves out the files the host held by sha256 (an inventory's, its modelcars'
too): their layers are not framed here but `reused`, the runtime's own (a layer is a pure function of the path and
bytes, so the base revision's modelcar holds it where the path is the same; load checks it does, on a runtime whose
import takes an archive without them: containerd).
A file whose bytes another path of the models also names (same sha256, another path: another layer)
cannot be framed twice from one forward read and is refused (place such a model's files instead). Python 3.7: the
pyz imports modelcars through this.
"""

from pathlib import Path
from typing import TYPE_CHECKING, Dict, FrozenSet, Iterator, List, Optional, Tuple

from .. import modelcar
from ..bundle import catalog, layout
from ..bundle.archive import Behind
from ..bundle.format import BundleIndex, BundleModel, ModelEntry
from ..errors import ImgtoolError, UsageError
from ..model import Digest, ImageConfig, ImageRef, Manifest, Platform, PulledImage, parse_manifest
from .bundle_stream import ArchiveSource

if TYPE_CHECKING:
    from ..pipeline import Plan

HINT_FILES = "load with --models hf (or --models modelscope, --models-dir DIR) to place the model's files instead"


def modelcar_name(model: BundleModel) -> str:
    """`models.local/HUB/org/name:COMMIT-modelcar`; raises UsageError when the model's name is none a registry
    takes."""
    repo = catalog.model_repository(model)
    if repo is None:
        raise UsageError(f"{model.ref}: its name is not one an image can have, so it has no modelcar name",
                         hint=HINT_FILES)
    return f"{catalog.MODEL_REGISTRY}/{repo}:{modelcar.tag(model.commit)}"


def carries_modelcars(index: BundleIndex) -> bool:
    """Every model of the bundle records its modelcar form (a bundle without models carries none)."""
    return bool(index.models) and all(m.modelcar() is not None for m in index.models)


class ModelcarSource:
    """The modelcars of `index`'s models for `arch` (linux/ARCH), their layers read from the bundle in `bundle_dir`
    (those of files a delta left out: `reused`, each the (model, file) it frames); raises UsageError for a model
    without the modelcar form or with a name an image cannot have."""

    def __init__(self, bundle_dir: Path, index: BundleIndex, arch: str, jobs: int = 2):
        self.dir, self.index, self.arch, self.jobs = Path(bundle_dir), index, arch, jobs
        self.what = f"bundle {self.dir.name}"
        self.stream: Optional[ArchiveSource] = None
        self._images: List[PulledImage] = []
        self._layers: Dict[Digest, ModelEntry] = {}  # a modelcar layer -> the file it frames
        self.reused: Dict[Digest, Tuple[BundleModel, ModelEntry]] = {}  # a left-out file's layer: the runtime's
        for model in index.models:
            self._images.append(self._image(model))
        slots, _ = layout.arrange(layout.bundle_members(index))
        at = {p.member.digest: i for i, p in enumerate(slots)}
        # the layers in the archive's order of their raw members (a file of no bytes reads nothing: first)
        self.order: Tuple[Digest, ...] = tuple(sorted(self._layers, key=lambda d: at.get(self._layers[d].sha256, -1)))

    def _image(self, model: BundleModel) -> PulledImage:
        car = model.modelcar()
        if car is None:
            raise UsageError(f"{model.ref}: this bundle does not carry its modelcar form (bundle.json records no "
                             "modelcar digest for its files)", hint=HINT_FILES)
        name = modelcar_name(model)
        try:
            manifest_bytes, config_bytes = car.for_platform("linux", self.arch)
        except KeyError:
            raise UsageError(f"{model.ref}: its modelcar has no image for linux/{self.arch}",
                             hint=HINT_FILES) from None
        seen = {(f.sha256, f.size): f for f in self._layers.values()}
        for f in model.files:
            assert f.modelcar is not None
            if f.omitted and f.size:  # no bytes here: the runtime's layer (a file of no bytes is framed as it is)
                self.reused.setdefault(f.modelcar, (model, f))
            elif f.modelcar not in self._layers:
                twin = seen.get((f.sha256, f.size))
                if twin is not None and f.size and twin.path != f.path:
                    raise UsageError(f"{model.ref}: {f.path} holds the same bytes as {twin.path}: a modelcar frames "
                                     "them twice, and the bundle, which stores them once, is read once",
                                     hint=HINT_FILES)
                self._layers[f.modelcar] = f
                seen[(f.sha256, f.size)] = f
        manifest = parse_manifest(manifest_bytes)
        assert isinstance(manifest, Manifest)
        return PulledImage(ref=ImageRef.parse(name), source=self.what, platform=Platform("linux", self.arch),
                           index_digest=car.digest, manifest_digest=Digest.of(manifest_bytes),
                           manifest_bytes=manifest_bytes, manifest=manifest, config_bytes=config_bytes,
                           config=ImageConfig.parse(config_bytes))

    def images(self) -> List[PulledImage]:
        return list(self._images)

    def has(self) -> FrozenSet[Digest]:
        return frozenset(self._layers) | {d for im in self._images for d in (im.manifest_digest, im.image_id)}

    def start(self, plan: "Plan") -> None:
        """The archive's forward read opened when a layer moves."""
        if plan.moves:
            self.stream = ArchiveSource(self.dir, self.index, jobs=self.jobs)

    def path(self, digest: Digest) -> None:
        return None

    def chunks(self, digest: Digest, size: int, what: str) -> Iterator[bytes]:
        """A layer: its head, the raw member's bytes as the archive's reader hands them over (checked there), its
        tail; raises ImgtoolError (not a layer of these modelcars, or behind the read), Cut."""
        f = self._layers.get(digest)
        if f is None:
            raise ImgtoolError(f"{self.what}: blob {digest} ({what}) is no modelcar layer of its models")
        return modelcar.layer_chunks(f.path, f.size, self._raw(f, what))

    def _raw(self, f: ModelEntry, what: str) -> Iterator[bytes]:
        if not f.size:
            return
        assert self.stream is not None, "start() opens the stream before a layer is read"
        slot = self.stream.slots.get(f.sha256)
        if slot is None:
            raise ImgtoolError(f"{self.what}: {f.path} ({what}) is not in its archive")
        try:
            yield from self.stream.archive.blob(slot)
        except Behind:
            raise ImgtoolError(f"{self.what}: {f.path} ({what}) is not ahead in its archive") from None

    def settle(self) -> None:
        """The rest of the archive read and checked, then every member's digest: raises Cut or VerifyError."""
        if self.stream is not None:
            self.stream.settle()

    def cancel(self) -> None:
        self.finish()

    def finish(self) -> None:
        if self.stream is not None:
            self.stream.finish()

