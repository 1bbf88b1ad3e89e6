"""The connected side's main job: `fetch`, references -> a verified bundle.

A core function taking plain values and a Progress and returning plain values; commands/ formats
them. `imgtool inspect` is inspection.py, the mirror report (`imgtool mirrors`) mirror_report.py.
"""

import dataclasses
import os
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence, Tuple

from . import dirlock, gz, heldblobs, model_pull, transcode
from .config import HubEnvironment, MirrorConfig
from .delta import DeltaPlan, Have
from .errors import ImgtoolError, Interrupted, UsageError
from .mirrors import Clients, Resolution, sources_for
from .model import Descriptor, Digest, Platform, PulledImage, format_size
from .progress import Progress
from .ends.bundle_dest import BundleDestination, Bundled, read_have
from .ends.hub_source import RegistryAndHubs
from .weights import ModelRef, is_model_ref, parse_model_ref
from .pipeline import Plan, copy
from .puller import CONNECTIONS, HUB_CONNECTIONS, HUB_JOBS, JOBS, PullStats
from .resolve import resolve_image, resolve_refs
from .selfbundle import bundle_tool
from .store import Store

if TYPE_CHECKING:  # imported where used: spec and the writer are needed only by some verbs
    from .bundle.format import BundleModel
    from .hubs import HubResolution
    from .pipeline import Source
    from .bundle.signature import Signed
    from .bundle.writer import BundleResult
    from .spec import Lock


RESUME_HINT = "run the same command again to resume: it downloads only what is missing and finishes the bundle"


@dataclass
class FetchOptions:
    """Everything `imgtool fetch` was asked to do."""

    refs: Sequence[str]
    platforms: Sequence[Platform]
    output: Optional[Path] = None
    mirror: str = "auto"
    chunk_size: Optional[int] = None
    compress: str = "none"
    jobs: Optional[int] = None  # connections per source (--connections); None: JOBS per registry, HUB_JOBS per hub
    # connections at once over every source (--max-connections); None: CONNECTIONS over registries, HUB_CONNECTIONS
    # over a model's hub endpoints
    max_connections: Optional[int] = None
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
    hubs: Optional[HubEnvironment] = None  # the model hubs' endpoints and tokens (config.hub_environment); None: none
    modelcar: bool = True  # record each model file's modelcar layer digest (modelcar.py), hashed as its bytes pass

    def connections(self) -> Tuple[int, int]:
        """(connections per registry source, per model hub endpoint): --connections for both, else JOBS and HUB_JOBS."""
        return self.jobs or JOBS, self.jobs or HUB_JOBS

    def caps(self) -> Tuple[int, int]:
        """(connections at once over the registries, over a model's hub endpoints): --max-connections for both, else
        CONNECTIONS and HUB_CONNECTIONS."""
        return self.max_connections or CONNECTIONS, self.max_connections or HUB_CONNECTIONS


@dataclass
class FetchResult:
    images: List[PulledImage]
    stats: PullStats
    bundle: "BundleResult"
    signed: Optional["Signed"] = None  # with sign_key
    models: List["BundleModel"] = dataclasses.field(default_factory=list)


