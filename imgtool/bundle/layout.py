"""The archive inside a bundle: which tar members it holds, in which order, with which bytes.

The archive is both a docker-archive (`manifest.json`) and an OCI image layout (`oci-layout`,
`index.json`, `blobs/sha256/<hex>`). Its member list and every header byte are a pure function
of bundle.json's `images`, so the writer produces exactly this and a reader can check a tar
against it member by member: nothing in the archive is trusted unless bundle.json implies it.
"""

import json
from dataclasses import dataclass
from typing import Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

from ..weights import MODEL_CONFIG
from ..model import (DOCKER_FOREIGN_LAYER, DOCKER_LAYER, DOCKER_LAYER_GZIP, DOCKER_LIST, DOCKER_MANIFEST, OCI_CONFIG,
                     OCI_INDEX, OCI_LAYER, OCI_LAYER_GZIP, OCI_MANIFEST, Digest)
from .format import BundleImage, BundleIndex, BundleModel
from .ustar import BLOCK
from .ustar import header as _ustar_header

RECORD = 20 * BLOCK  # tar pads the end to whole records, like GNU tar and tarfile
OCI_LAYOUT_BYTES = b'{"imageLayoutVersion":"1.0.0"}'
OCI_REF_NAME = "org.opencontainers.image.ref.name"
CONTAINERD_NAME = "io.containerd.image.name"


@dataclass(frozen=True)
class Member:
    """One regular file of the archive."""

    name: str
    size: int
    kind: str  # manifest | config | layer | meta | model (a model's file) | model-meta (its artifact's manifest, config)
    digest: Digest  # the blob digest; for meta members the sha256 of `content`
    what: str  # for messages: "layer 3 of quay.io/ascend/vllm-ascend:v1"
    content: Optional[bytes] = None  # meta members only (small, generated)
    media_type: str = ""


@dataclass(frozen=True)
class Slot:
    """A member with its tar header and where its data lies in the tar stream."""

    member: Member
    header: bytes
    offset: int  # of the header
    data_offset: int

    @property
    def end(self) -> int:
        """Offset just past the data (before padding)."""
        return self.data_offset + self.member.size


def blob_name(digest: Digest) -> str:
    return f"blobs/{digest.algorithm}/{digest.hex}"


def manifest_json(images: Sequence[BundleImage]) -> bytes:
    """docker-archive manifest.json: one entry per distinct manifest, RepoTags = canonical names."""
    entries: List[dict] = []
    by_manifest: Dict[Digest, dict] = {}
    # A tag held for several architectures gets no RepoTags: plain `docker load` would give the name to
    # whichever platform it loads last. imgtool load / load.sh tag the one matching the daemon instead.
    platforms: Dict[str, set] = {}
    for image in images:
        platforms.setdefault(image.ref, set()).add(image.platform.architecture)
    for image in images:
        entry = by_manifest.get(image.manifest_digest)
        if entry is None:
            entry = {
                "Config": blob_name(image.image_id),
                "RepoTags": [],
                "Layers": [blob_name(layer.digest) for layer in image.layers],
            }
            by_manifest[image.manifest_digest] = entry
            entries.append(entry)
        if image.repo_tag and len(platforms[image.ref]) == 1 and image.repo_tag not in entry["RepoTags"]:
            entry["RepoTags"].append(image.repo_tag)
    return json.dumps(entries, separators=(",", ":")).encode()


_OCI_LAYER_TYPE = {DOCKER_LAYER: OCI_LAYER, DOCKER_LAYER_GZIP: OCI_LAYER_GZIP, DOCKER_FOREIGN_LAYER: OCI_LAYER_GZIP}


def oci_manifest(image: BundleImage) -> Optional[bytes]:
    """For a Docker v2 manifest, the equivalent OCI manifest (same config and layer blobs), else None.

    OCI layout readers such as skopeo before 1.14 skip index.json entries that are not OCI
    manifests, so the OCI side of the archive points at this generated twin, while the
    registry's own manifest bytes stay in blobs/ under the digest bundle.json names.
    """
    if image.manifest_media_type != DOCKER_MANIFEST:
        return None
    doc = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": {"mediaType": OCI_CONFIG, "digest": str(image.image_id), "size": image.config_size},
        "layers": [{"mediaType": _OCI_LAYER_TYPE.get(x.media_type, x.media_type), "digest": str(x.digest),
                    "size": x.size} for x in image.layers],
    }
    return json.dumps(doc, separators=(",", ":")).encode()


