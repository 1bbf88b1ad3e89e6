"""The connected side's main job: `fetch`, references -> a verified bundle.

A core function taking plain values and a Progress and returning plain values; commands/ formats
them. `imgtool inspect` is inspection.py, the mirror report (`imgtool mirrors`) mirror_report.py.
"""

import os
import threading
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence, Set, Tuple

from . import dirlock, gz, heldblobs, transcode
from .config import MirrorConfig
from .delta import DeltaPlan, Have, Inventory, have_from_inventory
from .errors import ImgtoolError, UsageError
from .fsutil import NotRegularFile, open_regular
from .mirrors import Clients, Resolution, sources_for
from .model import Descriptor, Digest, Platform, PulledImage
from .progress import Progress
from .puller import CONNECTIONS, JOBS, PullStats, download
from .resolve import resolve_image, resolve_refs
from .selfbundle import bundle_tool
from .store import Store

if TYPE_CHECKING:  # imported where used: spec and the writer are needed only by some verbs
    from .bundle.signature import Signed
    from .bundle.writer import BundleResult
    from .spec import Lock


@dataclass
class FetchOptions:
    """Everything `imgtool fetch` was asked to do."""

    refs: Sequence[str]
    platforms: Sequence[Platform]
    output: Optional[Path] = None
    mirror: str = "auto"
    chunk_size: Optional[int] = None
    compress: str = "none"
    jobs: int = JOBS  # connections per source (--connections)
    max_connections: int = CONNECTIONS  # connections at once over every source (--max-connections)
    force: bool = False
    probe_timeout: float = 5.0
    have: Optional[Path] = None  # an inventory of the offline Docker (`imgtool inventory -o FILE`)
    base: Optional[Path] = None  # an earlier bundle, assumed loaded on the offline side
    lock: Optional["Lock"] = None  # bundle.lock: fetch every image by its pinned digest
    created: Optional[str] = None  # bundle.json `created` (--created / SOURCE_DATE_EPOCH); None: now
    tool: bool = True  # put imgtool.pyz into the bundle (--no-tool)
    layers: str = "compat"  # transcode.MODES: rewrite zstd layers as gzip / keep the registry's / uncompressed
    check_diff_ids: bool = False  # unpack the layers kept as served to check their diff_ids (--check-diff-ids)
    gzip_level: int = 1  # zlib's scale, 1 (fast: ISA-L) .. 9, for rewritten layers and a gzip archive (--gzip-level)
    gzip_library: str = "auto"  # gz.LIBRARIES: what gzips rewritten layers and a gzip archive (tests force zlib)
    sign_key: Optional[str] = None  # sign bundle.json once the bundle is complete (bundle/signature.py)


@dataclass
class FetchResult:
    images: List[PulledImage]
    stats: PullStats
    bundle: "BundleResult"
    signed: Optional["Signed"] = None  # with sign_key


def parse_platforms(arch: Optional[str], platform: Optional[str]) -> List[Platform]:
    """`--arch a,b` or `--platform os/arch[/v]` (comma lists too); default the host's. Raises UsageError."""
    if arch and platform:
        raise UsageError("--arch and --platform cannot be used together")
    text = arch or platform
    if not text:
        return [Platform.host()]
    out: List[Platform] = []
    for item in text.split(","):
        p = Platform.parse(item.strip())
        if p not in out:
            out.append(p)
    return out


