"""A registry as a pipeline destination (push is bundle → registry).

`plan` asks the registry what it holds: a delta's omitted layers must be there already (refused before anything is
sent otherwise), every config and layer of each target repository is asked for (HEAD, once per pair); the blobs it
lacks are taken in the source's order (`prefer`: a compressed bundle hands them over in archive order only).
`write` mounts a blob another repository of this registry holds, uploads the rest read through `source.chunks`
(one PUT when small, PATCH chunks when big: bounded memory), then puts the manifests byte for byte (their digests,
and the image IDs, stay the source's), and for a tag held for several platforms an index over them under the tag.
Nothing is pushed under a tag before every blob is in: an image appears whole or not at all. A bundle's models go
the same way after the images, each as its ModelPack artifact (registry_models.py): its blobs in the plan, its
manifest last.

Target repository = NAMESPACE + the image's repository path without its registry host:
`quay.io/ascend/vllm-ascend:v1` pushed to `reg.local:5000/mirror` becomes `reg.local:5000/mirror/ascend/vllm-ascend:v1`.
"""

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from ..bundle.format import BundleImage, BundleModel, Layer, bundle_images
from ..bundle.layout import platform_index
from ..errors import ImgtoolError, RegistryError
from ..model import Digest, ImageRef, PulledImage, format_size
from ..pipeline import Holding, Plan
from ..progress import Progress
from ..registry import RegistryClient
from .registry_models import (Modelcars, PushedModel, Streamed, check_model_base, model_blobs, model_targets,
                              modelcar_blobs, push_model)

if TYPE_CHECKING:
    from ..pipeline import Blobs, Source

CHUNK = 16 * 1024 * 1024  # blobs above this go up as PATCH chunks of this size (bounded memory)


@dataclass
class PushedImage:
    ref: str
    target: str  # host/repo:tag as `docker pull` takes it
    manifest_digest: str
    platform: str

    def to_json(self) -> dict:
        return {"ref": self.ref, "target": self.target, "manifest_digest": self.manifest_digest,
                "platform": self.platform}


@dataclass
class PushResult:
    registry: str
    scheme: str
    images: List[PushedImage]
    blobs_uploaded: int = 0
    bytes_uploaded: int = 0
    blobs_present: int = 0
    blobs_mounted: int = 0
    seconds: float = 0.0
    warnings: List[str] = field(default_factory=list)
    indexes: List[dict] = field(default_factory=list)  # multi-arch tags: the index pushed for each
    models: List[PushedModel] = field(default_factory=list)  # each model's ModelPack artifact

    def to_json(self) -> dict:
        return {"registry": self.registry, "scheme": self.scheme, "images": [im.to_json() for im in self.images],
                "blobs_uploaded": self.blobs_uploaded, "bytes_uploaded": self.bytes_uploaded,
                "blobs_present": self.blobs_present, "blobs_mounted": self.blobs_mounted,
                "indexes": self.indexes, "models": [m.to_json() for m in self.models],
                "seconds": round(self.seconds, 3), "warnings": self.warnings}

    def describe(self) -> str:
        models = f" and {len(self.models)} model(s)" if self.models else ""
        lines = [f"pushed {len(self.images)} image(s){models} to {self.registry} in {self.seconds:.1f} s: "
                 f"{self.blobs_uploaded} blobs uploaded ({format_size(self.bytes_uploaded)}), "
                 f"{self.blobs_mounted} mounted, {self.blobs_present} already there"]
        width = max((len(im.target) for im in self.images), default=0)
        for im in self.images:
            lines.append(f"  {im.target.ljust(width)}  {im.platform}  {im.manifest_digest}")
        for ix in self.indexes:
            lines.append(f"  {ix['target']}  index over {', '.join(ix['platforms'])}  {ix['digest']}")
        for m in self.models:
            also = f" (also :{', :'.join(m.tags[1:])})" if len(m.tags) > 1 else ""
            lines.append(f"  {m.target}{also}  ModelPack artifact of {m.ref}, {m.files} files, "
                         f"{format_size(m.size)}  {m.manifest_digest}")
        if self.images:
            first = self.indexes[0]["target"] if self.indexes else self.images[0].target
            lines.append("nodes: docker pull " + first)
        return "\n".join(lines)


def target_repository(namespace: str, ref: ImageRef) -> str:
    """NAMESPACE + the image's repository path without the registry host."""
    return f"{namespace}/{ref.repository}" if namespace else ref.repository


