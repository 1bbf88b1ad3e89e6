"""`imgtool inspect`: a reference's platforms, sizes and layer counts, and which source answered; for a model
reference (hf:ORG/NAME[@REV], modelscope:...), the commit, every endpoint's answer, and each file's size and sha256.

A core function taking plain values and a Progress and returning plain values; commands/ formats them.
"""

from dataclasses import dataclass
from typing import TYPE_CHECKING, List

from .config import HubEnvironment, MirrorConfig
from .errors import ImgtoolError
from .mirrors import Resolution, Source
from .model import Digest, ImageRef, Index, Manifest, Platform, parse_manifest
from .progress import Progress
from .resolve import resolve_image, resolve_refs
from .store import Store

if TYPE_CHECKING:
    from .hubs import HubResolution


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


def inspect(config: MirrorConfig, text: str, mirror: str, store: Store, progress: Progress,
            timeout: float = 5.0) -> InspectResult:
    """Platforms, sizes and layer counts of a reference, and which source answered; a single-arch image's
    config is read through `store`."""
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
                store.create()
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
    from .resolve import fetch_small_blob

    return ImageConfig.parse(fetch_small_blob([source], manifest.config, store)).platform


def inspect_model(config: MirrorConfig, env: HubEnvironment, text: str, mirror: str, store: Store, progress: Progress,
                  timeout: float = 5.0) -> "HubResolution":
    """A model reference resolved: its commit, what every endpoint answered, and each file with its size and sha256
    (a small git file the hub lists without one is read whole through `store` to hash it, as fetch does). Raises
    UsageError (a malformed reference), NotFoundError, RegistryError, ManifestError, VerifyError."""
    from .model_pull import resolve_models
    from .weights import parse_model_ref

    ref = parse_model_ref(text)
    store.create()
    (res,) = resolve_models([ref], config, env, store, progress, mirror=mirror, timeout=timeout)
    return res
