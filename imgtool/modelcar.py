"""The modelcar form of a model (issue 49): an OCI image whose uncompressed tar layers hold one file each under
/models, what a container runtime can mount (a Kubernetes image volume on containerd, Podman's
`--mount type=image`, Docker's image mounts) where it cannot mount the ModelPack artifact.

The bundle stores each file's bytes once, as the ModelPack raw layer (its digest the file's sha256). A modelcar
layer is a pure function of those bytes:

    ustar.header("models/" + path, size, 0o444)  +  the file's bytes  +  NULs to the next 512  +  1024 NULs

so it is never stored: its digest (the only thing that needs the bytes hashed again, once, at fetch) is recorded in
bundle.json (`files[].modelcar`), and the layer is streamed from the raw bytes wherever it is needed (load into a
runtime, serve). The header is ustar.py's, the same bytes on every Python (the pyz on 3.7 streams what fetch on 3.11
hashed). No directory entries: every runtime's layer applier creates a missing parent (0755).

The image is an OCI index of one manifest per platform (linux/amd64, linux/arm64: the Ascend hosts'), each with its
config (the platform, the rootfs diff_ids: uncompressed, so each diff_id is its layer's digest) and the same layers
in path order, as ModelPack's. A runtime matches the platform of an index entry and of a config: one image serves
both architectures with the layers stored once. No createdAt, no history: one model commit is one index digest in
every bundle, runtime and registry.

Its name is the artifact's repository with the commit's tag and `-modelcar` after it
(`models.local/hf/qwen/qwen3-8b:<commit>-modelcar`): the ModelPack artifact keeps `:<commit>`, both forms live in
one repository, and the name says where the image came from. Pure and standard library only (Python 3.7: the pyz
loads a modelcar).
"""

import hashlib
import json
from dataclasses import dataclass
from typing import Iterable, Iterator, List, Optional, Sequence, Tuple

from .bundle import ustar
from .errors import UsageError
from .model import OCI_CONFIG, OCI_INDEX, OCI_LAYER, OCI_MANIFEST, Descriptor, Digest
from .weights import FILEPATH, check_path

ROOT = "models"  # where the files are in the image (what the mount's path shows)
MODE = 0o444  # read-only for everyone: the mount is a model's bytes, not a work area
TAG_SUFFIX = "-modelcar"
FILE_SHA256 = "io.imgtool.model.file.sha256"  # a layer's file's own sha256 (the raw ModelPack layer's digest)
PLATFORMS = (("linux", "amd64"), ("linux", "arm64"))
_BLOCK = 512
_END = bytes(2 * _BLOCK)  # the tar's end-of-archive: two zero blocks


def head(path: str, size: int) -> bytes:
    """The tar header block(s) before a file's bytes in its layer (pax only for a long or non-ASCII name, or a
    size of 8 GiB or more)."""
    return ustar.header(f"{ROOT}/{path}", size, MODE)


def tail(size: int) -> bytes:
    """What follows a file's bytes in its layer: the padding to the block, then the end of the archive."""
    return bytes(-size % _BLOCK) + _END


def layer_size(path: str, size: int) -> int:
    """Bytes of a file's layer."""
    return len(head(path, size)) + size + len(tail(size))


def layer_chunks(path: str, size: int, chunks: Iterable[bytes]) -> Iterator[bytes]:
    """A file's layer as a stream: its head, the file's bytes as `chunks` gives them, its tail. The caller checks
    the bytes (the raw layer's sha256); this only frames them."""
    yield head(path, size)
    yield from chunks
    yield tail(size)


class LayerHash:
    """The digest of a file's layer, fed the file's bytes as they pass (fetch's one extra hash pass): the head is
    hashed at the start, the tail by `digest()`."""

    def __init__(self, path: str, size: int):
        self.size = size
        self._sha = hashlib.sha256(head(path, size))

    def update(self, chunk: bytes) -> None:
        self._sha.update(chunk)

    def digest(self) -> Digest:
        sha = self._sha.copy()
        sha.update(tail(self.size))
        return Digest("sha256", sha.hexdigest())


def layer_digest(path: str, size: int, chunks: Iterable[bytes]) -> Digest:
    """The digest of a file's layer, its bytes read from `chunks` (tests, and a file that is at hand)."""
    h = LayerHash(path, size)
    for chunk in chunks:
        h.update(chunk)
    return h.digest()


@dataclass(frozen=True)
class LayerFile:
    """What the image needs of one file: its path under /models, its size, its layer's digest, and the file's own
    sha256 (the raw layer's digest): each layer descriptor is annotated with the path (ModelPack's
    `org.cncf.model.filepath`) and the sha256 (`FILE_SHA256`), so a host holding the image says which files it
    holds (inventory, and a delta against it) without reading a byte of them."""

    path: str
    size: int
    layer: Digest
    sha256: Digest

    @property
    def descriptor(self) -> Descriptor:
        return Descriptor(OCI_LAYER, self.layer, layer_size(self.path, self.size),
                          annotations={FILEPATH: self.path, FILE_SHA256: str(self.sha256)})