def fetch(config: MirrorConfig, opts: FetchOptions, store: Store, progress: Progress) -> FetchResult:
    """Resolve, pull into `store` (its directories made once the input is checked), and write a bundle.
    Raises ImgtoolError subclasses."""
    from .bundle import signature, writer

    clients = Clients(config)  # one per endpoint for the whole fetch: a login is looked up once per host
    have, base = _check_input(config, opts, clients)
    with ExitStack() as locks:  # the output's lock (dirlock.py), from before the first blob until the bundle is signed
        gzip = gz.compressor(opts.gzip_level, opts.gzip_library)
        store.create()
        stale = store.remove_stale()  # what a killed rewrite left: nothing can resume it
        if stale:
            progress.note(stale)
        resolutions = resolve_refs(config, opts.refs, opts.mirror, progress, opts.probe_timeout,
                                   pins=opts.lock.pins() if opts.lock else None, clients=clients)
        # After resolving (a dead network fails in a fraction of a second, not after building the pyz),
        # before downloading (a failure here costs no download).
        tool = bundle_tool(store.root, progress) if opts.tool else {}
        progress.note("platform: " + ", ".join(str(p) for p in opts.platforms)
                      + (" (this host's)" if list(opts.platforms) == [Platform.host()] else ""))
        pulled = _platform_images(resolutions, opts, store)
        images = [img for img, _ in pulled]
        output = Path(opts.output) if opts.output else Path(writer.default_bundle_name(images))
        writer.check_output_dir(output, opts.force)
        # the one plan of what a delta leaves out: what is not downloaded, the download order, bundle.json
        delta = None if have is None else DeltaPlan.make(have, base, images)
        skip: Set[Digest] = set()
        left_out: List[heldblobs.LeftOut] = []
        held: Dict[Digest, Descriptor] = {}
        if delta is not None:
            # before downloading: a delta the offline store could not hold whole is refused at no cost
            left_out, held = heldblobs.held_blobs(images, delta, config, opts.mirror, store, progress,
                                                  opts.probe_timeout, clients)
            skip = _not_downloaded(images, delta, progress)
        check_space(images, store, output, skip, opts.layers, opts.compress, tool)
        locks.enter_context(dirlock.lock_output(output, "fetch"))  # a second run into it refuses, naming this one
        # The bundle is written while the layers download: the writer takes each blob, in archive order,
        # as soon as the store has it, so the disk writes the bundle while the network is still busy.
        pull = _Pulling(pulled, store, progress, (opts.jobs, opts.max_connections), skip,
                        writer.archive_order(images, delta))
        written = _Written(output, opts, store, progress, delta, gzip, tool)
        images, result = written.while_pulling(pull, images, skip, left_out, held)
        stats = pull.finish()
        signed = signature.sign_written(output, opts.sign_key, result.bundle_json_sha256) if opts.sign_key \
            else None
        return FetchResult(images, stats, result, signed)


def _platform_images(resolutions: Sequence[Resolution], opts: FetchOptions, store: Store
                     ) -> List[Tuple[PulledImage, list]]:
    """Each reference's image for each platform asked (index -> manifest -> config, into the store), checked
    against the lock, with the sources that serve it."""
    pulled = []
    for res in resolutions:
        for platform in opts.platforms:
            image = resolve_image(res, platform, store)
            if opts.lock:
                opts.lock.check(image, platform)
            pulled.append((image, res.sources))
    return pulled


@dataclass
class _Written:
    """The bundle written while the layers download: what it needs besides the images."""

    output: Path
    opts: FetchOptions
    store: Store
    progress: Progress
    delta: Optional[DeltaPlan]
    gzip: "gz.Gzip"
    tool: Dict[str, Path]

    def while_pulling(self, pull: "_Pulling", images: List[PulledImage], skip: Set[Digest],
                      left_out: List["heldblobs.LeftOut"], held: Dict[Digest, Descriptor]
                      ) -> Tuple[List[PulledImage], "BundleResult"]:
        """Rewrite the layers --layers asks to (as each arrives), then write the bundle, the layers kept as
        served checked against their diff_ids before it is sealed where asked (--check-diff-ids) or free; every
        path ends the download."""
        from .bundle import writer

        opts, store, progress = self.opts, self.store, self.progress
        check = None
        try:  # from the download thread's start on: every path, LayerCheck's set-up included, ends it
            check = transcode.LayerCheck(images, opts.layers, pull.blob_path, store, skip,
                                         unpack=opts.check_diff_ids)
            rewrites = any(transcode.changes(im, opts.layers, skip) for im in images)
            gzipped = opts.layers == "compat" and rewrites  # the rewritten layers are gzip (bundle.json says by what)
            if rewrites:
                # the rewritten layers' digests and sizes decide the archive's layout: known only once rewritten,
                # each as soon as its blob is downloaded; a gzip image (compat) never comes here
                images = transcode.transcode_images(images, opts.layers, pull.blob_path, store, progress, skip,
                                                    gzip=self.gzip, order=writer.archive_order(images, self.delta))
            if left_out:
                images = transcode.name_held_blobs(images, left_out, held, opts.layers, store, progress)
            result = writer.write_bundle(self.output, images, pull.blob_path, chunk_size=opts.chunk_size,
                                         compress=opts.compress, force=opts.force, progress=progress,
                                         gzip=self.gzip, gzipped_layers=gzipped,
                                         delta=self.delta, created=opts.created, extra_files=self.tool,
                                         verified=pull.stats.fresh, before_seal=check.wait)
        except BaseException:
            pull.cancel()  # finished layers and partial ones stay in the cache for the next run
            raise
        finally:
            if check is not None:
                check.close()  # after pull.cancel: a check waiting for a blob wakes when the download ends
        return images, result