def split_refs(refs: Sequence[str]) -> Tuple[List[str], List[ModelRef]]:
    """(image references, model references) of what fetch was given, each as given, in order; raises UsageError
    for a malformed model reference."""
    images: List[str] = []
    models: List[ModelRef] = []
    for text in refs:
        if is_model_ref(text):
            ref = parse_model_ref(text)
            if ref not in models:
                models.append(ref)
        else:
            images.append(text)
    return images, models


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
        image_refs, model_refs = split_refs(opts.refs)
        resolutions = resolve_refs(config, image_refs, _image_mirror(config, opts.mirror), progress, opts.probe_timeout,
                                   pins=opts.lock.pins() if opts.lock else None, clients=clients) if image_refs else []
        hubs = _resolve_models(config, opts, model_refs, store, progress)
        # After resolving (a dead network fails in a fraction of a second, not after building the pyz),
        # before downloading (a failure here costs no download).
        tool = bundle_tool(store.root, progress) if opts.tool else {}
        if image_refs:
            progress.note("platform: " + ", ".join(str(p) for p in opts.platforms)
                          + (" (this host's)" if list(opts.platforms) == [Platform.host()] else ""))
        pulled = _platform_images(resolutions, opts, store)
        images = [img for img, _ in pulled]
        models = _bundle_models(hubs, have, progress, opts.modelcar)
        output = Path(opts.output) if opts.output else Path(writer.default_bundle_name(images, models))
        writer.check_output_dir(output, opts.force)
        # the one plan of what a delta leaves out: what is not downloaded, the download order, bundle.json
        delta = None if have is None else DeltaPlan.make(have, base, images)
        left_out: List[heldblobs.LeftOut] = []
        held: Dict[Digest, Descriptor] = {}
        if delta is not None:
            # before downloading: a delta the offline store could not hold whole is refused at no cost
            left_out, held = heldblobs.held_blobs(images, delta, config, opts.mirror, store, progress,
                                                  opts.probe_timeout, clients)
        # The bundle is written while the layers download: the destination takes each blob, in archive order, as
        # soon as the cache has it, so the disk writes the bundle while the network is still busy. An uncompressed
        # bundle of the layers as served goes further: each layer is downloaded straight into its place in the
        # archive, written once (bundle/regions.py), and the cache only remembers where it is.
        # Model files go the same way after the layers (their members follow the images'): into their regions of an
        # uncompressed archive, else through the cache (--compress: the archive is one compressed stream).
        carried = [model_pull.carrying(res, {f.sha256 for f in m.files if f.omitted}) for res, m in zip(hubs, models)]
        (registry_jobs, hub_jobs), (registry_cap, hub_cap) = opts.connections(), opts.caps()
        source = RegistryAndHubs(pulled, carried, store, progress, (registry_jobs, registry_cap), hub_jobs, hub_cap)

        def room(plan: "Plan[Bundled]") -> None:  # before the first byte: the cache's and the output's free space
            check_space(plan.images, store, output, plan.held, opts.layers, opts.compress, tool, plan.regions,
                        [(f.sha256, f.size) for m in models for f in m.carried])

        destination = BundleDestination(output, progress, chunk_size=opts.chunk_size, compress=opts.compress,
                                        force=opts.force, gzip=gzip, delta=delta, created=opts.created,
                                        extra_files=tool, place=_placeable(opts, images, left_out), check=room,
                                        models=models, modelcar=opts.modelcar)
        locks.enter_context(dirlock.lock_output(output, "fetch"))  # a second run into it refuses, naming this one
        layers = _Layers(opts, store, progress, gzip, left_out, held)
        try:
            copied = copy(source, destination, layers)
        except KeyboardInterrupt:
            if destination.regions is None:
                raise  # the command says what the cache keeps
            raise Interrupted(f"interrupted: finished layers and partial downloads are kept in the unfinished bundle "
                              f"{output} (it has no bundle.json)", hint=RESUME_HINT) from None
        finally:
            layers.close()  # after the source's cancel: a check waiting for a blob wakes when the download ends
        if copied.plan.regions is not None:
            _remember_places(store, copied.plan.regions, copied.result)
        signed = signature.sign_written(output, opts.sign_key, copied.result.bundle_json_sha256) if opts.sign_key \
            else None
        return FetchResult(list(copied.plan.images), copied.stats, copied.result, signed, copied.result.models)


def _resolve_models(config: MirrorConfig, opts: FetchOptions, refs: Sequence[ModelRef], store: Store,
                    progress: Progress) -> List["HubResolution"]:
    """The model references resolved (pinned by bundle.lock where it names them) and completed."""
    if not refs:
        return []
    pins = opts.lock.model_pins() if opts.lock else None
    out = model_pull.resolve_models(refs, config, opts.hubs or HubEnvironment(), store, progress, mirror=opts.mirror,
                                    timeout=opts.probe_timeout, pins=pins)
    for res in out:  # a pinned commit's files are exactly the lock's: another sha256 is refused, naming the file
        if opts.lock:
            opts.lock.check_model(res.ref.asked, [(f.path, f.size, f.sha256) for f in res.snapshot.files])
    return out


