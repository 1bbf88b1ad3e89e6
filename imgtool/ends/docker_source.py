"""The local Docker as a pipeline source: `docker save` of the named images, each layer gzip-compressed into the
cache as it streams (the reading thread only reads), then read from the cache (`export` is Docker → bundle).

`docker save` of a graphdriver store hands layers over uncompressed. Each layer is
gzip-compressed on the way into the blob store as a series of independent gzip members of
2 MiB of input each, compressed in parallel through gz.py (ISA-L when installed, else zlib);
multi-member gzip is plain gzip to every reader, Docker 1.10+ included. Compression is
deterministic (fixed library and level, no time in the header), so the same layer always gets
the same digest with the same compressor and is stored once.

The containerd image store (Docker 29's default) saves the registry's compressed blobs instead
(the layer members are gzip or zstd). A gzip layer is kept byte for byte (its diff_id checked
while it is stored); a zstd layer, which Docker before 23 cannot read, is decompressed and
gzip-compressed as above. The images are `PulledImage`s, so the bundle destination does the
rest exactly as for `fetch`.
"""

import hashlib
import io
import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, FrozenSet, List, Optional, Sequence, Set, Tuple

from .. import gz, tarstream
from ..errors import ExportError, ManifestError, UsageError
from ..model import (DOCKER_CONFIG, DOCKER_LAYER_GZIP, DOCKER_MANIFEST, Descriptor, Digest, ImageConfig, ImageRef,
                    Manifest, PulledImage, format_size)
from ..progress import Bar, Progress
from ..store import FileBlobs, Store
from ..transcode import CHUNK, ZSTD_READ, compress_layer

if TYPE_CHECKING:
    from ..pipeline import Plan
    from ..runtimes.docker import Daemon

GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
SMALL = 1024 * 1024  # members up to this size are kept in memory until manifest.json says what they are


def docker_name(name: str) -> ImageRef:
    """Parse a name as Docker does (busybox:1 -> docker.io/library/busybox:1); raises UsageError."""
    first = name.split("/", 1)[0]
    if "/" not in name:
        name = f"docker.io/library/{name}"
    elif not ("." in first or ":" in first or first == "localhost"):
        name = f"docker.io/{name}"
    return ImageRef.parse(name, "docker.io/library/x")


class _Prepend(io.RawIOBase):
    """`head` followed by the rest of a reader: what sniffing a member's first bytes leaves behind."""

    def __init__(self, head: bytes, rest):
        self._head, self._rest = head, rest

    def readable(self):
        return True

    def read(self, n=-1):
        head, self._head = self._head, b""
        if n is None or n < 0:
            return head + self._rest.read()
        if len(head) >= n:
            self._head = head[n:]
            return head[:n]
        return head + (self._rest.read(n - len(head)) or b"")



class _ZstdLayer:
    """A zstd layer's decompressed bytes (read(n)); zstandard is imported only when one is met."""

    def __init__(self, raw, what: str):
        try:
            import zstandard
        except ImportError:
            raise ExportError(f"{what} is zstd-compressed (the containerd image store keeps the registry's blobs) "
                              "and the zstandard Python package is missing",
                              hint="pip install zstandard, then export again") from None
        self._r = zstandard.ZstdDecompressor().stream_reader(raw, read_size=ZSTD_READ, read_across_frames=True)

    def read(self, n=-1):
        return self._r.read(gz.MEMBER if n is None or n < 0 else n)


def layer_into_store(reader, what: str, store: Store, pool: ThreadPoolExecutor, jobs: int, gzip: gz.Gzip,
                     bar) -> Tuple[str, Digest, int, bool]:
    """A saved layer of any form into the store as gzip: (diff_id, gzip digest, gzip size, compressed here).

    Uncompressed (graphdriver store): gzip-compressed here. gzip (containerd store): kept as it is.
    zstd (containerd store): decompressed, then gzip-compressed here. Raises ExportError.
    """
    head = reader.read(4) or b""
    whole = _Prepend(head, reader)
    if head.startswith(GZIP_MAGIC):
        return keep_gzip_layer(whole, what, store, bar) + (False,)
    if head == ZSTD_MAGIC:
        return compress_layer(_ZstdLayer(whole, what), store, pool, jobs, gzip, bar) + (True,)
    return compress_layer(whole, store, pool, jobs, gzip, bar) + (True,)


