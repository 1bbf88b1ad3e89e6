"""Write a bundle directory: the archive streamed from the blob store into checksummed parts.

One pass: tar headers and blob bytes go (through an optional whole-archive compressor) into
part files that roll over at the chunk size, hashed on the way (each part, and the whole
archive on a second thread). Parts are fsynced; load.sh, README.txt and SHA256SUMS are written
atomically, and bundle.json last, so a bundle without bundle.json is an unfinished one.
"""

import dataclasses
import errno
import hashlib
import os
import re
import shlex
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, Callable, Dict, List, Optional, Sequence, Tuple

from .. import __version__, gz, modelcar
from ..delta import DeltaPlan, describe_requirements, requirements
from ..errors import ImgtoolError, UsageError
from ..fsutil import fsync_dir, remove_quietly, write_atomic
from ..model import Digest, PulledImage, format_size, utc_time
from ..progress import Progress
from ..worker import Worker, sha256_of
from . import layout, loadsh, texts
from .regions import REGIONS_PREFIX, Hole, Regions
from .format import (ARCHIVE_SUFFIX, BUNDLE_JSON, BundleModel, COMPRESSIONS, LOAD_SH, LOCK_NAME, MAX_KEPT_INDEX, README_TXT, SHA256SUMS,
                     SIGNATURE, TOOL_PYZ, Archive, BundleImage, BundleIndex, Part, UpstreamIndex, bundle_images)

COPY_BUFFER = 1024 * 1024  # big copies: 16 KiB ones cost a third more time on real disks
SYNC_BEHIND = 64 * 1024 * 1024  # start write-back every this many bytes, so the closing fsync is short
ZSTD_LEVEL = 3
_PART_RE = re.compile(r"\.part[0-9]{3,}$")
_OWN_SUFFIXES = (".tar", ".tar.gz", ".tar.zst")

if TYPE_CHECKING:  # typing.Protocol is 3.8+; the type only matters to the checker
    from typing import Protocol

    from ..pipeline import Blobs

    class DownloadStats(Protocol):
        """What fetch's download did (puller.PullStats): the bundle room reads it, never imports the puller."""

        bytes_downloaded: int
        blobs_downloaded: int
        blobs_cached: int
        bytes_cached: int
        resumed_bytes: int
        per_source: Dict[str, int]
        connections_lowered: Dict[str, int]  # a source that answered 429/503: the connections it was left