def _check_input(config: MirrorConfig, opts: FetchOptions, clients: Clients) -> Tuple[Optional[Have], Optional[dict]]:
    """Everything fetch can refuse before any work (exit 2): the options, the output directory, the
    signing key, --have/--base, each reference and --mirror; returns what --have/--base read."""
    from .bundle import signature, writer

    if not opts.refs:
        raise UsageError("nothing to fetch: give at least one image reference")
    if opts.jobs < 1 or opts.jobs > 64:
        raise UsageError(f"invalid --connections {opts.jobs}: use 1 to 64")
    if opts.max_connections < 1 or opts.max_connections > 256:
        raise UsageError(f"invalid --max-connections {opts.max_connections}: use 1 to 256")
    if opts.layers not in transcode.MODES:
        raise UsageError(f"invalid --layers {opts.layers!r}: use one of {', '.join(transcode.MODES)}")
    gz.compressor(opts.gzip_level, opts.gzip_library)  # a bad --gzip-level or --gzip-library: exit 2 before any work
    if opts.output is not None:
        writer.check_output_dir(Path(opts.output), opts.force)
    if opts.sign_key:
        signature.check_key(opts.sign_key)
    have, base = read_have(opts.have, opts.base)
    for text in opts.refs:  # bad input (reference, --mirror) is exit 2 before any work
        sources_for(config.parse_ref(text), config, opts.mirror, clients)
    return have, base


def _not_downloaded(images: Sequence[PulledImage], delta: DeltaPlan, progress: Progress) -> Set[Digest]:
    """The layer blobs a delta leaves out of every image (none needs them): not downloaded."""
    from .bundle import writer

    planned = writer.bundle_images(images, delta)
    omitted = {x.digest for im in planned for x in im.layers if x.omitted}
    skip = omitted - {x.digest for im in planned for x in im.layers if not x.omitted}
    if skip:
        progress.note(f"delta against {delta.have.what}: {len(skip)} layers are already on the offline side "
                      "and are not downloaded")
    return skip


def check_space(images: Sequence[PulledImage], store: Store, output: Path, skip, layers: str, compress: str,
                extra_files) -> None:
    """Refuse up front when the cache's or the output's file system has less free space than the fetch
    will write (one file system holding both counts once for both); raises ImgtoolError (exit 1, as
    load's space refusal).

    From the manifests' sizes: the cache needs the blobs it lacks (less what a killed run left in
    partial/) plus the copy of each layer `layers` rewrites; the output needs every blob the bundle
    holds and the extra files, with --compress only the layers that stay compressed. A rewritten
    layer's size is not known before it is written: a zstd layer as gzip (compat) is counted at
    model.GZIP_PER_ZSTD times its size, a layer unpacked (plain) at model.UNPACKED_PER_COMPRESSED
    times. Layers a delta leaves out (`skip`) need nothing."""
    from .model import GZIP_PER_ZSTD, UNPACKED_PER_COMPRESSED, format_size

    cache_need, out_need, rewritten = _space_needed(images, store, skip, layers, compress)
    out_need += sum(Path(p).stat().st_size for p in extra_files.values())
    out_fs = output
    while not out_fs.exists() and out_fs.parent != out_fs:
        out_fs = out_fs.parent
    try:
        same = os.stat(store.root).st_dev == os.stat(out_fs).st_dev
        free = {"cache": _free(store.root), "out": _free(out_fs)}
    except OSError:
        return  # nothing to measure with: the writes say what is wrong, as before
    estimated = {"compat": f" (zstd layers rewritten as gzip are counted at {GZIP_PER_ZSTD:g}x their size)",
                 "plain": f" (layers unpacked are counted at {UNPACKED_PER_COMPRESSED:g}x their compressed size)"}
    hint = SPACE_HINT.format(estimated[layers] if rewritten else "")
    if same and cache_need + out_need > free["cache"]:
        raise ImgtoolError(f"not enough space: fetch needs {format_size(cache_need)} in {store.root} and "
                           f"{format_size(out_need)} in {output} ({format_size(free['cache'])} free)", hint=hint)
    short = [f"{format_size(need)} in {where} ({format_size(free[key])} free)"
             for key, need, where in (("cache", cache_need, store.root), ("out", out_need, output))
             if not same and need > free[key]]
    if short:
        raise ImgtoolError("not enough space: fetch needs " + " and ".join(short), hint=hint)


