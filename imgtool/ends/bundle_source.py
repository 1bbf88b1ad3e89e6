"""A bundle directory as a pipeline source, read in place (push is bundle → registry).

An uncompressed bundle's blobs are read from the spans of the part files that hold them (bundle/catalog.py's spans,
read by bundle/inplace.py's `PartFiles`: the one reader of blobs in place, serve's too). A `--compress`ed bundle's
archive is one gzip or zstd stream cut into parts: no blob can be read in place, so the archive is read by its one
forward reader (bundle/archive.py: each part checked against bundle.json as it ends, every header, member digest,
padding and the trailer as they pass) and the blobs are handed over in archive order (`order`): a destination takes
them in that order, and a request behind the stream is refused, unless `rewind()` asked for a new pass first. The
manifests and configs `images()` returns are read by a first pass that stops once it holds them all; the blobs then
follow on from there, or from the start when one lies before. The rest of the archive, to its end and the
decompressed stream's, is read and checked before the last chunk of the last blob the plan reads is handed over
(or by `settle`, which a destination calls before it commits): bytes after the archive refuse the copy as they
refuse verify and load.

Every blob is checked against its digest before its last chunk is handed over. Python 3.7: the offline side reads
bundles through this.
"""

from pathlib import Path
from typing import Dict, FrozenSet, Iterator, List, Optional, Tuple

from ..bundle import layout
from ..bundle.archive import Archive
from ..bundle.catalog import Catalog
from ..bundle.format import BundleImage, BundleIndex, Layer, part_label
from ..bundle.inplace import PartFiles
from ..bundle.reader import HASH_READ, read_index
from ..errors import ImgtoolError, VerifyError
from ..model import Digest, ImageConfig, ImageRef, Manifest, PulledImage, parse_manifest

VERIFY_HINT = "run `imgtool verify` on the bundle and re-copy the parts it names"


class OutOfOrder(ImgtoolError):
    """A compressed bundle's blob asked for behind the stream: its archive is read once, in archive order."""