@dataclass
class BundleResult:
    """What `fetch` prints after writing a bundle."""

    dir: Path
    bundle_json: Path
    bundle_json_sha256: str  # publish this: `imgtool verify DIR --expect <it>` on the far side
    archive: Archive
    parts: List[Part]
    images: List[BundleImage]
    blobs: int  # distinct blobs stored (shared layers once)
    seconds: float = 0.0
    warnings: List[str] = field(default_factory=list)
    base: Optional[dict] = None  # a delta bundle's base (bundle.json `base`)
    files: List[Part] = field(default_factory=list)  # bundle.json `files`: imgtool.pyz, load.sh, README.txt
    models: List[BundleModel] = field(default_factory=list)

    @property
    def size(self) -> int:
        """Bytes on disk of the parts."""
        return sum(p.size for p in self.parts)

    def layer_bytes(self, delta: bool) -> int:
        """Compressed bytes of the distinct layers: all of them, or only those the archive holds."""
        seen = {}
        for im in self.images:
            for x in im.layers:
                if not (delta and x.omitted):
                    seen[x.digest] = x.size
        return sum(seen.values())

    @property
    def omitted_layers(self) -> int:
        return len({x.digest for im in self.images for x in im.layers if x.omitted})

    def to_json(self) -> dict:
        return {
            "dir": str(self.dir),
            "bundle_json": str(self.bundle_json),
            "bundle_json_sha256": self.bundle_json_sha256,
            "imgtool_pyz_sha256": self.tool_sha256,
            "archive": self.archive.to_json(),
            "parts": [p.to_json() for p in self.parts],
            "images": [{"ref": im.ref, "platform": str(im.platform), "image_id": str(im.image_id),
                        "size": im.size} for im in self.images],
            "models": [{"ref": m.ref, "commit": m.commit, "source": m.source, "files": len(m.files), "size": m.size,
                        "carried_files": len(m.carried), "carried_bytes": sum(f.size for f in m.carried),
                        "manifest_digest": str(m.manifest_digest)} for m in self.models],
            "blobs": self.blobs,
            "seconds": round(self.seconds, 3),
            "files": [f.to_json() for f in self.files],
            "full_layer_bytes": self.layer_bytes(False),
            "delta": None if self.base is None else {
                "base": self.base, "omitted_layers": self.omitted_layers,
                "omitted_bytes": self.layer_bytes(False) - self.layer_bytes(True),
                "layer_bytes": self.layer_bytes(True)},
        }

    def summary(self, images: Sequence[PulledImage] = (), stats: Optional["DownloadStats"] = None) -> dict:
        """`fetch --json`: the bundle plus what the download did."""
        out = self.to_json()
        sources = {im.ref.tagged if im.ref.tag else str(im.ref): im.source for im in images}
        for entry in out["images"]:
            entry["source"] = sources.get(entry["ref"], "")
        if stats is not None:
            out["download"] = {"bytes_downloaded": stats.bytes_downloaded, "blobs_downloaded": stats.blobs_downloaded,
                               "blobs_cached": stats.blobs_cached, "bytes_cached": stats.bytes_cached,
                               "resumed_bytes": stats.resumed_bytes, "per_source": dict(stats.per_source),
                               "connections_lowered": dict(stats.connections_lowered)}
        out["warnings"] = list(self.warnings)
        return out

    def describe(self, images: Sequence[PulledImage] = (), stats: Optional["DownloadStats"] = None) -> str:
        """`fetch`'s closing lines: what was written, its checksum, and what to run on the far side."""
        n = len(self.parts)
        lines = [f"bundle: {self.dir}  ({n} part{'s' if n != 1 else ''}, {format_size(self.size)}, "
                 f"compression {self.archive.compression}, {self.blobs} blobs)"]
        width = max([len(im.ref) for im in self.images] + [len(m.ref) for m in self.models])
        for im in self.images:
            lines.append(f"  {im.ref.ljust(width)}  {im.platform}  {format_size(im.size)}  ID {im.image_id.short}"
                         + (f"  via {im.source}" if im.source else ""))
        for m in self.models:
            carried = m.carried
            left = "" if len(carried) == len(m.files) else \
                f"  ({len(m.files) - len(carried)} files held by the other side left out)"
            lines.append(f"  {m.ref.ljust(width)}  commit {m.commit[:12]}  {len(m.files)} files  "
                         f"{format_size(m.size)}  via {m.source}{left}")
        if self.base is not None:
            full, delta = self.layer_bytes(False), self.layer_bytes(True)
            lines.append(f"delta bundle against {self.base.get('kind')} {self.base.get('name')}: "
                         f"{self.omitted_layers} layers ({format_size(full - delta)}) left out; layers "
                         f"{format_size(delta)} of {format_size(full)} in full")
            needed = [(x.chain_id, x.provided_by) for im in self.images for x in im.layers
                      if x.omitted and x.chain_id is not None]
            lines.append("  the offline Docker must already hold: " + (describe_requirements(requirements(needed))
                                                                       or "?"))
        if stats is not None:
            lines.append(f"downloaded {format_size(stats.bytes_downloaded)} ({stats.blobs_downloaded} blobs), "
                         f"{stats.blobs_cached} blobs from the cache; "
                         f"wrote the bundle in {self.seconds:.1f} s")
        lines.append(f"bundle.json sha256: {self.bundle_json_sha256}")
        tool = self.tool_sha256
        if tool:
            lines.append(f"imgtool.pyz sha256: {tool}   (publish both out of band: a host checks the tool with "
                         "sha256sum before it installs it)")
        # quoted as a shell needs (a space or 中文 in the path), so the line can be pasted as it is
        d = shlex.quote(str(self.dir))
        pyz = shlex.quote(f"{self.dir}/{TOOL_PYZ}")
        lines.append(f"offline side: imgtool verify {d} --expect {self.bundle_json_sha256} && imgtool load {d}   "
                     "(the host's installed imgtool: it refuses an edited bundle)")
        if tool:
            lines.append(f"first time on a host: sha256sum {pyz} (the value above), then: python3 {pyz} self-install")
        own = f"python3 {pyz} load {d}, or: " if tool else ""
        lines.append(f"without an installed imgtool: {own}sh {shlex.quote(f'{self.dir}/load.sh')}   "
                     "(damage only: an edited bundle brings its own checker)")
        return "\n".join(lines)

    @property
    def tool_sha256(self) -> Optional[str]:
        """The sha256 of the bundle's imgtool.pyz (None without one): published beside bundle.json's."""
        return next((f.sha256 for f in self.files if f.name == TOOL_PYZ), None)