def _space_needed(images: Sequence[PulledImage], store: Store, skip, layers: str, compress: str
                  ) -> Tuple[int, int, bool]:
    """(bytes the cache needs, bytes the output needs without the extra files, whether a layer is rewritten)."""
    from .model import GZIP_PER_ZSTD, LAYER_COMPRESSION, UNPACKED_PER_COMPRESSED

    blobs = {}
    for im in images:
        blobs[im.manifest.config.digest] = (im.manifest.config.size, "")
        blobs.update((d.digest, (d.size, d.media_type)) for d in im.manifest.layers if d.digest not in skip)
    rewritten = {im.manifest.layers[i].digest for im in images for i in transcode.changes(im, layers, skip)}
    cache_need = out_need = 0
    for digest, (size, media_type) in blobs.items():
        if not store.has(digest, size):
            cache_need += size - store.partial_bytes(digest, size)
        if digest in rewritten:
            new = int(size * (GZIP_PER_ZSTD if layers == "compat" else UNPACKED_PER_COMPRESSED))
            cache_need += new
            # in the bundle: as rewritten, or (plain, --compress) compressed again, about as it came
            out_need += new if layers == "compat" or compress == "none" else size
        elif compress == "none" or (media_type and LAYER_COMPRESSION.get(media_type) != "none"):
            out_need += size
    return cache_need, out_need, bool(rewritten)


SPACE_HINT = "free space there, or point IMGTOOL_CACHE or --output at a bigger disk{}; nothing was downloaded"


def _free(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


class _Pulling:
    """`download` on a thread; `blob_path` waits for a blob (or raises the download's error)."""

    def __init__(self, pulled, store: Store, progress: Progress, jobs: Tuple[int, int], skip, order):
        self.store, self.stats = store, PullStats()
        self.error: Optional[BaseException] = None
        self.stop = threading.Event()
        self.ended = False  # the download thread has returned (or raised)
        self.thread = threading.Thread(target=self._run, args=(pulled, progress, jobs, skip, order),
                                       name="download", daemon=True)
        self.thread.start()

    def _run(self, pulled, progress, jobs: Tuple[int, int], skip, order) -> None:
        try:  # jobs: (connections per source, at most at once)
            download(pulled, self.store, progress, jobs=jobs[0], skip=skip, stats=self.stats, order=order,
                     cancel=self.stop, connections=jobs[1])
        except BaseException as e:  # raised in the main thread by blob_path/finish
            self.error = e
        finally:
            self.ended = True
            self.store.announce()  # a writer waiting for a blob that will not come wakes up

    def blob_path(self, digest: Digest) -> Path:
        """The blob's path once the store has it; raises the download's error if it ended without it."""
        self.store.wait_for(digest, lambda: self.ended)
        if self.error is not None:
            raise self.error
        return self.store.blob_path(digest)

    def cancel(self) -> None:
        """Stop downloading (the writer failed): every started blob's partial record is kept."""
        self.stop.set()
        self.thread.join()

    def finish(self) -> PullStats:
        self.thread.join()
        if self.error is not None:
            raise self.error
        return self.stats


def read_have(inventory: Optional[Path], base: Optional[Path]) -> Tuple[Optional[Have], Optional[dict]]:
    """The chains the offline side holds, from `--have FILE` and/or `--base DIR`; raises UsageError/VerifyError."""
    from .bundle.reader import read_index

    have: Optional[Have] = None
    described = []
    if inventory is not None:
        path = Path(inventory)
        try:
            with open_regular(path) as f:
                data = f.read()
        except NotRegularFile as e:
            raise UsageError(f"the inventory {path} is not a regular file ({e.kind})") from None
        except OSError as e:
            raise UsageError(f"cannot read the inventory {path}: {e.strerror or e}",
                             hint="write it on the offline host with `imgtool inventory -o FILE`") from e
        have = have_from_inventory(Inventory.from_bytes(data, str(path)), f"inventory {path.name}")
        described.append(("inventory", path.name))
    if base is not None:
        index, _ = read_index(Path(base))
        from_bundle = Have(f"base bundle {Path(base).name}")
        for im in index.images:
            from_bundle.add([x.diff_id for x in im.layers], im.ref, str(im.platform))
            from_bundle.add_blobs([x.diff_id for x in im.layers],
                                  [Descriptor(x.media_type, x.digest, x.size) for x in im.layers])
        if have is None:
            have = from_bundle
        else:
            have.merge(from_bundle)
        described.append(("bundle", Path(base).name))
    if have is None:
        return None, None
    kind = "+".join(k for k, _ in described)
    return have, {"kind": kind, "name": " + ".join(n for _, n in described)}


# --- inspect ---------------------------------------------------------------
