"""What `imgtool serve` may hand out: repositories, tags, manifests and blobs of bundles, by name and digest.

A pure function of bundle.json (no I/O): each blob is a digest at a known offset of the archive
(layout.place), cut into spans of the part files that hold it. Nothing that bundle.json does not
name is ever mapped to bytes: a request names a repository and a digest or tag, never a path.
"""

import bisect
import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple, Union

from .. import modelcar
from ..model import OCI_INDEX, OCI_MANIFEST, Digest, is_attestation
from . import layout
from .format import BundleImage, BundleIndex, BundleModel, UpstreamIndex

DIGEST = re.compile(r"sha256:[0-9a-f]{64}\Z")  # matched whole: `$` lets a final newline through
TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}\Z")
# a repository name as a request may give it: path components, the first possibly a registry host[:port]
_COMPONENT = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?(?::[0-9]{1,5})?\Z")
_DOCKER_HUB = ("docker.io", "index.docker.io", "registry-1.docker.io")
# a model's ModelPack artifact is served, and pushed, as MODEL_REGISTRY/HUB/org/name: a registry name of no real
# registry (a node reaches it only through the mirror serve's node configuration names), the hub first so that
# hf: and modelscope: models of one ORG/NAME never meet
MODEL_REGISTRY = "models.local"
# a path component as Docker distribution and containerd's reference parser take it (lowercase only)
_DISTRIBUTION_COMPONENT = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*\Z")


def valid_name(name: str) -> bool:
    """Whether a repository name of a request is well-formed (no `..`, no empty or absolute component)."""
    parts = name.split("/")
    return 0 < len(name) <= 512 and ".." not in name and all(_COMPONENT.match(p) for p in parts)


def model_repository(model: BundleModel) -> Optional[str]:
    """The repository path a model's artifact is served and pushed under: HUB/org/name, lowercased (registries
    refuse capitals); None when the name is still not one a registry takes (a trailing `-`, `._`)."""
    return hub_repository(model.model_ref.hub, model.model_ref.repo)


def hub_repository(hub: str, repo: str) -> Optional[str]:
    """`model_repository` of a hub's ORG/NAME."""
    path = f"{hub}/{repo.lower()}"
    return path if all(_DISTRIBUTION_COMPONENT.match(c) for c in path.split("/")) else None


def modelcar_reference(hub: str, repo: str, commit: str) -> Optional[str]:
    """The name a model commit's modelcar image has in a runtime and from serve
    (`models.local/hf/org/name:COMMIT-modelcar`), or None when the model's name or commit cannot be one."""
    path = hub_repository(hub, repo)
    tag = modelcar.tag(commit)
    return f"{MODEL_REGISTRY}/{path}:{tag}" if path is not None and TAG.match(tag) else None


def model_tags(model: BundleModel) -> List[str]:
    """The tags of a model's artifact: the commit, then the revision as asked (the hub's default branch when none
    was), each when it is a valid tag (a branch `feature/x` is not)."""
    ref = model.model_ref
    return [t for t in dict.fromkeys([model.commit, ref.revision or ref.default_revision]) if TAG.match(t)]


def _registry(host: str) -> str:
    return "docker.io" if host in _DOCKER_HUB else host


@dataclass(frozen=True)
class Span:
    """A piece of a blob: `length` bytes at `offset` of part `part` of bundle `bundle` (0-based)."""

    bundle: int
    part: int
    offset: int
    length: int


@dataclass(frozen=True)
class Blob:
    """A blob the bundles hold: where it lies in the archive of which bundle, and what it is."""

    digest: Digest
    size: int
    bundle: int
    start: int  # offset of its data in the (uncompressed) archive
    what: str  # for messages: "layer 3 of quay.io/ascend/vllm-ascend:v1"
    media_type: str


@dataclass(frozen=True)
class Framed:
    """A modelcar layer (modelcar.py): a model file's bytes (the raw blob `raw`) between its tar head and tail, served
    from the raw file, never stored."""

    digest: Digest
    raw: Digest
    head: bytes
    tail: bytes
    raw_size: int

    @property
    def size(self) -> int:
        return len(self.head) + self.raw_size + len(self.tail)


@dataclass(frozen=True)
class ServedManifest:
    """A manifest a repository answers: a platform manifest the parts hold, or (`data`) an index: upstream's, as
    bundle.json keeps it, or the index over the platforms of a tag held for several, generated from bundle.json
    (layout.platform_index)."""

    digest: Digest
    media_type: str
    platform: str  # "index" for a generated index, "upstream index" for upstream's
    data: Optional[bytes] = None