def keep_gzip_layer(reader, what: str, store: Store, bar) -> Tuple[str, Digest, int]:
    """Store a gzip layer byte for byte, decompressing it on the way for its diff_id; raises ExportError."""
    diff = hashlib.sha256()
    inflate = gz.Inflate()
    try:
        with store.new_blob("export") as blob:
            for chunk in iter(lambda: reader.read(CHUNK), b""):
                blob.write(chunk)
                bar.update(len(chunk))
                for piece in inflate.feed(chunk):
                    diff.update(piece)
            try:
                inflate.end()
            except gz.GzipError:
                raise ExportError(f"{what}: the gzip layer docker save gave ends early") from None
            digest = blob.publish()
    except gz.GzipError as e:
        raise ExportError(f"{what}: docker save gave a gzip layer that cannot be decompressed ({e})") from e
    return f"sha256:{diff.hexdigest()}", digest, blob.size


_Layer = Tuple[str, Digest, int, bool]  # (diff_id, digest, size, gzipped here)


def _export_one(name: str, daemon, store: Store, pool: ThreadPoolExecutor, jobs: int, gzip: gz.Gzip,
                progress: Progress, made: Set[Digest]) -> PulledImage:
    """One image saved from Docker, its layers gzip-compressed into the store, as a PulledImage."""
    info = daemon.inspect(name)
    ref = _export_name(name, info)
    compressed: Dict[str, _Layer] = {}  # member name -> what layer_into_store made of it
    small: Dict[str, bytes] = {}
    with progress.bar(int(info.get("Size") or 0) or None, f"export {ref.tagged}") as bar:
        try:
            # the archive read as it streams, each byte copied once on the reading thread (tarstream.py)
            for member, f in tarstream.members(daemon.save(name)):
                if not member.isfile():
                    continue
                if member.size <= SMALL:
                    small[member.name] = f.read()
                    continue
                compressed[member.name] = layer_into_store(f, f"{name}: {member.name}", store, pool, jobs, gzip,
                                                           bar)
        except tarstream.TarStreamError as e:
            raise ExportError(f"docker save of {name} gave a broken archive: {e}") from None
    config_bytes, layer_names = _saved_manifest(name, small)
    layers: List[Descriptor] = []
    diff_ids: List[str] = []
    for member_name in layer_names:
        if member_name in compressed:
            diff_id, digest, size, here = compressed[member_name]
        elif member_name in small:
            diff_id, digest, size, here = layer_into_store(io.BytesIO(small[member_name]), f"{name}: {member_name}",
                                                           store, pool, jobs, gzip, Bar())
        else:
            raise ExportError(f"docker save of {name}: layer {member_name} is missing from the archive")
        diff_ids.append(diff_id)
        layers.append(Descriptor(DOCKER_LAYER_GZIP, digest, size))
        if here:
            made.add(digest)
    config = _saved_config(name, config_bytes, diff_ids, list((info.get("RootFS") or {}).get("Layers") or []))
    config_digest = store.put_bytes(config_bytes)
    manifest = Manifest(DOCKER_MANIFEST, Descriptor(DOCKER_CONFIG, config_digest, len(config_bytes)), tuple(layers))
    manifest_bytes = json.dumps({
        "schemaVersion": 2, "mediaType": DOCKER_MANIFEST,
        "config": manifest.config.to_json(), "layers": [d.to_json() for d in layers],
    }, indent=3).encode()
    progress.note(f"{ref.tagged}: {len(layers)} layers, {format_size(sum(d.size for d in layers))} gzip")
    return PulledImage(ref=ref, source="docker daemon", platform=config.platform, index_digest=None,
                       manifest_digest=Digest.of(manifest_bytes), manifest_bytes=manifest_bytes, manifest=manifest,
                       config_bytes=config_bytes, config=config)