def default_bundle_name(images: Sequence[PulledImage], models: Sequence[BundleModel] = ()) -> str:
    """A short directory name from image, tag and arch: `vllm-ascend-v0.22.1rc1-arm64`; without an image, from the
    model and its revision (or commit): `Qwen3-8B-main`."""

    def joined(values: List[str], keep: int) -> str:
        values = list(dict.fromkeys(values))
        text = "+".join(values[:keep])
        return text + (f"+{len(values) - keep}more" if len(values) > keep else "")

    if not images:
        refs = [m.model_ref for m in models]
        name = "-".join(x for x in (joined([r.repo.rsplit("/", 1)[-1] for r in refs], 1),
                                    joined([r.default_revision for r in refs], 2)) if x)
        return re.sub(r"[^A-Za-z0-9._+-]", "_", name).lstrip(".-") or "bundle"
    names = [im.ref.repository.rsplit("/", 1)[-1] for im in images]
    tags = [im.ref.tag or (im.ref.digest or im.manifest_digest).short for im in images]
    arches = [im.platform.architecture + (f"{im.platform.variant}" if im.platform.architecture == "arm" and
                                          im.platform.variant else "") for im in images]
    name = "-".join(x for x in (joined(names, 1), joined(tags, 2), joined(arches, 2)) if x)
    return re.sub(r"[^A-Za-z0-9._+-]", "_", name).lstrip(".-") or "bundle"


def _is_ours(path: Path) -> bool:
    """A file the writer makes (parts, archive, texts, pyz, its temp files)."""
    name = path.name
    return path.is_file() and (name in (SHA256SUMS, SIGNATURE, LOAD_SH, README_TXT, TOOL_PYZ, LOCK_NAME)
                               or name.endswith(_OWN_SUFFIXES)
                               or bool(_PART_RE.search(name)) or (name.startswith(".") and ".tmp-" in name)
                               or name.startswith(REGIONS_PREFIX))


def is_unfinished_bundle(out_dir: Path) -> bool:
    """True for a directory left by an interrupted write: no bundle.json and only the writer's files."""
    if not out_dir.is_dir() or (out_dir / BUNDLE_JSON).exists():
        return False
    entries = list(out_dir.iterdir())
    return bool(entries) and all(_is_ours(p) for p in entries)


def check_output_dir(out_dir: Path, force: bool) -> None:
    """Refuse an output that is a file, or a non-empty directory without force; raises UsageError.

    A directory an interrupted fetch left behind (no bundle.json, only the writer's own
    files) is not refused: rerunning the same command finishes the job.
    """
    if out_dir.exists() and not out_dir.is_dir():
        raise UsageError(f"output {out_dir} exists and is not a directory", hint="choose another --output")
    if out_dir.is_dir() and not force and any(out_dir.iterdir()) and not is_unfinished_bundle(out_dir):
        raise UsageError(f"output directory {out_dir} already exists and is not empty",
                         hint="choose another --output, or pass --force to replace the bundle in it")


def archive_order(images: Sequence[PulledImage], delta: Optional[DeltaPlan] = None) -> List[Digest]:
    """The layer blobs in the order write_bundle copies them (their order in the archive)."""
    return [m.digest for m in layout.members(bundle_images(images, delta)) if m.kind == "layer"]


def model_order(models: Sequence[BundleModel]) -> List[Digest]:
    """The model files the archive carries, in its order (after every layer)."""
    return list(dict.fromkeys(f.sha256 for m in models for f in m.carried))