@dataclass
class _BlobPlan:
    """The blobs the registry lacks, in push order, and where it holds the others (to mount from)."""

    todo: List[Tuple[str, Digest]] = field(default_factory=list)  # (repository, blob)
    where: Dict[Digest, str] = field(default_factory=dict)  # blob -> a repository of this registry known to hold it
    present: int = 0  # (repository, blob) pairs already there
    sizes: Dict[Digest, int] = field(default_factory=dict)
    cars: Modelcars = field(default_factory=Modelcars)  # the modelcar layers and configs the registry lacks
    read_only: set = field(default_factory=set)  # (repository, raw file) read only to frame its modelcar layers


@dataclass(frozen=True)
class Pushing:
    """A registry destination's planned data (pipeline.Holding.destination): the blobs it lacks per repository, and
    each image with the repository it goes to."""

    blobs: _BlobPlan
    targets: Tuple[Tuple[BundleImage, str], ...]
    models: Tuple[Tuple[BundleModel, str], ...] = ()  # each model's artifact with the repository it goes to
    warnings: Tuple[str, ...] = ()  # models not pushed, and why


@dataclass
class RegistryDestination:
    """`client` reaches `host` over `scheme`; `namespace` prefixes every repository. `omitted`: the layers a delta
    bundle leaves out, per manifest digest (the source's); `models`: the bundle's models, whose ModelPack artifacts
    go after the images (registry_models.py); `prefer`: the order the source hands blobs over in;
    `rewind`: called before blobs are read a second time (a mount the registry refused after the upload: the blob
    is uploaded again); `name` and `to`, for the delta refusal's words."""

    client: RegistryClient
    host: str
    namespace: str
    scheme: str
    progress: Progress
    chunk: int = CHUNK
    omitted: Mapping[Digest, Sequence[Layer]] = field(default_factory=dict)
    prefer: Sequence[Digest] = ()
    rewind: Optional[Callable[[], None]] = None
    name: str = "the bundle"
    to: str = ""
    what: str = "registry"
    models: Sequence[BundleModel] = ()

    def plan(self, images: Sequence[PulledImage]) -> "Holding[Pushing]":
        """Every config and layer (and model artifact blob), in the source's order, and what the registry holds of
        them (HEAD, per target repository; a delta's omitted layers and model files, which it must hold); raises
        ImgtoolError (a delta whose omitted layers or files the registry lacks: nothing is pushed), RegistryError."""
        targets = [(im, target_repository(self.namespace, im.image_ref)) for im in self._bundle_images(images)]
        models, warnings = model_targets(self.models, self.namespace)
        self._check_delta_base(targets)
        check_model_base(self.client, models, self.host, self.name, self.to)
        blobs = _plan_blobs(self.client, targets)
        _plan_model_blobs(self.client, models, blobs)
        _plan_modelcars(self.client, models, blobs)
        at = {d: i for i, d in enumerate(self.prefer)}
        blobs.todo.sort(key=lambda pair: at.get(pair[1], len(at)))  # stable: one digest's repositories stay in order
        every = sorted(blobs.sizes, key=lambda d: at.get(d, len(at)))
        lacking = {d for _, d in blobs.todo}
        # held: what every target repository has, and a delta's omitted layers (checked above: there)
        return Holding(tuple(images), tuple(every), frozenset(d for d in every if d not in lacking),
                       Pushing(blobs, tuple(targets), tuple(models), tuple(warnings)))

    def before(self, plan: "Plan[Pushing]") -> None:
        """Nothing more: a delta's base was checked with what the registry holds."""

    def _bundle_images(self, images: Sequence[PulledImage]) -> List[BundleImage]:
        """bundle.json's view of the images, with the layers the source leaves out marked so."""
        out = []
        for im in bundle_images(images):
            left_out = {x.digest: x for x in self.omitted.get(im.manifest_digest, ())}
            if left_out:
                im = replace(im, layers=tuple(left_out.get(x.digest, x) for x in im.layers))
            out.append(im)
        return out

    def _check_delta_base(self, targets: List[Tuple[BundleImage, str]]) -> None:
        """A delta bundle lacks some layers: the registry must hold them already (the base pushed before);
        raises ImgtoolError before anything is pushed."""
        missing = [(repo, layer) for im, repo in targets for layer in im.omitted
                   if not self.client.has_blob(repo, layer.digest)]
        if not missing:
            return
        names = list(dict.fromkeys(n for _, layer in missing for n in layer.provided_by[:1]))
        repo, first = missing[0]
        raise ImgtoolError(f"cannot push {self.name}: it is a delta bundle and {self.host}/{repo} lacks "
                           f"{len(missing)} of the layers it leaves out (first: {first.digest.short}); "
                           "nothing was pushed",
                           hint=f"push the bundle of {', '.join(names)} to {self.to} first, or fetch a full bundle")

    def write(self, plan: "Plan[Pushing]", source: "Source") -> PushResult:
        """Every blob the registry lacks, then the manifests (and indexes); raises RegistryError, VerifyError (a
        blob damaged in the source: no manifest naming it is pushed)."""
        blobs, targets = plan.destination.blobs, list(plan.destination.targets)
        result = PushResult(self.host, self.scheme, [])
        result.blobs_present = blobs.present
        self._push_blobs(source, blobs, result)
        source.settle()  # what the source defers (a compressed bundle: its archive to the end) before a manifest goes
        for repo, images in _by_tag(targets):
            self._push_manifests(repo, images, {im.manifest_digest: im for im in plan.images}, result)
        for model, repo in plan.destination.models:  # every blob of it is in: its manifest, last
            result.models.append(push_model(self.client, self.host, repo, model,
                                            car=model.ref not in blobs.cars.skipped))
        result.warnings.extend(plan.destination.warnings)
        result.warnings.extend(blobs.cars.skipped.values())
        return result

    def abort(self) -> None:
        """Blobs uploaded stay (a registry collects the unreferenced ones); no manifest was pushed."""

    def _push_blobs(self, source: "Blobs", plan: _BlobPlan, result: PushResult) -> None:
        """Each blob of the plan mounted from another repository of this push when one holds it, else uploaded; a
        mount refused after this push uploaded the blob is uploaded again at the end, read in a second pass."""
        again: List[Tuple[str, Digest, str]] = []
        read = set()
        with self.progress.bar(sum(plan.sizes[d] for _, d in plan.todo), "push") as bar:
            for repo, digest in plan.todo:
                url = None
                holder = plan.where.get(digest)
                if holder and holder != repo and digest not in plan.cars.frames:
                    url = self.client.mount_blob(repo, digest, holder)  # None: mounted; else where to upload instead
                    if url is None:
                        result.blobs_mounted += 1
                        bar.update(plan.sizes[digest])
                        continue
                    if digest in read:  # its bytes went by: read once more, after the rest
                        again.append((repo, digest, url))
                        continue
                self._upload(source, repo, digest, plan.sizes[digest], url, bar, result,
                             plan.cars.frames.pop(digest, []), (repo, digest) in plan.read_only)
                read.add(digest)
                plan.where.setdefault(digest, repo)
            for repo, digest, config in plan.cars.configs:
                self.client.finish_upload(repo, self.client.start_upload(repo), digest, config)
                result.blobs_uploaded += 1
                result.bytes_uploaded += len(config)
            if again and self.rewind is not None:
                self.rewind()
            for repo, digest, url in again:
                self._upload(source, repo, digest, plan.sizes[digest], url, bar, result)

    def _upload(self, source: "Blobs", repo: str, digest: Digest, size: int, url: Optional[str], bar,
                result: PushResult, frames=(), read_only: bool = False) -> None:
        """Upload one blob read through the source: one PUT when small, PATCH chunks then PUT when big; the PUT that
        commits it is sent only once the source checked the whole blob against its digest. `frames`: the modelcar
        layers of this raw file, uploaded beside it as its bytes pass (head, bytes, tail); `read_only`: the raw file
        is there already, only its layers are uploaded."""
        what = f"blob {digest.short} for {self.host}/{repo}"
        uploads = [] if read_only else [Streamed(self.client, repo, digest, size, self.chunk, url)]
        framed = [Streamed(self.client, f.repo, f.digest, f.size, self.chunk) for f in frames]
        for up, f in zip(framed, frames):
            up.feed(f.head)
        for data in source.chunks(digest, size, what):
            for up in uploads + framed:
                up.feed(data)
            bar.update(len(data))
        # the digest was checked when `chunks` ended: only now is each upload committed
        for up, f in zip(framed, frames):
            up.feed(f.tail)
            up.finish()
            result.blobs_uploaded += 1
            result.bytes_uploaded += f.size
        for up in uploads:
            up.finish()
            result.blobs_uploaded += 1
            result.bytes_uploaded += size

    def _push_manifests(self, repo: str, images: List[BundleImage], pulled: Dict[Digest, PulledImage],
                        result: PushResult) -> None:
        """The manifests of one tag: a single platform under the tag; several by digest, then an index under the
        tag."""
        tag = images[0].image_ref.tag
        index_tag = tag if len(images) > 1 else None
        for im in images:
            self._push_manifest(repo, im, pulled[im.manifest_digest].manifest_bytes,
                                tag if tag and index_tag is None else None, result)
        if index_tag is not None:
            self._push_index(repo, index_tag, images, result)

    def _push_manifest(self, repo: str, im: BundleImage, data: bytes, tag: Optional[str], result: PushResult) -> None:
        """One platform manifest, byte for byte, under `tag` or else its digest; raises RegistryError when the
        registry stores it under another digest."""
        host = self.host
        reference = tag or str(im.manifest_digest)
        got = self.client.put_manifest(repo, reference, data, im.manifest_media_type)
        if got is not None and got != im.manifest_digest:
            raise RegistryError(f"{host}/{repo}: the registry stored the manifest as {got}, "
                                f"not {im.manifest_digest}")
        target = f"{host}/{repo}{':' if tag else '@'}{reference}"
        result.images.append(PushedImage(im.ref, target, str(im.manifest_digest), str(im.platform)))
        if im.upstream is not None:  # fetch rewrote layers: the bundle holds its own manifest
            theirs = Digest.parse(im.upstream["manifest_digest"])
            result.warnings.append(
                f"{target} ({im.platform}) is the manifest this bundle holds: fetch rewrote "
                f"its layers (--layers {im.upstream['layers']}), so its digest {im.manifest_digest.short} differs "
                f"from upstream's {theirs.short}; the image ID (config) is upstream's")

    def _push_index(self, repo: str, tag: str, images: List[BundleImage], result: PushResult) -> None:
        """An index over the platforms of a multi-arch tag, under the tag (layout.platform_index, as `serve` answers
        it)."""
        host = self.host
        media, body = platform_index(images)
        digest = self.client.put_manifest(repo, tag, body, media) or Digest.of(body)
        upstream = images[0].index_digest
        result.indexes.append({"target": f"{host}/{repo}:{tag}", "digest": str(digest),
                               "platforms": [str(im.platform) for im in images],
                               "upstream_index_digest": str(upstream) if upstream else None})
        if upstream and str(upstream) != str(digest):
            result.warnings.append(
                f"{host}/{repo}:{tag} is an index over the {len(images)} platforms in the bundle; its digest "
                f"{digest.short} differs from upstream's {upstream.short} (pull by tag, or by "
                "the platform manifest digests" + (")" if any(im.upstream for im in images) else
                                                  ", which are upstream's)"))


