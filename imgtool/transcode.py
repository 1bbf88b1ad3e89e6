"""Layers every supported Docker can load: `fetch --layers compat|as-is|plain`.

Docker before 23.0 (Kylin V10's 18.09, the 19.03/20.10 of many hosts) reads a zstd-compressed
layer as a plain tar and fails with `archive/tar: invalid tar header` (vllm-ascend FAQ 19). So by
default (`compat`) fetch rewrites such layers as gzip on the connected side: the registry's blob
(already checked against its digest) is decompressed as a stream and gzip-compressed in
independent 2 MiB members in parallel, as `export` does (gz.py: ISA-L when installed, else zlib),
while its diff_id is checked against the config. Several layers are rewritten at once (each as
soon as its blob is downloaded), sharing one pool, so one core is never left idle waiting for a
single layer's stream. The config, hence the image ID, is unchanged; the image gets a new manifest naming the
gzip blobs, and bundle.json keeps the upstream manifest digest and what changed (`upstream`).
`plain` writes every layer uncompressed, as `docker save` does; `as-is` keeps the registry's bytes.
A layer kept as the registry serves it (any layer with `as-is`, gzip ones with `compat`) is not
decompressed by default: its blob digest is checked as it arrives, as skopeo and crane do, and its
diff_id by `verify`, by Docker and containerd as they unpack, and by `load` on Podman. With
`fetch --check-diff-ids` (`LayerCheck`) it is decompressed and hashed against the config's diff_id on a
pool thread as soon as its blob is in the store, while the bundle is written, so a layer that is not
the image's is refused at fetch (docs/design.md: what fetch checks, and what that costs).
"""

import hashlib
import json
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Callable, Collection, Dict, List, Optional, Sequence, Set, Tuple

from . import gz
from .errors import ImgtoolError, UsageError, VerifyError
from .model import (DOCKER_LAYER, DOCKER_LAYER_GZIP, DOCKER_MANIFEST, LAYER_COMPRESSION, OCI_LAYER, OCI_LAYER_GZIP,
                    OCI_LAYER_ZSTD, OCI_MANIFEST, Descriptor, Digest, Manifest, PulledImage, format_size)
from .progress import Bar, Progress
from .store import Store
from .worker import Worker

CHUNK = 4 * 1024 * 1024  # a read of a layer stream (export's `docker save` too)
# compressed bytes a zstd layer's reader takes at a time (zstandard's read_size, held besides the window): 4 MiB
# held `fetch --layers compat` at 94-100 MiB of RSS, 1 MiB at 85-87 MiB, in the same time (docs/benchmarks.md)
ZSTD_READ = 1024 * 1024

MODES = ("compat", "as-is", "plain")
# media type of the rewritten layer, by manifest type and target compression
_TARGET_TYPE = {(DOCKER_MANIFEST, "gzip"): DOCKER_LAYER_GZIP, (DOCKER_MANIFEST, "none"): DOCKER_LAYER}


def changes(image: PulledImage, mode: str, skip: Collection[Digest] = ()) -> List[int]:
    """Indexes of the layers `mode` rewrites (none for `as-is`; layers in `skip` are left out of the bundle)."""
    if mode not in MODES:
        raise UsageError(f"invalid --layers {mode!r}: use one of {', '.join(MODES)}")
    out = []
    for i, d in enumerate(image.manifest.layers):
        comp = LAYER_COMPRESSION.get(d.media_type)
        if d.digest in skip or mode == "as-is":
            continue
        if (mode == "compat" and comp == "zstd") or (mode == "plain" and comp != "none"):
            out.append(i)
    return out


class _Counting:
    """read(n) over a reader, counting the bytes (the layer's unpacked size)."""

    def __init__(self, reader):
        self.reader, self.count = reader, 0

    def read(self, n=-1):
        data = self.reader.read(CHUNK if n is None or n < 0 else n)
        self.count += len(data)
        return data