def files_of(manifest: dict) -> List[Tuple[str, Digest, Digest]]:
    """(path, the file's sha256, its layer's digest) of each layer of a modelcar manifest as a runtime holds it (the
    parsed JSON); raises ValueError for a layer without both annotations, a path weights.check_path refuses or a bad
    digest (not a modelcar, or an edited one)."""
    out = []
    for layer in manifest.get("layers") or ():
        notes = layer.get("annotations") or {} if isinstance(layer, dict) else {}
        path, sha = notes.get(FILEPATH), notes.get(FILE_SHA256)
        if not isinstance(path, str) or not isinstance(sha, str) or check_path(path) is not None:
            raise ValueError(f"a layer without a safe {FILEPATH} and {FILE_SHA256}")
        digest = layer.get("digest")
        try:
            out.append((path, Digest.parse(sha), Digest.parse(digest if isinstance(digest, str) else "")))
        except UsageError as e:  # Digest.parse's: the docstring's ValueError, whatever the bad field
            raise ValueError(e.message) from None
    return out


HEAD_MOST = 8 << 30  # a size that needs a pax record: len(head(path, HEAD_MOST)) is the longest head of a path


def head_length(path: str) -> int:
    """The most bytes a file's head at `path` can take (what a reader of a layer's first bytes reads)."""
    return len(head(path, HEAD_MOST))


def file_size(path: str, size_of_layer: int, first: bytes) -> Optional[int]:
    """The size of the file a modelcar layer of `size_of_layer` bytes frames at `path`, found from the layer's
    `first` bytes (head_length(path) of them, or the whole layer when shorter): the one size whose head and layer
    size both match; None when none does (not a layer of this file's path, or another tool's). The layer's size
    says the size to within the padding; the head's size field pins it."""
    for big in (False, True):
        rest = size_of_layer - len(_END) - len(head(path, HEAD_MOST if big else 0))
        for size in range(max(rest - _BLOCK + 1, 0), rest + 1):
            if (size >= HEAD_MOST) == big and layer_size(path, size) == size_of_layer and \
                    first.startswith(head(path, size)):
                return size
    return None


@dataclass(frozen=True)
class Modelcar:
    """The image: its index and, per platform, (os, architecture, manifest bytes, config bytes); `layers` in order."""

    index: bytes
    manifests: Tuple[Tuple[str, str, bytes, bytes], ...]
    layers: Tuple[Descriptor, ...]

    @property
    def digest(self) -> Digest:
        return Digest.of(self.index)

    def for_platform(self, os_: str, arch: str) -> Tuple[bytes, bytes]:
        """(manifest, config) of a platform; raises KeyError when the image has none for it."""
        for o, a, manifest, config in self.manifests:
            if (o, a) == (os_, arch):
                return manifest, config
        raise KeyError(f"{os_}/{arch}")


def image(files: Sequence[LayerFile], source: str, revision: str) -> Modelcar:
    """The modelcar of a model's files (sorted by path here, as ModelPack's layers are); `source` and `revision`
    become the OCI source and revision labels and annotations (where the bytes came from)."""
    ordered = sorted(files, key=lambda f: f.path)
    layers = tuple(f.descriptor for f in ordered)
    labels = {"org.opencontainers.image.source": source, "org.opencontainers.image.revision": revision}
    entries: List[dict] = []
    manifests = []
    for os_, arch in PLATFORMS:
        config = _canonical({"architecture": arch, "os": os_, "config": {"Labels": labels, "WorkingDir": f"/{ROOT}"},
                             "rootfs": {"type": "layers", "diff_ids": [str(d.digest) for d in layers]}})
        manifest = _canonical({"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                               "config": Descriptor(OCI_CONFIG, Digest.of(config), len(config)).to_json(),
                               "layers": [d.to_json() for d in layers], "annotations": labels})
        manifests.append((os_, arch, manifest, config))
        entries.append({"mediaType": OCI_MANIFEST, "digest": str(Digest.of(manifest)), "size": len(manifest),
                        "platform": {"architecture": arch, "os": os_}})
    index = _canonical({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": entries, "annotations": labels})
    return Modelcar(index, tuple(manifests), layers)


def tag(commit_tag: str) -> str:
    """The modelcar's tag beside the artifact's `commit_tag` (a commit, or a revision that is a valid tag)."""
    return commit_tag + TAG_SUFFIX


def _canonical(doc: dict) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