def _bundle_models(hubs: Sequence["HubResolution"], have: Optional[Have], progress: Progress,
                   modelcar: bool = True) -> List["BundleModel"]:
    """bundle.json's models: each file the other side holds by sha256 (--have, --base) marked omitted, with its
    modelcar layer digest from the base bundle (the carried files' are hashed as the bundle is written)."""
    from .bundle.format import bundle_model

    out = []
    held = have.model_files if have is not None else {}
    for res in hubs:
        omitted = {f.sha256 for f in res.snapshot.files if f.sha256 in held}
        if omitted:
            size = sum(f.size for f in res.snapshot.files if f.sha256 in omitted)
            progress.note(f"delta against {have.what if have else ''}: {len(omitted)} files of {res.ref} "
                          f"({format_size(size)}) are already on the offline side and are not downloaded")
        model = bundle_model(res.snapshot, model_pull.source_of(res), omitted)
        out.append(_base_layers(model, have, progress) if modelcar and omitted and have is not None else model)
    return out


def _base_layers(model: "BundleModel", have: Have, progress: Progress) -> "BundleModel":
    """`model` with its left-out files' modelcar layer digests from the base (a base bundle's, or an inventory's of
    a runtime holding the old revision's modelcar); a file the base records none for (a model placed as files)
    leaves the model without the modelcar form (said once): a layer's digest needs the file's bytes, which a delta
    does not carry."""
    files = [f if not f.omitted else dataclasses.replace(f, modelcar=have.modelcar_layers.get((f.sha256, f.path)))
             for f in model.files]
    lacking = [f.path for f in files if f.omitted and f.modelcar is None]
    if lacking:
        progress.warn(f"{model.ref}: no modelcar form in this delta: {have.what} records no modelcar layer for "
                      f"{lacking[0]}" + (f" and {len(lacking) - 1} more" if len(lacking) > 1 else "")
                      + " (a model placed as files, or a bundle fetched without it); the ModelPack artifact is carried")
        return model
    return dataclasses.replace(model, files=tuple(files))


def _image_mirror(config: MirrorConfig, mirror: str) -> str:
    """--mirror for the images: a [[model_mirrors]] name forces the models' source only."""
    return "auto" if any(m.name == mirror for m in config.model_mirrors) else mirror


def _placeable(opts: FetchOptions, images: Sequence[PulledImage], left_out) -> bool:
    """Whether each layer can be downloaded straight into the archive: an uncompressed one, holding every layer as
    served (none rewritten, none unpacked to check it, no manifest renamed for a delta's held blobs)."""
    return (opts.compress == "none" and not opts.check_diff_ids and not any(left_out)
            and not any(transcode.changes(im, opts.layers, ()) for im in images))


def _remember_places(store: Store, regions, result: "BundleResult") -> None:
    """The cache learns where the bundle holds each layer it downloaded there (a later fetch copies it from there)."""
    names = [p.name for p in result.parts]
    for digest, (_, size) in regions.blobs.items():
        store.locate(digest, size, regions.regions(digest, names))


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


class _Layers:
    """fetch's layer transform (pipeline.Transform): the layers --layers asks to rewrite, rewritten as each arrives
    (their digests and sizes decide the archive's layout); the layers kept as served checked against their
    diff_ids before the bundle is sealed where asked (--check-diff-ids) or free; a delta's held blobs named."""

    def __init__(self, opts: FetchOptions, store: Store, progress: Progress, gzip: "gz.Gzip",
                 left_out: List["heldblobs.LeftOut"], held: Dict[Digest, Descriptor]):
        self.opts, self.store, self.progress, self.gzip, self.left_out, self.held = (opts, store, progress, gzip,
                                                                                      left_out, held)
        self.check: Optional[transcode.LayerCheck] = None

    def __call__(self, plan: "Plan[Bundled]", source: "Source") -> "Plan[Bundled]":
        opts, store, progress = self.opts, self.store, self.progress
        images = list(plan.images)

        def path(digest: Digest) -> Path:
            found = source.path(digest)
            if found is None:
                raise UsageError(f"{source.what} holds no file per blob: --layers {opts.layers} cannot rewrite its "
                                 "layers")
            return found

        self.check = transcode.LayerCheck(images, opts.layers, path, store, plan.held, unpack=opts.check_diff_ids,
                                          read_at=plan.regions.read_at if plan.regions is not None else None)
        rewrites = any(transcode.changes(im, opts.layers, plan.held) for im in images)
        if rewrites:  # a gzip image (compat) never comes here
            images = transcode.transcode_images(images, opts.layers, path, store, progress, plan.held,
                                                gzip=self.gzip, order=list(plan.moves))
        if self.left_out:
            images = transcode.name_held_blobs(images, self.left_out, self.held, opts.layers, store, progress)
        return dataclasses.replace(plan, images=tuple(images), destination=Bundled(
            gzipped_layers=opts.layers == "compat" and rewrites, before_seal=self.check.wait))

    def close(self) -> None:
        if self.check is not None:
            self.check.close()