class BundleSource:
    """The bundle in `bundle_dir` (bundle.json read and validated here, or `index`: the one the caller checked, so
    what was checked is what is read); `index` is its BundleIndex, `omitted` the layers a delta bundle leaves out,
    per image (manifest digest -> its omitted layers): a destination must hold them already (it checks, then puts
    them into its plan's skip). Raises UsageError, VerifyError."""

    def __init__(self, bundle_dir: Path, index: Optional[BundleIndex] = None):
        self.dir = Path(bundle_dir)
        self.index: BundleIndex = index if index is not None else read_index(self.dir)[0]
        self.what = f"bundle {self.dir.name}"
        slots, _ = layout.arrange(layout.bundle_members(self.index))
        self.slots: Dict[Digest, layout.Slot] = {p.member.digest: p for p in slots if p.member.kind != "meta"}
        # every blob in the order the archive holds it (a compressed bundle hands blobs over in this order only)
        self.order: List[Digest] = [p.member.digest for p in slots if p.member.kind != "meta"]
        self.omitted: Dict[Digest, Tuple[Layer, ...]] = {im.manifest_digest: im.omitted for im in self.index.images
                                                          if im.omitted}
        self.compressed = self.index.archive.compression != "none"
        self._files = None if self.compressed else PartFiles([self.dir], Catalog([self.index]))
        self._stream: Optional[Archive] = None
        self._last: Optional[Digest] = None  # the last blob in archive order the plan reads: the archive's end after it
        self._small: Dict[Digest, bytes] = {}  # a compressed bundle's manifests and configs, read by the first pass
        self._images: Optional[List[PulledImage]] = None
        self._handed = False  # a blob of the blob pass was handed over: the stream may no longer start over

    def images(self) -> List[PulledImage]:
        """Each image of bundle.json with its manifest and config read from the bundle, digest-checked; raises
        VerifyError (damaged, or the manifest lists other layers than bundle.json)."""
        if self._images is None:
            if self.compressed:
                self._first_pass()
            self._images = [self._pulled(im) for im in self.index.images]
        return list(self._images)

    def _pulled(self, im: BundleImage) -> PulledImage:
        manifest_bytes = self._read(im.manifest_digest, im.manifest_size, f"manifest of {im.ref}")
        config_bytes = self._read(im.image_id, im.config_size, f"config of {im.ref}")
        manifest = parse_manifest(manifest_bytes, im.manifest_media_type)
        if not isinstance(manifest, Manifest) or [(x.digest, x.size) for x in manifest.layers] != \
                [(x.digest, x.size) for x in im.layers] or manifest.config.digest != im.image_id:
            raise VerifyError(f"{self.dir}: the manifest of {im.ref} ({im.platform}) lists other blobs than "
                              "bundle.json", hint="fetch the bundle again")
        kept = {x.digest: x for x in self.index.upstream_indexes}
        upstream_index = kept.get(im.index_digest) if im.index_digest is not None else None
        ref = ImageRef.parse(im.ref)
        if ref.digest is None:  # what the tag meant, as the puller names it
            ref = ref.with_digest(im.index_digest or im.manifest_digest)
        return PulledImage(ref=ref, source=im.source, platform=im.platform,
                           index_digest=im.index_digest, manifest_digest=im.manifest_digest,
                           manifest_bytes=manifest_bytes, manifest=manifest, config_bytes=config_bytes,
                           config=ImageConfig.parse(config_bytes), upstream=im.upstream,
                           unpacked_sizes=tuple(x.unpacked_size for x in im.layers),
                           index_bytes=upstream_index.data if upstream_index else None,
                           index_media_type=upstream_index.media_type if upstream_index else "")

    def _read(self, digest: Digest, size: int, what: str) -> bytes:
        return b"".join(self.chunks(digest, size, what))

    def _first_pass(self) -> None:
        """A compressed bundle's manifests and configs, read from the start of its archive up to the last of them
        (the stream stays open there: the blob pass goes on from it when it can)."""
        wanted = {d for im in self.index.images for d in (im.manifest_digest, im.image_id)}
        small = sorted((self.slots[d] for d in wanted), key=lambda p: p.data_offset)
        stream = self._open()
        for p in small:
            self._small[p.member.digest] = b"".join(stream.blob(p))

    def _open(self) -> Archive:
        if self._stream is not None:
            self._stream.close()
            self._stream = None
        self._stream = Archive(self.dir, self.index, fail=self._refusal, digests="handed", read_size=HASH_READ)
        return self._stream

    def has(self) -> FrozenSet[Digest]:
        """Every blob its archive holds (a delta bundle's left-out layers are not)."""
        return frozenset(self.slots)

    def _refusal(self, message: str) -> VerifyError:
        """What the archive's reader found, said as the part that is damaged when one is: the rest of the parts
        read (and hashed, not decompressed) until one differs from bundle.json (raises VerifyError naming it)."""
        if self._stream is not None:
            self._stream.parts.drain()
        return VerifyError(f"cannot read {self.dir}: {message}", hint=VERIFY_HINT)

    def start(self, plan) -> None:
        """A compressed bundle: refuses a plan whose order is not the archive's (OutOfOrder)."""
        if self.compressed:
            at = {d: i for i, d in enumerate(self.order)}
            wanted = [at[d] for d in plan.moves if d in at]
            if wanted != sorted(wanted):
                raise OutOfOrder(f"{self.what} is {self.index.archive.compression}-compressed: its blobs can be read "
                                 "only in the order of its archive, and the destination asked for another order")
            read = [at[d] for d in plan.moves if d in at and d not in self._small]
            self._last = self.order[max(read)] if read else None
            if self._last is None:  # no blob is read: the archive's end is checked now
                self.settle()

    def path(self, digest: Digest) -> Optional[Path]:
        return None  # no file per blob

    def chunks(self, digest: Digest, size: int, what: str) -> Iterator[bytes]:
        """The blob's bytes in big reads, checked against its digest before the last chunk is handed over; raises
        VerifyError naming the damaged, missing or truncated part, ImgtoolError (a blob the bundle does not hold),
        OutOfOrder (a compressed bundle's blob behind the stream)."""
        p = self.slots.get(digest)
        if p is None:
            left_out = any(x.digest == digest for layers in self.omitted.values() for x in layers)
            raise ImgtoolError(f"{self.what} does not hold blob {digest} ({what})"
                               + (": it is a delta bundle, which leaves that layer out" if left_out else ""))
        if p.member.size != size:
            raise ImgtoolError(f"blob {digest} ({what}) is {p.member.size} bytes in {self.what}, expected {size}")
        if digest in self._small:
            yield self._small[digest]
            return
        if self._files is not None:
            blob = self._files.catalog.blobs[digest]
            yield from _checked(self._files.chunks(blob, 0, size, HASH_READ), p, self._parts(blob))
            return
        stream = self._stream
        if stream is None or p.offset < stream.offset:
            if self._handed:
                raise OutOfOrder(f"{self.what} is {self.index.archive.compression}-compressed: its blobs are read "
                                 f"once, in archive order, and {p.member.what} (blob {digest.short}) lies behind the "
                                 "blob read last")
            stream = self._open()
        self._handed = True
        yield from stream.blob(p, then_end=digest == self._last)

    def _parts(self, blob) -> str:
        """Which parts hold the blob, as verify names them: " (part 003)", " (parts 003-004)"."""
        assert self._files is not None
        held = sorted({span.part for span in self._files.catalog.spans(blob)})
        if not held:
            return ""
        labels = [part_label(i, len(self.index.parts)).split()[-1] for i in held]
        return f" (part {labels[0]})" if len(labels) == 1 else f" (parts {labels[0]}-{labels[-1]})"

    def rewind(self) -> None:
        """A new pass over a compressed bundle's archive: its next blob may lie behind the last (read from the start
        again). Nothing to do for an uncompressed one."""
        self._handed = False

    def settle(self) -> None:
        """Every blob was checked before its last chunk was handed over; a compressed bundle's archive is read and
        checked to its end (raises VerifyError)."""
        if self.compressed:
            stream = self._stream if self._stream is not None else self._open()
            stream.to_end()

    def cancel(self) -> None:
        self.finish()

    def finish(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream = None


def _checked(chunks: Iterator[bytes], p: layout.Slot, where: str) -> Iterator[bytes]:
    """The chunks, the last held back until the whole blob matched its digest; raises VerifyError."""
    sha = p.member.digest.hasher()
    held = None
    for data in chunks:
        sha.update(data)
        if held is not None:
            yield held
        held = data
    if sha.hexdigest() != p.member.digest.hex:
        raise _damaged(p, where)
    if held is not None:
        yield held


def _damaged(p: layout.Slot, where: str = "") -> VerifyError:
    return VerifyError(f"{p.member.what} (blob {p.member.digest.short}) is damaged in the bundle{where}: its sha256 "
                       "differs from its digest", hint=VERIFY_HINT)