def write_bundle(out_dir: Path, images: Sequence[PulledImage], blobs: "Blobs", *,
                 chunk_size: Optional[int], compress: str, force: bool, progress: Progress,
                 created: Optional[str] = None, delta: Optional[DeltaPlan] = None,
                 extra_files: Optional[Dict[str, Path]] = None,
                 before_seal: Optional[Callable[[], Optional[Dict[Digest, int]]]] = None,
                 gzip: Optional[gz.Gzip] = None, gzipped_layers: bool = False,
                 regions: Optional[Regions] = None, models: Sequence[BundleModel] = (),
                 modelcar_layers: bool = False) -> BundleResult:
    """Write the bundle for `images` into `out_dir`; raises UsageError, ImgtoolError (disk full etc.).

    `extra_files` (name in the bundle -> source file, e.g. imgtool.pyz) are copied in and listed
    in bundle.json `files` and SHA256SUMS, before load.sh and README.txt, which mention them.
    `blobs` is the source's (pipeline.Blobs): `chunks` may block until a blob is there (fetch writes while it
    downloads) and checks each blob's digest unless the source already did.

    With `delta` it is a delta bundle: the layers it plans to leave out are left out of the archive
    and recorded in bundle.json (with the plan's `base`, where the offline side's chains came from).
    `before_seal` runs once every byte is written, before the parts get their names: what it raises
    leaves no bundle (fetch's diff_id check of the layers it keeps as served); what it returns (layer blob ->
    unpacked size, as that check measured) is recorded in bundle.json for layers whose size `images` lack.
    `gzip` compresses a gzip archive (level 1: the layers are already gzip; default gz.compressor()); bundle.json
    records it (`gzip`) when it did, or when the caller's layers were compressed by it (`gzipped_layers`),
    so two builds that differ only by it can be told apart.
    `regions`: the source wrote the layers into the parts already (bundle/regions.py; `prepare_regions` made the
    directory): the writer writes around them and reads them back to hash the parts.
    `models`: the models the bundle carries (format.bundle_model); their files' members follow the images' and are
    read through `blobs.chunks` (or their regions) as layers are. `modelcar_layers`: each carried model file whose
    modelcar layer digest the model lacks is hashed as its bytes pass here (modelcar.LayerHash: whichever run
    downloaded them, cached or resumed, they all pass once), and a model whose every file then has one carries the
    modelcar form in bundle.json (a delta's left-out file has it only from its base).
    """
    started = time.monotonic()
    plan = plan_bundle(Path(out_dir), images, delta, chunk_size=chunk_size, compress=compress, models=models)
    gzip = gzip or gz.compressor()
    if regions is None:
        check_output_dir(plan.out_dir, force)
        warnings = _prepare_dir(plan.out_dir, force)
    else:
        warnings = list(regions.warnings)
        if regions.layout != regions_for(plan).layout:
            raise ImgtoolError("internal: the bundle's layout changed after its layers were placed")
    written: List[Path] = []  # removed again if anything fails: a half-written bundle must not stay
    try:
        # the sink and its hashing worker are one context: every path out of it, set-up included, ends them
        with _PartSink(plan.out_dir, plan.archive_name, chunk_size, plan.part_digits, single=plan.single,
                       prefilled=regions is not None) as sink:
            hashes = _modelcar_hashes(plan.models) if modelcar_layers else {}
            _stream_archive(plan, sink, blobs, progress, gzip, regions, hashes)
            if modelcar_layers:
                plan = dataclasses.replace(plan, models=_with_modelcar(plan.models, hashes))
            sizes = before_seal() if before_seal is not None else None
            parts, archive = _seal_archive(plan, sink, written)
            if regions is not None:
                regions.cleanup()
            index = BundleIndex(created or _now(), __version__, _with_sizes(plan.images, sizes or {}), archive, tuple(parts),
                                base=_delta_base(plan.images, delta.base if delta else None, plan.models),
                                gzip=gzip.to_json() if gzipped_layers or compress == "gzip" else None,
                                upstream_indexes=upstream_indexes(images), models=plan.models)
            index = _write_side_files(plan.out_dir, index, extra_files or {}, written)
            doc_sha = _write_index(plan.out_dir, index, written)
    except BaseException as e:
        for path in written:
            remove_quietly(path)
        if isinstance(e, OSError):
            raise _os_error(e, plan.out_dir, "write", plan.tar_size) from None
        raise
    return BundleResult(plan.out_dir, plan.out_dir / BUNDLE_JSON, doc_sha, archive, parts, list(plan.images),
                        plan.blobs, time.monotonic() - started, warnings, index.base, list(index.files),
                        list(plan.models))