def _decompressed(f, compression: str, what: str):
    """(reader of the layer's tar, the exceptions a damaged stream raises)."""
    if compression == "gzip":
        return gz.Reader(f, read_size=CHUNK), (gz.GzipError,)
    if compression == "zstd":
        try:
            import zstandard
        except ImportError:
            raise UsageError(f"{what} is zstd-compressed and the zstandard Python package is missing, so it "
                             "cannot be rewritten for Docker before 23.0",
                             hint="pip install zstandard, or fetch with --layers as-is for Docker 23+ only") from None
        reader = zstandard.ZstdDecompressor().stream_reader(f, read_size=ZSTD_READ, read_across_frames=True)
        return reader, (zstandard.ZstdError,)
    return f, ()


def _store_plain(reader, store: Store, bar) -> Tuple[str, Digest, int]:
    """An uncompressed layer into the store: its digest is its diff_id."""
    with store.new_blob("plain") as blob:
        for chunk in iter(lambda: reader.read(CHUNK), b""):
            blob.write(chunk)
            bar.update(len(chunk))
        digest = blob.publish()
    return str(digest), digest, blob.size


def rewrite_layer(path: Path, compression: str, target: str, store: Store, pool: ThreadPoolExecutor, ahead: int,
                  what: str, bar=None, gzip: Optional[gz.Gzip] = None) -> Tuple[str, Descriptor, int]:
    """One stored layer blob rewritten as `target` ("gzip" by `gzip`, or "none"): (diff_id, new blob, unpacked
    size); at most `ahead` gzip members of it in flight on `pool`.

    Raises VerifyError when the blob does not decompress; UsageError without zstandard."""
    with open(path, "rb") as f:
        reader, damaged = _decompressed(f, compression, what)
        counting = _Counting(reader)
        try:
            if target == "gzip":
                diff_id, digest, size = compress_layer(counting, store, pool, max(1, ahead // 2), gzip or gz.compressor(),
                                                       bar or Bar())
            else:
                diff_id, digest, size = _store_plain(counting, store, bar or Bar())
        except damaged as e:
            raise VerifyError(f"{what} cannot be decompressed as {compression}: {e}",
                              hint="the registry's blob matched its digest; report it to the image's publisher") from e
    return diff_id, Descriptor("", digest, size), counting.count


# A tar compresses: a gzip layer whose trailer (ISIZE, the unpacked size mod 2**32 of its last member) says less
# than this share of its compressed size is several members (eStargz's footer, imgtool's own 2 MiB members: the
# trailer counts only the last one) or a layer of 4 GiB or more unpacked; deflate grows incompressible data by
# well under 1 %.
_TRAILER_MIN_SHARE = 0.99
# The trailer is trusted only where a layer 4 GiB bigger than it says would compress better than this; the images
# this tool carries compress 2-3:1 (vllm-ascend ~2.3), so a wrapped trailer is not mistaken for the size.
TRAILER_RATIO_BOUND = 8


def gzip_trailer_size(path: Path, size: int) -> Optional[int]:
    """A gzip layer's unpacked size from its trailer, read without unpacking (two small reads), or None when the
    trailer cannot be taken for it (not gzip, several members, possibly 4 GiB more than it says)."""
    try:
        with open(path, "rb") as f:
            return trailer_size(lambda offset, n: os.pread(f.fileno(), n, offset), size)
    except OSError:
        return None


def trailer_size(read_at: Callable[[int, int], bytes], size: int) -> Optional[int]:
    """`gzip_trailer_size` of a blob read through `read_at(offset, n)`."""
    if size < 18:
        return None
    try:
        head, tail = read_at(0, 3), read_at(size - 4, 4)
    except OSError:
        return None
    if head != b"\x1f\x8b\x08" or len(tail) != 4:
        return None
    isize = int.from_bytes(tail, "little")
    if isize < size * _TRAILER_MIN_SHARE or isize + (1 << 32) <= size * TRAILER_RATIO_BOUND:
        return None
    return isize


class LayerCheck:
    """The layers `mode` keeps as served (layers it rewrites are checked by `transcode_images`): their unpacked
    sizes for bundle.json, and with `unpack` their diff_ids, checked on `jobs` threads while the bundle is written
    (each as soon as its blob is in the store). Without `unpack` nothing is decompressed (fetch's default, issue 38):
    a diff_id an earlier check left in the store is still compared, and the sizes come from the store, an
    uncompressed layer's size, or a gzip trailer (`gzip_trailer_size`); a layer with none of them gets no size
    (load and doctor then estimate it). `wait()` raises the first mismatch, `close()` ends the threads on every path."""

    def __init__(self, images: Sequence[PulledImage], mode: str, blob_path: Callable[[Digest], Path], store: Store,
                 skip: Collection[Digest] = (), jobs: int = 0, unpack: bool = True,
                 read_at: Optional[Callable[[Digest, int, int], bytes]] = None):
        """`read_at(digest, offset, n)`: how to read a blob that has no file (placed in a bundle: fetch without
        `unpack`)."""
        self._stop, self._store, self._blob_path, self._read_at = threading.Event(), store, blob_path, read_at
        self.sizes: Dict[Digest, int] = {}  # each kept layer blob's unpacked size, where known (for bundle.json)
        self._pool = ThreadPoolExecutor(max_workers=(jobs or max(1, os.cpu_count() or 1)) if unpack else 1,
                                        thread_name_prefix="diff-id")
        self._futures: List[Future] = []
        self._kept: List[Tuple[Descriptor, str, str]] = []  # without `unpack`: looked at in wait(), once all are in
        seen: Set[Tuple[Digest, str]] = set()
        for image in images:
            rewritten = changes(image, mode, skip)
            for i, layer in enumerate(image.manifest.layers):
                want = str(image.config.diff_ids[i]) if i < len(image.config.diff_ids) else ""
                if i in rewritten or layer.digest in skip or (layer.digest, want) in seen:
                    continue
                seen.add((layer.digest, want))
                what = f"layer {i + 1} of {image.ref.tagged} ({layer.digest}) from {image.source}"
                if unpack:
                    self._futures.append(self._pool.submit(self._check, layer, want, what))
                else:
                    self._kept.append((layer, want, what))

    def _check(self, layer: Descriptor, want: str, what: str) -> None:
        compression = LAYER_COMPRESSION.get(layer.media_type, "gzip")
        if compression == "none":  # the blob is the tar: its digest, checked on arrival, is its diff_id
            got = str(layer.digest)
            self.sizes[layer.digest] = layer.size
        else:
            path = self._blob_path(layer.digest)  # waits until the download brought it
            known = self._store.unpacked(layer.digest)  # found by an earlier fetch: the blob is the same bytes
            if known is not None and known[1] is not None:
                got, self.sizes[layer.digest] = known[0], known[1]
            else:  # never checked, or by an imgtool that did not record the size
                measured = self._unpacked_digest(path, compression, what)
                if measured is None:
                    return  # stopped
                got, self.sizes[layer.digest] = measured
                self._store.remember_diff_id(layer.digest, measured[0], measured[1])
        _compare(what, got, want)

    def _unchecked(self, layer: Descriptor, want: str, what: str) -> None:
        """A kept layer without unpacking it: what the store remembers (compared), else its size where cheap."""
        compression = LAYER_COMPRESSION.get(layer.media_type, "gzip")
        if compression == "none":
            _compare(what, str(layer.digest), want)
            self.sizes[layer.digest] = layer.size
            return
        known = self._store.unpacked(layer.digest)
        if known is not None:
            _compare(what, known[0], want)
            if known[1] is not None:
                self.sizes[layer.digest] = known[1]
                return
        if compression == "gzip":
            read_at = self._read_at
            size = gzip_trailer_size(self._blob_path(layer.digest), layer.size) if read_at is None else \
                trailer_size(lambda offset, n: read_at(layer.digest, offset, n), layer.size)
            if size is not None:
                self.sizes[layer.digest] = size

    def _unpacked_digest(self, path: Path, compression: str, what: str) -> Optional[Tuple[str, int]]:
        """sha256 of the layer's tar and its size (None when stopped); the layers are checked `jobs` at a time."""
        sha = hashlib.sha256()
        size = 0
        with open(path, "rb") as f:
            reader, damaged = _decompressed(f, compression, what)
            try:
                for chunk in iter(lambda: reader.read(CHUNK), b""):
                    if self._stop.is_set():
                        return None
                    sha.update(chunk)
                    size += len(chunk)
            except damaged as e:
                raise VerifyError(f"{what} cannot be decompressed as {compression}: {e}",
                                  hint="the registry's blob matched its digest; report it to the image's "
                                       "publisher") from e
        return "sha256:" + sha.hexdigest(), size

    def wait(self) -> Dict[Digest, int]:
        """Every layer checked; raises the first layer's error (VerifyError, or the download's). Returns each kept
        layer blob's unpacked size where known, which bundle.json records (load and doctor count them, not an
        estimate)."""
        for future in self._futures:
            future.result()
        for layer, want, what in self._kept:
            self._unchecked(layer, want, what)
        return dict(self.sizes)

    def close(self) -> None:
        """Stop the checks still running and join every thread (a blob not yet downloaded must be
        given up first: the download cancelled, so `blob_path` returns)."""
        self._stop.set()
        self._pool.shutdown(wait=True, cancel_futures=True)


def _compare(what: str, got: str, want: str) -> None:
    if got != want:
        raise VerifyError(f"{what}: its content has diff_id {got}, the config says {want}",
                          hint="the registry serves a layer that does not belong to this image (fetching "
                               "again gives the same bytes); report it to the image's publisher")


def transcode_images(images: Sequence[PulledImage], mode: str, blob_path: Callable[[Digest], Path], store: Store,
                     progress: Progress, skip: Collection[Digest] = (), jobs: int = 0,
                     gzip: Optional[gz.Gzip] = None, order: Sequence[Digest] = ()) -> List[PulledImage]:
    """Each image with the layers `mode` rewrites rewritten (gzip by `gzip`, default gz.compressor()), a new
    manifest, and `upstream` recorded.

    Images with nothing to rewrite come back unchanged. `blob_path` waits for a blob to be downloaded.
    Layers are rewritten several at a time (at least 2), in `order` (the download's: fetch downloads in archive
    order), their gzip members sharing one pool of `jobs` threads (about 2 x jobs members in flight in all:
    memory does not grow with the image).
    Raises VerifyError when a rewritten layer's diff_id differs from the config's."""
    jobs = jobs or max(1, os.cpu_count() or 1)
    gzip = gzip or gz.compressor()
    target = "gzip" if mode == "compat" else "none"
    parallel = max(2, (jobs + 1) // 2)
    rank = {d: n for n, d in enumerate(order)}
    plan = [(image, changes(image, mode, skip)) for image in images]
    with ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="gzip") as pool, \
            ThreadPoolExecutor(max_workers=parallel, thread_name_prefix="rewrite") as layers_pool:
        done: Dict[Digest, Future] = {}  # a layer shared by images is rewritten once

        def rewrite(image: PulledImage, i: int) -> Tuple[Descriptor, int]:
            old = image.manifest.layers[i]
            comp = LAYER_COMPRESSION.get(old.media_type, "none")
            what = f"layer {i + 1} of {image.ref.tagged} ({old.digest})"
            path = blob_path(old.digest)  # waits until the download brought it
            with progress.bar(None, f"{'gzip' if target == 'gzip' else 'unpack'} layer {i + 1} "
                                    f"({comp}, {format_size(old.size)})") as bar:
                diff_id, new, size = rewrite_layer(path, comp, target, store, pool, max(2, 2 * jobs // parallel),
                                                   what, bar, gzip)
            want = str(image.config.diff_ids[i])
            if diff_id != want:
                raise VerifyError(f"{what}: its content has diff_id {diff_id}, the config says {want}",
                                  hint="the registry serves a layer that does not belong to this image")
            return new, size

        try:
            todo: Dict[Digest, Tuple[PulledImage, int]] = {}
            for image, which in plan:
                for i in which:
                    todo.setdefault(image.manifest.layers[i].digest, (image, i))
            for digest in sorted(todo, key=lambda d: rank.get(d, len(rank))):  # stable: manifest order otherwise
                done[digest] = layers_pool.submit(rewrite, *todo[digest])
            out = [_rewritten_all(image, which, mode, target, done, store, progress) if which else image
                   for image, which in plan]
        except BaseException:
            for f in done.values():
                f.cancel()
            raise
    return out


def _rewritten_all(image: PulledImage, which: List[int], mode: str, target: str, done: Dict[Digest, Future],
                   store: Store, progress: Progress) -> PulledImage:
    """The image once the layers `which` are rewritten (waits for them; raises what a rewrite raised)."""
    layers = list(image.manifest.layers)
    unpacked: List[Optional[int]] = [None] * len(layers)
    for i in which:
        new, size = done[layers[i].digest].result()
        media = _TARGET_TYPE.get((image.manifest.media_type, target)) or \
            (OCI_LAYER_GZIP if target == "gzip" else OCI_LAYER)
        layers[i] = Descriptor(media, new.digest, new.size)
        unpacked[i] = size
    out = _rewritten(image, layers, which, unpacked, mode, store)
    progress.note(f"{image.ref.tagged} ({image.platform}): {len(which)} of {len(layers)} layers rewritten "
                  f"{'as gzip' if target == 'gzip' else 'uncompressed'} (--layers {mode}); the image ID "
                  f"is unchanged, its manifest digest is now {out.manifest_digest}")
    return out


def _rewritten(image: PulledImage, layers: List[Descriptor], which: List[int], unpacked: List[Optional[int]],
               mode: str, store: Store, base_blobs: Sequence[int] = ()) -> PulledImage:
    """The image with a manifest naming `layers`: its manifest with only the layers `which` replaced.

    A second rewrite (a delta's left-out layers named as the base holds them, after --layers rewrote
    others) keeps the first `upstream` and adds to what changed."""
    try:
        doc = json.loads(image.manifest_bytes)
    except ValueError as e:  # it was parsed once already: cannot happen for a pulled image
        raise ImgtoolError(f"{image.ref.tagged}: manifest is not JSON ({e})") from e
    old_layers = doc.get("layers") or []
    new_layers = []
    for i, d in enumerate(layers):
        entry = dict(old_layers[i]) if i < len(old_layers) and isinstance(old_layers[i], dict) else {}
        if i in which:
            # annotations of zstd:chunked (its table of contents) describe the old bytes: dropped
            entry = {"mediaType": d.media_type, "digest": str(d.digest), "size": d.size}
        new_layers.append(entry)
    doc["layers"] = new_layers
    manifest_bytes = json.dumps(doc, indent=3).encode()
    digest = store.put_bytes(manifest_bytes)
    manifest = Manifest(image.manifest.media_type, image.manifest.config, tuple(layers))
    upstream = dict(image.upstream or {"manifest_digest": str(image.manifest_digest),
                                       "manifest_size": len(image.manifest_bytes), "layers": mode})
    changed = list(upstream.get("changed") or []) + [
        {"index": i, "digest": str(image.manifest.layers[i].digest), "size": image.manifest.layers[i].size,
         "media_type": image.manifest.layers[i].media_type} for i in which]
    upstream["changed"] = sorted(changed, key=lambda x: x["index"])
    if base_blobs:
        upstream["base_blobs"] = list(base_blobs)
    if not unpacked or all(x is None for x in unpacked):
        unpacked = list(image.unpacked_sizes)
    return replace(image, manifest_digest=digest, manifest_bytes=manifest_bytes, manifest=manifest,
                   upstream=upstream, unpacked_sizes=tuple(unpacked))


# the layer media type for a compression, by manifest type (a Docker v2 manifest has no zstd type)
_MEDIA_FOR = {OCI_MANIFEST: {"gzip": OCI_LAYER_GZIP, "zstd": OCI_LAYER_ZSTD, "none": OCI_LAYER},
              DOCKER_MANIFEST: {"gzip": DOCKER_LAYER_GZIP, "none": DOCKER_LAYER}}


def name_held_blobs(images: Sequence[PulledImage], left_out: Sequence[Sequence[Tuple[int, Digest]]],
                    held: Dict[Digest, Descriptor], mode: str, store: Store, progress: Progress) -> List[PulledImage]:
    """Each image whose left-out layers (`left_out[n]`: index and chain ID of image n's) the offline Docker
    holds as other blobs (`held`, by chain ID), with a manifest naming those blobs.

    The containerd image store keeps an image's blobs by digest: an image whose manifest names blobs
    it never received runs, but cannot be saved, pushed or exported. The config, hence the layers'
    content and the graphdriver's image ID, is unchanged."""
    out = []
    for image, omitted in zip(images, left_out):
        layers = list(image.manifest.layers)
        which = []
        for i, chain in omitted:
            blob = held.get(chain)
            if blob is None or blob.digest == layers[i].digest:
                continue
            comp = LAYER_COMPRESSION.get(blob.media_type, "")
            media = _MEDIA_FOR.get(image.manifest.media_type, {}).get(comp, blob.media_type)
            layers[i] = Descriptor(media, blob.digest, blob.size)
            which.append(i)
        if not which:
            out.append(image)
            continue
        out.append(_rewritten(image, layers, which, [], mode, store, base_blobs=which))
        progress.note(f"{image.ref.tagged} ({image.platform}): {len(which)} left-out layers named as the offline "
                      f"Docker holds them (its base's blobs); the image ID is unchanged, its manifest digest "
                      f"is now {out[-1].manifest_digest}")
    return out


# export's layers too (a `docker save` stream, gzip-compressed into the store): one layer transform
def compress_layer(reader, store: Store, pool: ThreadPoolExecutor, jobs: int, gzip: gz.Gzip,
                   bar) -> Tuple[str, Digest, int]:
    """gzip a layer stream into the store (members of gz.MEMBER bytes, at most one per job and one more in flight);
    returns (diff_id, gzip digest, gzip size).

    The reading thread only reads and hands out: the diff_id's sha256 and the blob's writing (its sha256, the
    page cache's write-back throttling) run on threads of their own, as the members compress on `pool`."""
    with store.new_blob("export") as blob:
        # bounded: memory does not grow with the layer. One member waiting per thread beyond those compressing, one
        # read waiting for each of the two threads: more bought no speed and ~20 MiB (docs/benchmarks.md)
        with Worker(_sha256, "diff-id-sha256", maxsize=1) as diff, \
                Worker(_writes_to(blob), "blob-write", maxsize=1) as out:
            members = gz.Members(gzip, pool, out.put, jobs + 1)
            try:
                for chunk in iter(lambda: reader.read(gz.MEMBER), b""):  # a read is one member: none waits split
                    diff.put(chunk)
                    bar.update(len(chunk))
                    members.feed(chunk)
                members.close()
            except BaseException:
                members.abandon()
                raise
            diff_id = diff.result()
            out.result()
        digest = blob.publish()
    return diff_id, digest, blob.size


def _sha256(feed) -> str:
    sha = hashlib.sha256()
    for data in feed:
        sha.update(data)
    return f"sha256:{sha.hexdigest()}"


def _writes_to(blob):
    """A Worker target writing every item into `blob` (a store BlobWriter)."""
    def run(feed) -> None:
        for data in feed:
            blob.write(data)
    return run