def platform_index(images: Sequence[BundleImage]) -> Tuple[str, bytes]:
    """An index over the platform manifests of one tag held for several platforms: (media type, bytes).

    A Docker manifest list when every platform manifest is Docker v2, else an OCI index. Its digest differs from
    upstream's (upstream lists other platforms, attestations, its own spacing); `push` publishes it under the tag
    and `serve` answers it there (the same bytes, so the same digest, from both), unless serve answers upstream's
    own index, which bundle.json keeps (`upstream_indexes`), because the bundle holds every entry it lists.
    """
    docker = all(im.manifest_media_type == DOCKER_MANIFEST for im in images)
    media = DOCKER_LIST if docker else OCI_INDEX
    doc = {"schemaVersion": 2, "mediaType": media,
           "manifests": [{"mediaType": im.manifest_media_type, "digest": str(im.manifest_digest),
                          "size": im.manifest_size, "platform": im.platform.to_json()} for im in images]}
    return media, json.dumps(doc, separators=(",", ":")).encode()


def oci_descriptor_digest(image: BundleImage) -> Digest:
    """The manifest digest index.json names for the image (its OCI twin, or the registry's manifest)."""
    twin = oci_manifest(image)
    return Digest.of(twin) if twin else image.manifest_digest


def runtime_image_id(image: BundleImage, containerd_store: bool) -> Digest:
    """The ID a runtime gives the image once this archive is loaded: the config digest in Docker's
    graphdriver store and in Podman, the manifest digest index.json names in Docker's containerd image
    store and in containerd (which import the OCI side of the archive)."""
    return oci_descriptor_digest(image) if containerd_store else image.image_id


def index_json(images: Sequence[BundleImage], legacy_names: bool = False) -> bytes:
    """OCI index.json: one entry per image, named by tag (ref.name) and full name (containerd), except a tag
    held for several architectures, unnamed as in manifest.json: a plain docker load would give the name to
    whichever platform it loads last (the containerd image store reads index.json). `legacy_names`: the
    index.json of format versions 1 and 2, which named them all."""
    counts: Dict[str, int] = {}
    for image in images:
        counts[image.ref] = counts.get(image.ref, 0) + 1
    return named_index_json(images, [image.ref if legacy_names or counts[image.ref] == 1 else None
                                     for image in images])


def digest_name(image: BundleImage) -> str:
    """The image's name by digest, REPO@sha256:<the manifest digest index.json names>: how a platform that
    does not get the tag is named where only named images are kept (containerd, load --all-platforms)."""
    ref = image.image_ref
    return f"{ref.registry}/{ref.repository}@{oci_descriptor_digest(image)}"


def named_index_json(images: Sequence[BundleImage], names: Sequence[Optional[str]]) -> bytes:
    """OCI index.json naming each image as given (None: unnamed); a name by tag also gets its ref.name."""
    manifests = []
    for image, name in zip(images, names):
        annotations: Dict[str, str] = {}
        if name:
            annotations[CONTAINERD_NAME] = name
            tag = name.rsplit("/", 1)[-1].partition(":")[2] if "@" not in name else ""
            if tag:
                annotations[OCI_REF_NAME] = tag
        twin = oci_manifest(image)
        manifests.append({
            "mediaType": OCI_MANIFEST if twin else image.manifest_media_type,
            "digest": str(oci_descriptor_digest(image)),
            "size": len(twin) if twin else image.manifest_size,
            "platform": image.platform.to_json(),
            "annotations": annotations,
        })
    doc = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": manifests}
    return json.dumps(doc, separators=(",", ":")).encode()


def members(images: Sequence[BundleImage], legacy_names: bool = False) -> List[Member]:
    """Every member of the archive, sorted by name; each blob once however many images share it
    (`legacy_names`: index.json as format versions 1 and 2 wrote it, see index_json)."""
    blobs: Dict[Digest, Member] = {}

    def add(digest: Digest, size: int, kind: str, what: str, media: str = "", content: Optional[bytes] = None):
        if digest not in blobs:
            blobs[digest] = Member(blob_name(digest), size, kind, digest, what, content, media)

    for image in images:
        add(image.manifest_digest, image.manifest_size, "manifest", f"manifest of {image.ref}",
            image.manifest_media_type)
        twin = oci_manifest(image)
        if twin:
            add(Digest.of(twin), len(twin), "manifest", f"OCI manifest of {image.ref}", OCI_MANIFEST, twin)
        add(image.image_id, image.config_size, "config", f"config of {image.ref}")
        for i, layer in enumerate(image.layers):
            if not layer.omitted:  # a delta bundle: Docker already holds its chain and never reads it
                add(layer.digest, layer.size, "layer", f"layer {i + 1} of {image.ref}", layer.media_type)
    out = list(blobs.values())
    for name, content in (("index.json", index_json(images, legacy_names)), ("manifest.json", manifest_json(images)),
                          ("oci-layout", OCI_LAYOUT_BYTES)):
        out.append(Member(name, len(content), "meta", Digest.of(content), name, content))
    return sorted(out, key=lambda m: m.name)


