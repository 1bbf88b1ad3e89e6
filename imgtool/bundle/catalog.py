"""What `imgtool serve` may hand out: repositories, tags, manifests and blobs of bundles, by name and digest.

A pure function of bundle.json (no I/O): each blob is a digest at a known offset of the archive
(layout.place), cut into spans of the part files that hold it. Nothing that bundle.json does not
name is ever mapped to bytes: a request names a repository and a digest or tag, never a path.
"""

import bisect
import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from ..model import OCI_MANIFEST, Digest
from . import layout
from .format import BundleImage, BundleIndex

DIGEST = re.compile(r"sha256:[0-9a-f]{64}\Z")  # matched whole: `$` lets a final newline through
TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}\Z")
# a repository name as a request may give it: path components, the first possibly a registry host[:port]
_COMPONENT = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?(?::[0-9]{1,5})?\Z")
_DOCKER_HUB = ("docker.io", "index.docker.io", "registry-1.docker.io")


def valid_name(name: str) -> bool:
    """Whether a repository name of a request is well-formed (no `..`, no empty or absolute component)."""
    parts = name.split("/")
    return 0 < len(name) <= 512 and ".." not in name and all(_COMPONENT.match(p) for p in parts)


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
class Manifest:
    """A manifest a repository answers: a platform manifest the parts hold, or (`data`) the index over the
    platforms of a tag held for several, generated from bundle.json (layout.platform_index)."""

    digest: Digest
    media_type: str
    platform: str  # "index" for a generated index
    data: Optional[bytes] = None


@dataclass
class Repository:
    """One repository (registry host + path) as the bundles hold it."""

    registry: str
    path: str
    tags: Dict[str, List[Digest]] = field(default_factory=dict)  # several: one per platform of a multi-arch tag
    manifests: Dict[Digest, Manifest] = field(default_factory=dict)
    blobs: set = field(default_factory=set)  # digests of its configs, layers and manifests
    indexes: Dict[str, Digest] = field(default_factory=dict)  # a tag held for several platforms -> its index
    upstream: Dict[Digest, str] = field(default_factory=dict)  # upstream's index digest -> the tag it was

    def resolve(self, tag: str) -> Optional[Digest]:
        """The manifest a tag names: its platform manifest, or the index over its platforms; None: no such tag."""
        digests = self.tags.get(tag)
        if not digests:
            return None
        return self.indexes[tag] if len(digests) > 1 else digests[0]

    @property
    def name(self) -> str:
        return f"{self.registry}/{self.path}"


class Catalog:
    """The repositories, and every blob's place, of one or more bundles (the first wins a digest)."""

    def __init__(self, indexes: Sequence[BundleIndex]):
        self.indexes = list(indexes)
        self.repositories: Dict[Tuple[str, str], Repository] = {}
        self.blobs: Dict[Digest, Blob] = {}
        self.conflicts: List[str] = []  # tags two bundles hold differently: the first bundle's is served
        self._starts: List[List[int]] = []
        self._sizes: List[List[int]] = []  # each bundle's files the blobs lie in: its parts, or its unpacked archive
        for b, index in enumerate(self.indexes):
            self._add(b, index)

    def _add(self, b: int, index: BundleIndex) -> None:
        # a compressed bundle is served from its archive unpacked into one file (inplace.unpack_archive): one "part"
        sizes = [p.size for p in index.parts] if index.archive.compression == "none" else [index.archive.tar_size]
        starts, pos = [], 0
        for size in sizes:
            starts.append(pos)
            pos += size
        self._starts.append(starts)
        self._sizes.append(sizes)
        placed, _ = layout.place(layout.members(index.images, index.legacy_names))
        for p in placed:
            if p.member.kind != "meta" and p.member.digest not in self.blobs:
                self.blobs[p.member.digest] = Blob(p.member.digest, p.member.size, b, p.data_offset, p.member.what,
                                                   p.member.media_type)
        seen: Dict[Tuple[str, str, str], List[BundleImage]] = {}
        for image in index.images:
            ref = image.image_ref
            key = (_registry(ref.registry), ref.repository)
            repo = self.repositories.setdefault(key, Repository(*key))
            twin = layout.oci_manifest(image)
            repo.manifests.setdefault(image.manifest_digest, Manifest(image.manifest_digest, image.manifest_media_type,
                                                                      str(image.platform)))
            repo.blobs.add(image.manifest_digest)
            if twin:
                repo.manifests.setdefault(Digest.of(twin), Manifest(Digest.of(twin), OCI_MANIFEST, str(image.platform)))
                repo.blobs.add(Digest.of(twin))
            repo.blobs.add(image.image_id)
            repo.blobs.update(x.digest for x in image.layers if not x.omitted)
            if ref.tag:
                seen.setdefault(key + (ref.tag,), []).append(image)
        for (registry, path, tag), images in seen.items():
            repo = self.repositories[(registry, path)]
            digests = [im.manifest_digest for im in images]
            if tag in repo.tags and repo.tags[tag] != digests:
                self.conflicts.append(f"{repo.name}:{tag}")
                continue
            repo.tags[tag] = digests
            for im in images:
                if im.index_digest is not None:
                    repo.upstream.setdefault(im.index_digest, tag)
            if len(images) > 1:
                media, data = layout.platform_index(images)
                digest = Digest.of(data)
                repo.indexes[tag] = digest
                repo.manifests.setdefault(digest, Manifest(digest, media, "index", data))

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