@dataclass
class Repository:
    """One repository (registry host + path) as the bundles hold it."""

    registry: str
    path: str
    tags: Dict[str, List[Digest]] = field(default_factory=dict)  # several: one per platform of a multi-arch tag
    manifests: Dict[Digest, ServedManifest] = field(default_factory=dict)
    blobs: set = field(default_factory=set)  # digests of its configs, layers and manifests
    indexes: Dict[str, Digest] = field(default_factory=dict)  # a tag answered with an index -> that index
    upstream: Dict[Digest, str] = field(default_factory=dict)  # upstream's index digest -> the tag it was
    kept: Dict[Digest, UpstreamIndex] = field(default_factory=dict)  # upstream's indexes whose bytes bundles keep
    lacking: Dict[Digest, str] = field(default_factory=dict)  # an entry of a kept index the bundles lack -> what

    def resolve(self, tag: str) -> Optional[Digest]:
        """The manifest a tag names: upstream's index, the index over its platforms, or its platform manifest;
        None: no such tag."""
        digests = self.tags.get(tag)
        if not digests:
            return None
        return self.indexes.get(tag) or digests[0]

    def why_missing(self, digest: Digest) -> str:
        """Why the repository answers no manifest by this digest, for the 404's message."""
        if digest in self.lacking:
            return f"{self.name}@{digest} is {self.lacking[digest]}, which the bundles served here do not hold"
        if digest in self.upstream:
            tag = self.upstream[digest]
            if digest in self.kept:  # kept, but every manifest it lists was rewritten at fetch (images[].upstream)
                return (f"{self.name}@{digest} is upstream's index of tag {tag}, whose manifests the bundles do not "
                        f"hold (fetch rewrote their layers): pull {self.name}:{tag} (here {self.resolve(tag)})")
            return (f"{self.name}@{digest} is upstream's index of tag {tag}, which the bundles do not keep (they "
                    f"hold its platform manifests): pull {self.name}:{tag} (here {self.resolve(tag)}), or a platform "
                    "manifest by digest")
        return f"{self.name} has no manifest {digest} in the bundles served here"

    def served_upstream(self, digest: Digest) -> bool:
        """Whether upstream's index of this digest is answered (the bundles hold at least one entry of it)."""
        found = self.manifests.get(digest)
        return found is not None and found.platform == UPSTREAM

    @property
    def name(self) -> str:
        return f"{self.registry}/{self.path}"


UPSTREAM = "upstream index"  # ServedManifest.platform of upstream's index, as bundle.json keeps it


def _whole_upstream(images: Sequence[BundleImage], kept: Dict[Digest, UpstreamIndex]) -> Optional[UpstreamIndex]:
    """Upstream's index a tag's images all came from, when this bundle keeps it and holds every manifest it lists
    (attestations included: a client copying every entry, skopeo copy --all, must find each); else None."""
    digests = {im.index_digest for im in images}
    only = digests.pop() if len(digests) == 1 else None
    found = kept.get(only) if only is not None else None
    if found is None or not {e.digest for e in found.entries} <= {im.manifest_digest for im in images}:
        return None
    return found


def _answer_upstream(repo: Repository) -> None:
    """Upstream's indexes answered by digest: each one the repository holds an entry of (by manifest digest: a
    manifest fetch rewrote is another); the entries it lacks are named for the 404 a client following them gets."""
    for digest, upstream in repo.kept.items():
        entries = upstream.entries
        if not any(e.digest in repo.manifests for e in entries):
            continue
        repo.manifests.setdefault(digest, ServedManifest(digest, upstream.media_type, UPSTREAM, upstream.data))
        tag = repo.upstream.get(digest)
        of = f"upstream's index {digest}" + (f" (tag {tag})" if tag else "")
        for e in entries:
            if e.digest not in repo.manifests:
                what = "an attestation manifest" if is_attestation(e) else \
                    f"the {e.platform} manifest" if e.platform else "a manifest"
                repo.lacking.setdefault(e.digest, f"{what} of {of}")