def _export_name(name: str, info: dict) -> ImageRef:
    """The name the image gets in the bundle: the one asked for, or an ID's first tag; raises UsageError."""
    if not name.startswith("sha256:"):
        return docker_name(name)
    tags = info.get("RepoTags") or []
    if not tags:
        raise UsageError(f"image {name} has no tag; export needs a name to give it in the bundle",
                         hint="tag it first: docker tag ID NAME:TAG")
    return docker_name(tags[0])


def _saved_manifest(name: str, small: Dict[str, bytes]) -> Tuple[bytes, List[str]]:
    """The config bytes and layer member names docker save's manifest.json names; raises ExportError."""
    try:
        entry = json.loads(small["manifest.json"])[0]
        return small[entry["Config"]], list(entry["Layers"])
    except (KeyError, IndexError, ValueError, TypeError) as e:
        raise ExportError(f"docker save of {name} gave an archive without a usable manifest.json ({e})") from e


def _saved_config(name: str, config_bytes: bytes, diff_ids: List[str], want: List[str]) -> ImageConfig:
    """The saved config, its diff_ids those of the layers compressed (and the image's, `want`, when Docker
    said); raises ExportError."""
    try:
        config = ImageConfig.parse(config_bytes)
    except ManifestError as e:  # Docker's own output, not a registry's: exit 5, not 4
        raise ExportError(f"docker save of {name} gave an image config imgtool cannot read: {e.message}") from e
    if [str(d) for d in config.diff_ids] != diff_ids or (want and diff_ids != want):
        raise ExportError(f"docker save of {name} does not match the image's layers (diff_ids differ)")
    return config


def export_images(names: Sequence[str], daemon, store: Store, progress: Progress, jobs: int = 0,
                  gzip: Optional[gz.Gzip] = None, made: Optional[Set[Digest]] = None) -> List[PulledImage]:
    """Save each image from Docker and store its layers gzip-compressed (by `gzip`, default gz.compressor());
    the digests of the layers compressed here are added to `made`. Raises ImgtoolError."""
    if not names:
        raise UsageError("nothing to export: name at least one local image")
    gzip = gzip or gz.compressor()
    jobs = jobs or max(1, os.cpu_count() or 1)
    out: List[PulledImage] = []
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        for name in names:
            image = _export_one(name, daemon, store, pool, jobs, gzip, progress, made if made is not None else set())
            if all(image.image_id != o.image_id or image.ref != o.ref for o in out):
                out.append(image)
    return out



class DockerSource:
    def __init__(self, names: Sequence[str], daemon: "Daemon", store: Store, progress: Progress, jobs: int,
                 gzip: "gz.Gzip"):
        self.names, self.daemon, self.store, self.progress, self.jobs, self.gzip = (names, daemon, store, progress,
                                                                                    jobs, gzip)
        self.made: Set[Digest] = set()  # layers gzipped here (bundle.json records by what), hashed as written
        self.blobs = FileBlobs(store.blob_path, self.made)
        self.what = f"Docker at {daemon.host}" if getattr(daemon, "host", None) else "Docker"
        self._images: Optional[List[PulledImage]] = None

    def images(self) -> List[PulledImage]:
        """Saved from Docker into the cache (once); raises DaemonError, ExportError, UsageError."""
        if self._images is None:
            self._images = export_images(self.names, self.daemon, self.store, self.progress, jobs=self.jobs,
                                         gzip=self.gzip, made=self.made)
        return self._images

    def has(self) -> FrozenSet[Digest]:
        """Every blob of the images saved."""
        return frozenset(d for im in self.images() for d in [im.manifest_digest, im.manifest.config.digest]
                         + [x.digest for x in im.manifest.layers])

    def start(self, plan: "Plan[Any]") -> None:
        """Every blob is in the cache once `images()` returned."""

    def path(self, digest: Digest) -> Path:
        return self.store.blob_path(digest)

    def chunks(self, digest: Digest, size: int, what: str):
        return self.blobs.chunks(digest, size, what)

    def finish(self) -> None:
        return None

    def settle(self) -> None:
        """Every blob was checked before its last chunk was handed over."""

    def cancel(self) -> None:
        return None
