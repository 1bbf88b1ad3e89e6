"""The connected side: `fetch` (references -> bundle), `inspect`, and the mirror report.

Each is a core function taking plain values and a Progress and returning plain values;
cli.py formats them.
"""

from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional, Sequence

from .config import MirrorConfig, cache_dir
from .errors import ImgtoolError, UsageError
from .mirrors import Probe, Resolution, Source, probe, resolve, sources_for
from .model import (Digest, ImageRef, Index, Manifest, Platform, PulledImage, parse_manifest)
from .progress import Progress
from .puller import PullStats, download, resolve_image
from .store import Store


@dataclass
class FetchOptions:
    """Everything `imgtool fetch` was asked to do."""

    refs: Sequence[str]
    platforms: Sequence[Platform]
    output: Optional[Path] = None
    mirror: str = "auto"
    chunk_size: Optional[int] = None
    compress: str = "none"
    jobs: int = 4
    force: bool = False
    probe_timeout: float = 5.0


@dataclass
class FetchResult:
    images: List[PulledImage]
    stats: PullStats
    bundle: object  # bundle.writer.BundleResult
    notes: List[str] = field(default_factory=list)


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


def resolve_refs(config: MirrorConfig, refs: Sequence[str], mirror: str, progress: Progress,
                 timeout: float = 5.0) -> List[Resolution]:
    """Parse every reference (all first, so a typo fails before any network) and resolve each."""
    parsed: List[ImageRef] = []
    for text in refs:
        ref = config.parse_ref(text)
        if ref not in parsed:
            parsed.append(ref)
    out = []
    for ref in parsed:
        sources = sources_for(ref, config, mirror)
        res = resolve(ref, sources, timeout)
        for note in res.notes:
            progress.warn(note) if "stale" in note else progress.note(note)
        progress.note(f"{ref.tagged}: {res.digest} via {', '.join(s.name for s in res.sources)}")
        out.append(res)
    return out


def fetch(config: MirrorConfig, opts: FetchOptions, progress: Progress) -> FetchResult:
    """Resolve, pull into the cache, and write a bundle. Raises ImgtoolError subclasses."""
    from .bundle import writer

    if not opts.refs:
        raise UsageError("nothing to fetch: give at least one image reference")
    if opts.jobs < 1 or opts.jobs > 64:
        raise UsageError(f"invalid --jobs {opts.jobs}: use 1 to 64")
    if opts.output is not None:
        writer.check_output_dir(Path(opts.output), opts.force)
    store = Store(cache_dir())
    resolutions = resolve_refs(config, opts.refs, opts.mirror, progress, opts.probe_timeout)
    progress.note("platform: " + ", ".join(str(p) for p in opts.platforms)
                  + (" (this host's)" if list(opts.platforms) == [Platform.host()] else ""))
    pulled: List[tuple] = []
    for res in resolutions:
        for platform in opts.platforms:
            image = resolve_image(res, platform, store)
            pulled.append((image, res.sources))
    images = [img for img, _ in pulled]
    output = Path(opts.output) if opts.output else Path(writer.default_bundle_name(images))
    writer.check_output_dir(output, opts.force)
    stats = download(pulled, store, progress, jobs=opts.jobs)
    result = writer.write_bundle(output, images, store.blob_path, chunk_size=opts.chunk_size,
                                 compress=opts.compress, force=opts.force, progress=progress)
    return FetchResult(images, stats, result)


# --- inspect ---------------------------------------------------------------


@dataclass
class PlatformSummary:
    platform: Platform
    manifest_digest: Digest
    size: int
    layers: int


@dataclass
class InspectResult:
    ref: ImageRef
    digest: Digest
    media_type: str
    source: Source
    platforms: List[PlatformSummary]
    notes: List[str]


def inspect(config: MirrorConfig, text: str, mirror: str, progress: Progress, timeout: float = 5.0) -> InspectResult:
    """Platforms, sizes and layer counts of a reference, and which source answered."""
    res = resolve_refs(config, [text], mirror, progress, timeout)[0]
    errors = []
    for source in res.sources:
        try:
            data, ctype, _ = source.client.manifest(source.repository, str(res.digest), expect=res.digest)
            parsed = parse_manifest(data, ctype)
            summaries = []
            if isinstance(parsed, Index):
                for entry in parsed.manifests:
                    if entry.platform is None or entry.platform.architecture == "unknown":
                        continue
                    mdata, mtype, _ = source.client.manifest(source.repository, str(entry.digest), expect=entry.digest)
                    m = parse_manifest(mdata, mtype)
                    if isinstance(m, Manifest):
                        summaries.append(PlatformSummary(entry.platform, entry.digest, m.size, len(m.layers)))
            else:
                store = Store(cache_dir())
                image = resolve_image(Resolution(res.ref, res.digest, [source], res.probes, []),
                                      _any_platform_of(parsed, source, store), store)
                summaries.append(PlatformSummary(image.platform, res.digest, parsed.size, len(parsed.layers)))
            return InspectResult(res.ref, res.digest, parsed.media_type, source, summaries, res.notes)
        except ImgtoolError as e:
            errors.append(f"{source.describe()}: {e.message}")
    raise ImgtoolError("cannot inspect: " + "; ".join(errors))


def _any_platform_of(manifest: Manifest, source: Source, store: Store) -> Platform:
    """The platform of a single-arch image, read from its config."""
    from .model import ImageConfig
    from .puller import _fetch_small_blob

    return ImageConfig.parse(_fetch_small_blob([source], manifest.config, store)).platform


# --- mirrors report --------------------------------------------------------


def mirror_report(config: MirrorConfig, text: Optional[str], timeout: float = 5.0) -> List[Probe]:
    """Probe every source for a reference (default: the default image's `latest`)."""
    ref = config.parse_ref(text) if text else config.parse_ref("latest")
    return probe(sources_for(ref, config), ref, timeout)