def model_members(models: Sequence[BundleModel], images: Sequence[Member] = ()) -> List[Member]:
    """The members of the models, after the images' (`images`: a blob they hold is not written again): for each
    model in bundle.json's order, its carried files in path order, then its artifact's config and manifest. A raw
    file's member is named by its sha256 (the layer digest), so each byte is written once however many models or
    revisions share it."""
    seen = {m.digest for m in images}
    out: List[Member] = []
    for model in models:
        for f in model.carried:
            if f.sha256 not in seen:
                seen.add(f.sha256)
                out.append(Member(blob_name(f.sha256), f.size, "model", f.sha256, f"{f.path} of {model.ref}",
                                  None, f.media_type))
        manifest, config = model.artifact()
        for digest, data, what, media in ((model.config_digest, config, "config", MODEL_CONFIG),
                                          (model.manifest_digest, manifest, "manifest", OCI_MANIFEST)):
            if digest not in seen:
                seen.add(digest)
                out.append(Member(blob_name(digest), len(data), "model-meta", digest, f"{what} of {model.ref}", data,
                                  media))
    return out


def bundle_members(index: BundleIndex) -> List[Member]:
    """Every member of a bundle's archive: the images' (sorted by name), then the models' (model_members)."""
    image_members = members(index.images, index.legacy_names)
    return image_members + model_members(index.models, image_members)


def images_end(slots: Sequence[Slot]) -> int:
    """Where the images' members end in the tar stream (the offset of the first model member, or of the tar's end
    blocks): a runtime is sent the archive up to here, then the tar's end (runtime_tail), never a model's bytes."""
    for s in slots:
        if s.member.kind in ("model", "model-meta"):
            return s.offset
    if not slots:
        return 0
    last = slots[-1]
    return last.end + padding(last.member.size)


def header(name: str, size: int) -> bytes:
    """A fixed-metadata tar header: mode 0644, uid/gid 0, no user names, mtime 0.

    ustar, with a pax `size` record only for members of 8 GiB and more (which ustar cannot hold).
    The bytes come from imgtool (ustar.py), not from the running `tarfile`: a bundle verifies the
    same on every Python.
    """
    return _ustar_header(name, size)


def padding(size: int) -> int:
    return -size % BLOCK


def arrange(all_members: Sequence[Member]) -> Tuple[List[Slot], int]:
    """Headers and offsets of every member, and the total tar size (end blocks and record padding)."""
    slots = []
    offset = 0
    for m in all_members:
        h = header(m.name, m.size)
        slots.append(Slot(m, h, offset, offset + len(h)))
        offset += len(h) + m.size + padding(m.size)
    end = offset + 2 * BLOCK
    return slots, end + (-end % RECORD)


def pieces(slots: Sequence[Slot], tar_size: int, small: Dict[Digest, bytes],
           blob: Callable[[Member], Iterable[bytes]]) -> Iterator[Tuple[bytes, bool]]:
    """The archive's bytes in order, each piece with whether it is member data: each member's header, its data
    (generated content, `small` (manifests and configs), else `blob(member)`: a source's chunks, checked by it), its
    padding, then the tar's end. The bundle writer (into parts) and the runtime destination (into `docker load`,
    holding back from the last member data on) send exactly these."""
    for p in slots:
        m = p.member
        yield p.header, False
        data = m.content if m.content is not None else small.get(m.digest)
        if data is not None:
            yield data, True
        else:
            for chunk in blob(m):
                yield chunk, True
        pad = padding(m.size)
        if pad:
            yield bytes(pad), False
    if slots:
        last = slots[-1]
        yield bytes(tar_size - (last.end + padding(last.member.size))), False