def _check_input(config: MirrorConfig, opts: FetchOptions, clients: Clients) -> Tuple[Optional[Have], Optional[dict]]:
    """Everything fetch can refuse before any work (exit 2): the options, the output directory, the
    signing key, --have/--base, each reference and --mirror; returns what --have/--base read."""
    from .bundle import signature, writer

    if not opts.refs:
        raise UsageError("nothing to fetch: give at least one image or model reference")
    if opts.jobs is not None and (opts.jobs < 1 or opts.jobs > 64):
        raise UsageError(f"invalid --connections {opts.jobs}: use 1 to 64")
    if opts.max_connections is not None and (opts.max_connections < 1 or opts.max_connections > 256):
        raise UsageError(f"invalid --max-connections {opts.max_connections}: use 1 to 256")
    if opts.layers not in transcode.MODES:
        raise UsageError(f"invalid --layers {opts.layers!r}: use one of {', '.join(transcode.MODES)}")
    gz.compressor(opts.gzip_level, opts.gzip_library)  # a bad --gzip-level or --gzip-library: exit 2 before any work
    if opts.output is not None:
        writer.check_output_dir(Path(opts.output), opts.force)
    if opts.sign_key:
        signature.check_key(opts.sign_key)
    have, base = read_have(opts.have, opts.base)
    image_refs, _ = split_refs(opts.refs)  # a malformed model reference: exit 2 here
    for text in image_refs:  # bad input (reference, --mirror) is exit 2 before any work
        sources_for(config.parse_ref(text), config, _image_mirror(config, opts.mirror), clients)
    return have, base


def check_space(images: Sequence[PulledImage], store: Store, output: Path, skip, layers: str, compress: str,
                extra_files, regions=None, model_files: Sequence[Tuple[Digest, int]] = ()) -> None:
    """Refuse up front when the cache's or the output's file system has less free space than the fetch
    will write (one file system holding both counts once for both); raises ImgtoolError (exit 1, as
    load's space refusal).

    From the manifests' sizes: the cache needs the blobs it lacks (less what a killed run left in
    partial/) plus the copy of each layer `layers` rewrites, nothing for a layer written straight into the
    bundle (`regions`); the output needs every blob the bundle holds and the extra files, with --compress only the
    layers that stay compressed. A rewritten
    layer's size is not known before it is written: a zstd layer as gzip (compat) is counted at
    model.GZIP_PER_ZSTD times its size, a layer unpacked (plain) at model.UNPACKED_PER_COMPRESSED
    times. Layers a delta leaves out (`skip`) need nothing."""
    from .model import GZIP_PER_ZSTD, UNPACKED_PER_COMPRESSED, format_size

    cache_need, out_need, rewritten = _space_needed(images, store, skip, layers, compress, regions)
    for digest, size in dict(model_files).items():  # into their regions, else through the cache (--compress)
        if regions is not None and regions.holds(digest):
            out_need += size - (regions.partial_bytes(digest, size) if regions.resumable() else 0)
            continue
        if not store.has(digest, size):
            cache_need += size - store.partial_bytes(digest, size)
        out_need += size if compress == "none" else 0
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


def _space_needed(images: Sequence[PulledImage], store: Store, skip, layers: str, compress: str, regions=None
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
        if regions is not None and regions.holds(digest):  # downloaded into the bundle: counted there
            out_need -= regions.partial_bytes(digest, size) if regions.resumable() else 0
        elif not store.has(digest, size):
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


# --- inspect ---------------------------------------------------------------