@dataclass(frozen=True)
class BundlePlan:
    """What the archive holds and where it goes, decided before a byte is written."""

    out_dir: Path
    images: Tuple[BundleImage, ...]
    slots: Tuple[layout.Slot, ...]  # every member with its header, in archive order
    tar_size: int
    small: Dict[Digest, bytes]  # manifests and configs: from the pulled images, not from the store
    archive_name: str
    compress: str
    chunk_size: Optional[int]
    models: Tuple[BundleModel, ...] = ()

    @property
    def blobs(self) -> int:
        """Distinct blobs in the archive: every member but the generated ones (index.json, manifest.json, ...)."""
        return sum(1 for p in self.slots if p.member.kind not in ("meta", "model-meta"))

    @property
    def part_digits(self) -> int:
        """Digits of the part numbers: at least 3, more when the chunk size makes over 999 parts."""
        return max(3, len(str(self.tar_size // self.chunk_size + 2))) if self.chunk_size else 3

    @property
    def single(self) -> bool:
        """The archive is known to end up as one file (no compression, fits one chunk)."""
        return self.compress == "none" and (self.chunk_size is None or self.chunk_size >= self.tar_size)


def plan_bundle(out_dir: Path, images: Sequence[PulledImage], delta: Optional[DeltaPlan], *,
                chunk_size: Optional[int],
                compress: str, models: Sequence[BundleModel] = ()) -> BundlePlan:
    """The plan of the bundle for `images` and `models`; raises UsageError for bad knobs or images, ImgtoolError."""
    if not images and not models:
        raise UsageError("nothing to bundle: no images")
    if compress not in COMPRESSIONS:
        raise UsageError(f"invalid compression {compress!r}: use one of {', '.join(COMPRESSIONS)}")
    if chunk_size is not None and chunk_size <= 0:
        raise UsageError(f"invalid chunk size {chunk_size}: must be greater than zero")
    bimages = bundle_images(images, delta)
    small = {im.manifest_digest: im.manifest_bytes for im in images}
    small.update({im.image_id: im.config_bytes for im in images})
    image_members = layout.members(bimages)
    slots, tar_size = layout.arrange(image_members + layout.model_members(models, image_members))
    return BundlePlan(out_dir, tuple(bimages), tuple(slots), tar_size, small,
                      _archive_stem(out_dir) + ARCHIVE_SUFFIX[compress], compress, chunk_size, tuple(models))


def regions_for(plan: BundlePlan) -> Regions:
    """Where the plan's layer blobs lie in its parts (only an uncompressed archive has them at fixed regions)."""
    if plan.compress != "none":
        raise ImgtoolError("internal: a compressed archive has no regions for its blobs")
    return Regions(plan.out_dir, plan.archive_name, plan.slots, plan.tar_size, plan.chunk_size, plan.part_digits)


def prepare_regions(regions: Regions, force: bool) -> List[str]:
    """The directory ready for a source to place blobs (made, or an unfinished one kept when it holds this very plan:
    the run resumes; anything else cleared as `write_bundle` would); the parts opened. Returns warnings."""
    out_dir = regions.out_dir
    warnings: List[str] = []
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        unfinished = is_unfinished_bundle(out_dir)
        resumed = unfinished and regions.resumable()
        # an unfinished run of this very plan is resumed even with --force (what it placed is hashed again)
        if (unfinished and not resumed) or (force and not unfinished):
            warnings = _clear_old_bundle(out_dir)
    except OSError as e:
        raise _os_error(e, out_dir, "create") from e
    try:
        regions.open()
    except OSError as e:
        if not resumed:
            regions.remove()
            raise _os_error(e, out_dir, "write", regions.tar_size) from None
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise ImgtoolError(f"no space left on the device of {out_dir} (the bundle needs about "
                               f"{format_size(regions.tar_size)}); what was downloaded into it is kept",
                               hint="free space there and run the same command again") from None
        raise _os_error(e, out_dir, "write") from None
    regions.warnings = warnings
    return warnings


def _archive_stem(out_dir: Path) -> str:
    """The archive's (and parts') file name without suffix, from the directory's name.

    A part name must start with a letter or digit (format.safe_name): "离线 bundle" gives "bundle", not "___bundle".
    """
    name = re.sub(r"[^A-Za-z0-9._+-]", "_", out_dir.resolve().name)
    return re.sub(r"^[^A-Za-z0-9]+", "", name) or "bundle"


def _prepare_dir(out_dir: Path, force: bool) -> List[str]:
    """Create `out_dir`; with --force, or after an interrupted write, clear the old bundle (its warnings)."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        if force or is_unfinished_bundle(out_dir):
            return _clear_old_bundle(out_dir)
        return []
    except OSError as e:
        raise _os_error(e, out_dir, "create") from e


def _stream_archive(plan: BundlePlan, sink: "_PartSink", blobs: "Blobs", progress: Progress, gzip: gz.Gzip,
                    regions: Optional[Regions], hashes: "Optional[_LayerHashes]" = None) -> None:
    """Every member's header, bytes and padding, then the tar's end, through the compressor into `sink`; each blob
    read through the source's `blobs.chunks` (checked by it), or where the source placed it, as holes. A model file
    in `hashes` feeds its modelcar layer hashes as its bytes pass (read back from its region, or as the source
    gives them)."""
    def blob(m: layout.Member):
        taps = hashes.get(m.digest) if hashes and m.kind == "model" else None
        if regions is not None and regions.holds(m.digest):
            holes = regions.holes(m.digest, m.size)
            return holes if not taps else _tapped_holes(holes, _feed(taps))
        chunks = blobs.chunks(m.digest, m.size, m.what)
        return chunks if not taps else _tapped(chunks, _feed(taps))

    with progress.bar(plan.tar_size, "writing bundle") as bar, _compressor(plan.compress, sink, plan.tar_size,
                                                                          gzip) as stream:
        for data, _ in layout.pieces(plan.slots, plan.tar_size, plan.small, blob):
            stream.write(data)
            bar.update(len(data))
        stream.finish()


# A model file's modelcar layer hashes by its sha256 (the archive's member): one per (model, path) that holds it, as
# each path frames the same bytes with its own header.
_LayerHashes = Dict[Digest, List[Tuple[int, str, modelcar.LayerHash]]]


def _modelcar_hashes(models: Sequence[BundleModel]) -> _LayerHashes:
    """A LayerHash for each carried file whose model lacks its modelcar layer digest."""
    out: _LayerHashes = {}
    for i, model in enumerate(models):
        for f in model.carried:
            if f.modelcar is None:
                out.setdefault(f.sha256, []).append((i, f.path, modelcar.LayerHash(f.path, f.size)))
    return out


def _feed(taps: List[Tuple[int, str, "modelcar.LayerHash"]]) -> Callable[[bytes], None]:
    def feed(chunk: bytes) -> None:
        for _, _, h in taps:
            h.update(chunk)
    return feed


def _tapped(chunks, feed: Callable[[bytes], None]):
    for chunk in chunks:
        feed(chunk)
        yield chunk


def _tapped_holes(holes, feed: Callable[[bytes], None]):
    for hole in holes:
        hole.tap = feed
        yield hole


def _with_modelcar(models: Sequence[BundleModel], hashes: _LayerHashes) -> Tuple[BundleModel, ...]:
    """`models` with the layer digests hashed on the way; a model some file of which still has none (a delta's
    left-out file its base recorded none for) carries no modelcar form."""
    done: Dict[Tuple[int, str], Digest] = {(i, path): h.digest() for taps in hashes.values() for i, path, h in taps}
    out = []
    for i, model in enumerate(models):
        files = tuple(f if f.modelcar is not None else dataclasses.replace(f, modelcar=done.get((i, f.path)))
                      for f in model.files)
        if any(f.modelcar is None for f in files):
            files = tuple(dataclasses.replace(f, modelcar=None) for f in files)
        out.append(dataclasses.replace(model, files=files))
    return tuple(out)


def _seal_archive(plan: BundlePlan, sink: "_PartSink", written: List[Path]) -> Tuple[List[Part], Archive]:
    """Close the last part; one part is renamed to the archive's own name (`docker load -i` takes it)."""
    parts, archive_sha = sink.close()
    if len(parts) == 1:
        os.replace(plan.out_dir / parts[0].name, plan.out_dir / plan.archive_name)
        parts = [Part(plan.archive_name, parts[0].size, parts[0].sha256)]
    written += [plan.out_dir / p.name for p in parts]
    return parts, Archive(plan.archive_name, plan.compress, sum(p.size for p in parts), archive_sha, plan.tar_size)


def _with_sizes(images: Sequence[BundleImage], sizes: Dict[Digest, int]) -> Tuple[BundleImage, ...]:
    """The images with the unpacked sizes measured while writing, for layers that had none."""
    return tuple(dataclasses.replace(im, layers=tuple(
        dataclasses.replace(x, unpacked_size=sizes[x.digest]) if x.unpacked_size is None and x.digest in sizes else x
        for x in im.layers)) for im in images)


def upstream_indexes(images: Sequence[PulledImage]) -> Tuple[UpstreamIndex, ...]:
    """Upstream's indexes the images came from, each once, in the images' order: what bundle.json keeps so that
    `serve` answers a pull pinned by upstream's digest (one over MAX_KEPT_INDEX is not kept); raises ImgtoolError
    when bytes do not match their digest."""
    out: Dict[Digest, UpstreamIndex] = {}
    for im in images:
        if im.index_digest is None or im.index_bytes is None or im.index_digest in out:
            continue
        if Digest.of(im.index_bytes) != im.index_digest:
            raise ImgtoolError(f"{im.ref}: the index bytes do not match their digest {im.index_digest}")
        if len(im.index_bytes) <= MAX_KEPT_INDEX:
            out[im.index_digest] = UpstreamIndex(im.index_digest, im.index_media_type, im.index_bytes)
    return tuple(out.values())


def _delta_base(images: Sequence[BundleImage], base: Optional[dict], models: Sequence[BundleModel] = ()
                ) -> Optional[dict]:
    """bundle.json `base`: where the offline side's chains (and model files) came from and the images whose layers
    were left out; None for a full bundle."""
    used = list(dict.fromkeys(n for im in images for x in im.layers if x.omitted for n in x.provided_by))
    files = any(f.omitted for m in models for f in m.files)
    return dict(base or {"kind": "inventory", "name": ""}, images=used) if used or files else None


def _write_side_files(out_dir: Path, index: BundleIndex, extra_files: Dict[str, Path],
                      written: List[Path]) -> BundleIndex:
    """The extra files (imgtool.pyz), then load.sh and README.txt, which name them; `index` with its `files`."""
    extras = [_write_file(out_dir / name, Path(src).read_bytes(),  # small (imgtool.pyz is about 1 MB)
                          0o755 if name.endswith(".pyz") else 0o644, written)
              for name, src in sorted(extra_files.items())]
    index = dataclasses.replace(index, files=tuple(extras))
    texts_ = [_write_file(out_dir / LOAD_SH, loadsh.load_sh(index), 0o755, written),
              _write_file(out_dir / README_TXT, texts.readme(index), 0o644, written)]
    return dataclasses.replace(index, files=tuple(texts_ + extras))


def _write_index(out_dir: Path, index: BundleIndex, written: List[Path]) -> str:
    """SHA256SUMS, then bundle.json last (its presence means "complete"); returns bundle.json's sha256."""
    doc = index.to_bytes()
    doc_sha = hashlib.sha256(doc).hexdigest()
    sums = ([(p.sha256, p.name) for p in index.parts] + [(doc_sha, BUNDLE_JSON)]
            + [(f.sha256, f.name) for f in index.files])
    _write_file(out_dir / SHA256SUMS, "".join(f"{h}  {n}\n" for h, n in sums).encode(), 0o644, written)
    write_atomic(out_dir / BUNDLE_JSON, doc, 0o644)
    fsync_dir(out_dir, strict=True)
    return doc_sha


def _write_file(path: Path, data: bytes, mode: int, written: List[Path]) -> Part:
    """One small file written atomically and recorded in `written`; its entry for bundle.json `files`."""
    write_atomic(path, data, mode)
    written.append(path)
    return Part(path.name, len(data), hashlib.sha256(data).hexdigest())


class _PartSink:
    """Bytes in; part files out, rolling over at chunk_size, each hashed and fsynced."""

    def __init__(self, out_dir: Path, archive_name: str, chunk_size: Optional[int], width: int,
                 single: bool = False, prefilled: bool = False):
        self.out_dir, self.archive_name, self.chunk_size, self.width = out_dir, archive_name, chunk_size, width
        # prefilled: the parts exist at their sizes with the layers in them (bundle/regions.py): written around, read
        # back where a Hole comes, and kept on failure (a rerun resumes into them)
        self.prefilled = prefilled
        # single: the archive is known to be one part, so the part's sha256 is the archive's: hash it once,
        # on the background thread
        self.single = single
        self.parts: List[Part] = []
        self.file: Optional[BinaryIO] = None  # the part being written
        self.sha = hashlib.sha256()  # of that part
        self.size = 0
        self.archive: Worker[str] = Worker(sha256_of, "archive-sha256")
        self.archive_hex: Optional[str] = None
        self.paths: List[Path] = []
        self.synced = 0
        self.syncer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="part-sync")
        self.syncing: Optional[Future] = None

    def _open(self) -> BinaryIO:
        path = self.out_dir / f"{self.archive_name}.part{len(self.parts) + 1:0{self.width}d}"
        self.paths.append(path)
        self.file = f = open(path, "r+b" if self.prefilled else "wb", buffering=0)
        self.sha = hashlib.sha256()
        self.size = 0
        return f

    def _sync_behind(self, f: BinaryIO) -> None:
        # Start the disk writing what is written so far, on another thread: the fsync at the part's end
        # then finds little dirty data, and the disk works while we still copy (or download).
        if self.size - self.synced < SYNC_BEHIND or (self.syncing is not None and not self.syncing.done()):
            return
        self.synced = self.size
        self.syncing = self.syncer.submit(_fdatasync_quietly, f.fileno())

    def _wait_sync(self) -> None:
        if self.syncing is not None:
            self.syncing.result()  # before the fd is closed (and its number reused)
            self.syncing, self.synced = None, 0

    def _close_part(self, f: BinaryIO) -> None:
        self._wait_sync()
        os.fsync(f.fileno())  # reports any write-back error, including the background ones'
        f.close()
        if self.single:
            sha = self.archive_hex = self.archive.result()
        else:
            sha = self.sha.hexdigest()
        self.parts.append(Part(self.paths[-1].name, self.size, sha))
        self.file = None

    def write(self, data) -> None:
        if not len(data):
            return
        if isinstance(data, Hole):
            self._adopt(len(data), data.tap)
            return
        self.archive.put(data)
        view = memoryview(data)
        while len(view):
            f = self.file if self.file is not None else self._open()
            room = len(view) if self.chunk_size is None else min(len(view), self.chunk_size - self.size)
            piece = view[:room]
            if not self.single:
                self.sha.update(piece)
            done = 0
            while done < room:
                done += f.write(piece[done:])
            self.size += room
            self._sync_behind(f)
            view = view[room:]
            if self.chunk_size is not None and self.size >= self.chunk_size:
                self._close_part(f)

    def _adopt(self, n: int, tap: Optional[Callable[[bytes], None]] = None) -> None:
        """`n` bytes a source placed where the archive is now: read back and hashed (and given to `tap`), not
        written."""
        while n:
            f = self.file if self.file is not None else self._open()
            room = min(n, COPY_BUFFER) if self.chunk_size is None else min(n, COPY_BUFFER, self.chunk_size - self.size)
            data = f.read(room)
            if len(data) != room:
                raise ImgtoolError(f"internal: {self.paths[-1].name} is shorter than its plan")
            self.archive.put(data)
            if not self.single:
                self.sha.update(data)
            if tap is not None:
                tap(data)
            self.size += room
            n -= room
            self._sync_behind(f)
            if self.chunk_size is not None and self.size >= self.chunk_size:
                self._close_part(f)

    def close(self):
        if self.file is None and not self.parts:
            self._open()
        if self.file is not None:
            self._close_part(self.file)
        self.syncer.shutdown()
        return list(self.parts), self.archive_hex if self.single else self.archive.result()

    def __enter__(self) -> "_PartSink":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.abort()

    def abort(self) -> None:
        """On any failure: end both background threads, close and remove the parts written."""
        self.archive.abandon()
        self.syncer.shutdown()  # waits for a sync under way, before its fd is closed
        self.syncing = None
        if self.file is not None:
            try:
                self.file.close()
            except OSError:
                pass
        if not self.prefilled:
            for path in self.paths:
                remove_quietly(path)


class _Plain:
    def __init__(self, sink):
        self.sink = sink

    def write(self, data):
        self.sink.write(data)

    def finish(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass


class _Gzip(_Plain):
    """gzip members of gz.MEMBER bytes each (gz.py: fixed header, so reproducible), compressed on a pool of one
    thread per core, two per thread in flight; the pool ends on every path."""

    def __init__(self, sink, gzip: gz.Gzip):
        super().__init__(sink)
        jobs = max(1, os.cpu_count() or 1)
        self.pool = ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="archive-gzip")
        self.members = gz.Members(gzip, self.pool, sink.write, 2 * jobs)

    def write(self, data):
        self.members.feed(data)

    def finish(self):
        self.members.close()

    def __exit__(self, exc_type, *exc):
        if exc_type is not None:
            self.members.abandon()
        self.pool.shutdown(wait=True)


class _Zstd(_Plain):
    def __init__(self, sink, size: int):
        super().__init__(sink)
        try:
            import zstandard  # only when asked for: the offline side may lack it
        except ImportError:
            raise UsageError("--compress zstd needs the zstandard Python package",
                             hint="pip install zstandard, or use --compress gzip") from None

        cctx = zstandard.ZstdCompressor(level=ZSTD_LEVEL, threads=-1)
        self.w = cctx.stream_writer(sink, size=size, closefd=False, write_size=COPY_BUFFER)

    def write(self, data):
        self.w.write(data)

    def finish(self):
        import zstandard

        self.w.flush(zstandard.FLUSH_FRAME)


def _compressor(compress: str, sink: _PartSink, tar_size: int, gzip: gz.Gzip) -> _Plain:
    if compress == "gzip":
        return _Gzip(sink, gzip)
    if compress == "zstd":
        return _Zstd(sink, tar_size)
    return _Plain(sink)


def _clear_old_bundle(out_dir: Path) -> List[str]:
    """--force: drop the old bundle.json first (so it reads as unfinished), then its files only."""
    remove_quietly(out_dir / BUNDLE_JSON)
    fsync_dir(out_dir, strict=True)
    left = []
    for path in sorted(out_dir.iterdir()):
        if path.name == LOCK_NAME:
            continue  # the lock this run holds (dirlock.py): removed when it lets go
        if _is_ours(path):
            path.unlink()
        else:
            left.append(path.name)
    return [f"{out_dir}: left {len(left)} other file(s) in place: {', '.join(left[:5])}"] if left else []


def _fdatasync_quietly(fd: int) -> None:
    try:
        os.fdatasync(fd)
    except OSError:
        pass  # the part's closing fsync reports it


def _now() -> str:
    return utc_time(time.time())


def _os_error(e: OSError, out_dir: Path, doing: str, need: int = 0) -> ImgtoolError:
    where = e.filename or out_dir
    if e.errno == errno.ENOSPC or e.errno == errno.EDQUOT:
        return ImgtoolError(f"no space left on the device of {out_dir} (the bundle needs about {format_size(need)}); "
                            "nothing was kept", hint="free space there, or choose another --output")
    if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return ImgtoolError(f"cannot {doing} the bundle in {out_dir}: {e.strerror}: {where}",
                            hint="choose a writable --output directory")
    return ImgtoolError(f"cannot {doing} the bundle in {out_dir}: {e.strerror or e}: {where}")
