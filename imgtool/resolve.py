"""Reference -> platform manifest -> config, digest-checked, without a daemon: what `download` needs.

`resolve_image` fetches the index and the platform manifest by digest from the first source that
has them, and the config (a small blob) into the store; the blobs themselves are the puller's.
Connected side only: the offline verbs never import it. What the registry room's transport raises
reaches here as RegistryError, never as the transport's own types.
"""

from typing import TYPE_CHECKING, List, Optional, Sequence, Tuple

from .errors import ImgtoolError, ManifestError, NotFoundError, RegistryError, UsageError
from .mirrors import Clients, Resolution, Source, resolve, sources_for
from .model import Descriptor, Digest, ImageConfig, ImageRef, Index, Manifest, Platform, PulledImage, parse_manifest
from .progress import Progress
from .store import Store

if TYPE_CHECKING:
    from .config import MirrorConfig


def _manifest_from(sources: Sequence[Source], digest: Digest, what: str) -> Tuple[bytes, str, Source]:
    """Fetch manifest bytes by digest from the first source that has them (digest-checked)."""
    errors = []
    for s in sources:
        try:
            data, ctype, _ = s.client.manifest(s.repository, str(digest), expect=digest)
            return data, ctype, s
        except ImgtoolError as e:
            errors.append(f"{s.describe()}: {e.message}")
    raise RegistryError(f"cannot fetch the {what} {digest.short} from any source: "
                        + ("; ".join(errors) or "no source is left that serves it"))


def resolve_image(resolution: Resolution, platform: Platform, store: Store) -> PulledImage:
    """Index -> platform manifest -> config, all digest-checked; config lands in the store.

    Raises UsageError (platform missing, single-arch image of another platform),
    ManifestError, RegistryError.
    """
    ref = resolution.ref
    data, ctype, source = _manifest_from(resolution.sources, resolution.digest, "manifest")
    parsed = parse_manifest(data, ctype)
    index_digest = None
    index_bytes, index_media_type = None, ""
    listed = None  # the platform the index says the chosen manifest is for
    if isinstance(parsed, Index):
        index_digest, index_bytes, index_media_type = resolution.digest, data, parsed.media_type
        try:
            entry = parsed.select(platform)
        except UsageError as e:
            raise UsageError(f"{ref.tagged}: {e.message}", hint="choose one with --arch or --platform") from e
        data, ctype, source = _manifest_from([source] + [s for s in resolution.sources if s is not source],
                                             entry.digest, f"{entry.platform} manifest")
        parsed = parse_manifest(data, ctype)
        if not isinstance(parsed, Manifest):
            raise ManifestError(f"{ref.tagged}: the index entry for {entry.platform} is not an image manifest")
        manifest_digest, listed = entry.digest, entry.platform
    else:
        manifest_digest = resolution.digest
    manifest: Manifest = parsed
    config_bytes = fetch_small_blob(resolution.sources, manifest.config, store)
    try:
        config = ImageConfig.parse(config_bytes)
    except ManifestError as e:
        raise e.restated(f"{ref.tagged}: {e.message}") from e
    if index_digest is None and not config.platform.satisfies(platform):
        raise UsageError(
            f"{ref.tagged} is a single-platform image for {config.platform}, not {platform}",
            hint=f"use --platform {config.platform} if that is what you want; imgtool never copies the wrong architecture silently",
        )
    if listed is not None and not (config.platform.agrees(listed) and config.platform.satisfies(platform)):
        raise ManifestError(
            f"{ref.tagged}: the image index lists manifest {manifest_digest.short} as {listed}, but its config "
            f"says {config.platform}; refusing it for {platform}",
            hint=f"the source that served it ({source.describe()}) is inconsistent: try another with --mirror NAME, "
                 "or tell the image's publisher")
    if len(config.diff_ids) != len(manifest.layers):
        raise ManifestError(f"{ref.tagged}: the config lists {len(config.diff_ids)} diff_ids for {len(manifest.layers)} layers")
    return PulledImage(
        ref=ref, source=source.describe(), platform=config.platform if index_digest is None else platform_of(config, platform),
        index_digest=index_digest, manifest_digest=manifest_digest, manifest_bytes=data, manifest=manifest,
        config_bytes=config_bytes, config=config, index_bytes=index_bytes, index_media_type=index_media_type,
    )


def platform_of(config: ImageConfig, wanted: Platform) -> Platform:
    """The platform to record: the config's, completed with the requested variant."""
    p = config.platform
    return Platform(p.os, p.architecture, p.variant or (wanted.variant if p.architecture == wanted.architecture else None))


def fetch_small_blob(sources: Sequence[Source], desc: Descriptor, store: Store) -> bytes:
    """A config (or other small blob) from the store, or from the first source that serves it, checked
    against its digest and kept in the store; raises RegistryError, VerifyError."""
    if store.has(desc.digest, desc.size):
        return store.read_bytes(desc.digest)
    errors = []
    for s in sources:
        try:
            with s.client.blob(s.repository, desc.digest) as blob:
                data = blob.read_up_to(desc.size + 1)
            got = Digest.of(data)
            if len(data) != desc.size or got != desc.digest:
                errors.append(f"{s.describe()}: config blob: expected {desc.digest} ({desc.size} bytes), got {got} "
                              f"({len(data)}{'+' if len(data) > desc.size else ''} bytes)")
                continue
            store.put_bytes(data, desc.digest)
            return data
        except ImgtoolError as e:
            errors.append(f"{s.describe()}: {e.message}")
    raise RegistryError(f"cannot fetch config {desc.digest.short} from any source: "
                        + ("; ".join(errors) or "no source is left that serves it"))


def resolve_refs(config: "MirrorConfig", refs: Sequence[str], mirror: str, progress: Progress,
                 timeout: float = 5.0, pins=None, clients: Optional[Clients] = None) -> List[Resolution]:
    """Parse every reference (all first, so a typo fails before any network) and resolve each.

    `pins` (canonical name -> Digest, from bundle.lock) resolves those by digest, keeping the tag;
    `clients`: the run's registry clients (None: new ones).
    """
    parsed: List[ImageRef] = []
    for text in refs:
        ref = config.parse_ref(text)
        if pins and str(ref) in pins:
            ref = ref.with_digest(pins[str(ref)])
        if ref not in parsed:
            parsed.append(ref)
    out = []
    for ref in parsed:
        sources = sources_for(ref, config, mirror, clients)
        try:
            res = resolve(ref, sources, timeout)
        except NotFoundError as e:
            if pins and ref.tag and str(ref.with_digest(None)) in pins:
                raise e.restated(hint="bundle.lock pins a digest no source serves any more: imgtool lock --update -f SPEC") from e
            raise
        for note in res.notes:
            progress.note(note)
        for warning in res.warnings:
            progress.warn(warning)
        progress.note(f"{ref.tagged}: {res.digest} via {', '.join(s.name for s in res.sources)}")
        out.append(res)
    return out