class Catalog:
    """The repositories, and every blob's place, of one or more bundles (the first wins a digest)."""

    def __init__(self, indexes: Sequence[BundleIndex]):
        self.indexes = list(indexes)
        self.repositories: Dict[Tuple[str, str], Repository] = {}
        self.blobs: Dict[Digest, Blob] = {}
        self.conflicts: List[str] = []  # tags two bundles hold differently: the first bundle's is served
        self.models: List[Tuple[BundleModel, Optional[str]]] = []  # each model, and its repository's name (None: unnamed)
        self.small: Dict[Digest, bytes] = {}  # blobs made from bundle.json, not in the parts: modelcar configs
        self.framed: Dict[Digest, Framed] = {}  # modelcar layers: streamed from their raw files
        self._starts: List[List[int]] = []
        self._sizes: List[List[int]] = []  # each bundle's files the blobs lie in: its parts, or its unpacked archive
        for b, index in enumerate(self.indexes):
            self._add(b, index)
        for repo in self.repositories.values():  # after every bundle: an entry one lacks, another may hold
            _answer_upstream(repo)

    def _add(self, b: int, index: BundleIndex) -> None:
        self._add_blobs(b, index)
        seen: Dict[Tuple[str, str, str], List[BundleImage]] = {}
        kept = {x.digest: x for x in index.upstream_indexes}
        for image in index.images:
            self._add_image(image, kept, seen)
        for (registry, path, tag), images in seen.items():
            self._add_tag(self.repositories[(registry, path)], tag, images, kept)
        for model in index.models:
            self._add_model(model)

    def _add_model(self, model: BundleModel) -> None:
        """A model's artifact: its manifest under the commit and the revision (model_tags), its config and the files
        the bundle carries (a delta's omitted files are not served)."""
        path = model_repository(model)
        if path is None:
            self.models.append((model, None))
            return
        repo = self.repositories.setdefault((MODEL_REGISTRY, path), Repository(MODEL_REGISTRY, path))
        self.models.append((model, repo.name))
        repo.manifests.setdefault(model.manifest_digest, ServedManifest(model.manifest_digest, OCI_MANIFEST, "model"))
        repo.blobs.update([model.manifest_digest, model.config_digest] + [f.sha256 for f in model.carried])
        for tag in model_tags(model):
            if tag in repo.tags and repo.tags[tag] != [model.manifest_digest]:
                self.conflicts.append(f"{repo.name}:{tag}")
            else:
                repo.tags[tag] = [model.manifest_digest]
        car = model.modelcar()
        if car is not None:
            self._add_modelcar(repo, model, car)

    def _add_modelcar(self, repo: "Repository", model: BundleModel, car: "modelcar.Modelcar") -> None:
        """The model's modelcar image beside its artifact (issue 49): its index under each artifact tag with
        `-modelcar` after it, its platform manifests and configs (made from bundle.json), and a layer per carried
        file, framed around the raw file's bytes as it is sent."""
        repo.manifests.setdefault(car.digest, ServedManifest(car.digest, OCI_INDEX, "modelcar index", car.index))
        platforms = []
        for os_, arch, manifest, config in car.manifests:
            digest = Digest.of(manifest)
            repo.manifests.setdefault(digest, ServedManifest(digest, OCI_MANIFEST, f"{os_}/{arch}", manifest))
            platforms.append(digest)
            self.small.setdefault(Digest.of(config), config)
            repo.blobs.add(Digest.of(config))
        for f in model.carried:
            assert f.modelcar is not None  # model.modelcar() is None otherwise
            self.framed.setdefault(f.modelcar, Framed(f.modelcar, f.sha256, modelcar.head(f.path, f.size),
                                                      modelcar.tail(f.size), f.size))
            repo.blobs.add(f.modelcar)
        for tag in (modelcar.tag(t) for t in model_tags(model)):
            if not TAG.match(tag):
                continue  # a revision near the length limit: the commit's tag serves it
            if tag in repo.tags and repo.tags[tag] != platforms:
                self.conflicts.append(f"{repo.name}:{tag}")
            else:
                repo.tags[tag], repo.indexes[tag] = platforms, car.digest

    def _add_blobs(self, b: int, index: BundleIndex) -> None:
        """Where bundle `b`'s files start, and where each blob lies in them (the first bundle's copy is served)."""
        # a compressed bundle is served from its archive unpacked into one file (inplace.unpack_archive): one "part"
        sizes = [p.size for p in index.parts] if index.archive.compression == "none" else [index.archive.tar_size]
        starts, pos = [], 0
        for size in sizes:
            starts.append(pos)
            pos += size
        self._starts.append(starts)
        self._sizes.append(sizes)
        slots, _ = layout.arrange(layout.bundle_members(index))
        for p in slots:
            if p.member.kind != "meta" and p.member.digest not in self.blobs:
                self.blobs[p.member.digest] = Blob(p.member.digest, p.member.size, b, p.data_offset, p.member.what,
                                                   p.member.media_type)

    def _add_image(self, image: BundleImage, kept: Dict[Digest, UpstreamIndex],
                   seen: Dict[Tuple[str, str, str], List[BundleImage]]) -> None:
        """The image's manifests and blobs in its repository; its tag noted in `seen` for _add_tag."""
        ref = image.image_ref
        key = (_registry(ref.registry), ref.repository)
        repo = self.repositories.setdefault(key, Repository(*key))
        if image.index_digest in kept:
            repo.kept.setdefault(image.index_digest, kept[image.index_digest])
        twin = layout.oci_manifest(image)
        repo.manifests.setdefault(image.manifest_digest, ServedManifest(image.manifest_digest, image.manifest_media_type,
                                                                  str(image.platform)))
        repo.blobs.add(image.manifest_digest)
        if twin:
            repo.manifests.setdefault(Digest.of(twin), ServedManifest(Digest.of(twin), OCI_MANIFEST, str(image.platform)))
            repo.blobs.add(Digest.of(twin))
        repo.blobs.add(image.image_id)
        repo.blobs.update(x.digest for x in image.layers if not x.omitted)
        if ref.tag:
            seen.setdefault(key + (ref.tag,), []).append(image)

    def _add_tag(self, repo: "Repository", tag: str, images: List[BundleImage], kept: Dict[Digest, UpstreamIndex]) -> None:
        """What `tag` answers: its one manifest, upstream's index where the bundle holds all of it, else an index of
        the platforms held; a tag an earlier bundle holds differently is a conflict (the first is served)."""
        digests = [im.manifest_digest for im in images]
        if tag in repo.tags and repo.tags[tag] != digests:
            self.conflicts.append(f"{repo.name}:{tag}")
            return
        repo.tags[tag] = digests
        for im in images:
            if im.index_digest is not None:
                repo.upstream.setdefault(im.index_digest, tag)
        whole = _whole_upstream(images, kept)
        if whole is not None:  # the bundle holds every manifest upstream's index lists: the tag answers it
            repo.indexes[tag] = whole.digest
        elif len(images) > 1:
            media, data = layout.platform_index(images)
            digest = Digest.of(data)
            repo.indexes[tag] = digest
            repo.manifests.setdefault(digest, ServedManifest(digest, media, "index", data))

    def repository(self, name: str, ns: Optional[str] = None) -> Optional[Repository]:
        """The repository a request names: `ascend/vllm-ascend` (with containerd's `?ns=quay.io`, or alone when
        one registry holds that path), or `quay.io/ascend/vllm-ascend`; None when no bundle holds it."""
        if ns is not None:
            return self.repositories.get((_registry(ns), name))
        first, sep, rest = name.partition("/")
        if sep and ("." in first or ":" in first or first == "localhost"):
            found = self.repositories.get((_registry(first), rest))
            if found is not None:
                return found
        same = [r for (_, path), r in self.repositories.items() if path == name]
        return same[0] if len(same) == 1 else None

    def names(self) -> List[str]:
        """What `_catalog` lists: each repository's path, or registry/path where two registries hold one path."""
        paths = [path for _, path in self.repositories]
        return sorted(path if paths.count(path) == 1 else f"{registry}/{path}"
                      for registry, path in self.repositories)

    def size_of(self, digest: Digest) -> Optional[int]:
        """A blob's size, of whichever kind (in the parts, made from bundle.json, a modelcar layer); None: unknown."""
        blob = self.blobs.get(digest)
        if blob is not None:
            return blob.size
        if digest in self.small:
            return len(self.small[digest])
        framed = self.framed.get(digest)
        return framed.size if framed is not None and framed.raw in self.blobs else None

    def pieces(self, digest: Digest, start: int, end: int) -> List[Union[bytes, Span]]:
        """Bytes [start, end) of a blob the catalog knows (size_of), in order: spans of the part files, and bytes
        (a config made from bundle.json; a modelcar layer's head and tail around its raw file's spans)."""
        if digest in self.blobs:
            return list(self.spans(self.blobs[digest], start, end))
        if digest in self.small:
            return [self.small[digest][start:end]]
        framed = self.framed[digest]
        h, n = len(framed.head), framed.raw_size
        out: List[Union[bytes, Span]] = []
        if start < h:
            out.append(framed.head[start:min(end, h)])
        a, b = max(start - h, 0), min(end - h, n)
        if a < b:
            out += self.spans(self.blobs[framed.raw], a, b)
        if end > h + n:
            out.append(framed.tail[max(start - h - n, 0):end - h - n])
        return out

    def spans(self, blob: Blob, start: int = 0, end: Optional[int] = None) -> List[Span]:
        """Bytes [start, end) of the blob as pieces of the part files holding them (of a compressed bundle: of its
        unpacked archive, part 0), in order."""
        end = blob.size if end is None else end
        sizes, starts = self._sizes[blob.bundle], self._starts[blob.bundle]
        pos, stop = blob.start + start, blob.start + end
        out = []
        i = max(bisect.bisect_right(starts, pos) - 1, 0)
        while pos < stop:
            part_end = starts[i] + sizes[i]
            n = min(stop, part_end) - pos
            if n > 0:
                out.append(Span(blob.bundle, i, pos - starts[i], n))
                pos += n
            i += 1
        return out