def _plan_blobs(client: RegistryClient, targets: List[Tuple[BundleImage, str]]) -> _BlobPlan:
    """Ask the registry (HEAD) for each config and layer of each target repository, once per pair."""
    plan = _BlobPlan()
    seen = set()
    for im, repo in targets:
        plan.sizes[im.image_id] = im.config_size
        plan.sizes.update((x.digest, x.size) for x in im.layers)
        for digest in [im.image_id] + [x.digest for x in im.layers if not x.omitted]:
            if (repo, digest) in seen:
                continue
            seen.add((repo, digest))
            if client.has_blob(repo, digest):
                plan.present += 1
                plan.where.setdefault(digest, repo)
            else:
                plan.todo.append((repo, digest))
    return plan


def _plan_model_blobs(client: RegistryClient, models: Sequence[Tuple[BundleModel, str]], plan: _BlobPlan) -> None:
    """Ask the registry (HEAD) for each blob of each model's artifact in its repository, once per pair."""
    for repo, digest, size in model_blobs(models):
        plan.sizes[digest] = size
        if client.has_blob(repo, digest):
            plan.present += 1
            plan.where.setdefault(digest, repo)
        else:
            plan.todo.append((repo, digest))


def _plan_modelcars(client: RegistryClient, models: Sequence[Tuple[BundleModel, str]], plan: _BlobPlan) -> None:
    """The modelcar layers and configs the registry lacks; a raw file the registry holds whose layer it lacks is
    read all the same (its layer is framed around its bytes), not uploaded."""
    plan.cars = modelcar_blobs(client, models)
    plan.present += plan.cars.present
    queued = {d for _, d in plan.todo}
    for raw, frames in plan.cars.frames.items():
        if raw not in queued:
            plan.todo.append((frames[0].repo, raw))
            plan.read_only.add((frames[0].repo, raw))


def _by_tag(targets: List[Tuple[BundleImage, str]]) -> List[Tuple[str, List[BundleImage]]]:
    """(repository, the images of one tag there): one image, or one per platform of a multi-arch tag."""
    groups: Dict[Tuple[str, str], List[BundleImage]] = {}
    for im, repo in targets:
        groups.setdefault((repo, im.ref), []).append(im)
    return [(repo, images) for (repo, _ref), images in groups.items()]
