"""`imgtool copy SOURCE DESTINATION`: the pipeline's pairs that no other verb names (issue 37).

An end is written KIND:VALUE:
- `registry:REF`: an image in a registry, resolved through mirrors.toml as `fetch` does (a source);
- `bundle:DIR`: a bundle directory (a source read in place, compressed too; or a destination written);
- `runtime:` (or `runtime:docker|containerd|podman`): the runtime `load` would choose (a destination).

The pairs: registry → runtime (a connected node loads straight from the registry, through the cache: no bundle, the
same checks and landing as `load`), bundle → bundle (cut again for another carrier, compressed or decompressed, a
delta cut offline from a full bundle with `--have`). The pairs other verbs name are refused with the verb to use.
"""

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, List, Optional, Sequence, Tuple

from .errors import UsageError
from .model import Platform
from .pipeline import copy
from .progress import Progress
from .trust import State

if TYPE_CHECKING:
    from .config import MirrorConfig
    from .runtimes.base import Runtime
    from .store import Store

KINDS = ("registry", "bundle", "runtime")
RUNTIME_NAMES = ("", "auto", "docker", "containerd", "podman")
OTHER_VERBS = {("registry", "bundle"): "imgtool fetch REF -o DIR", ("bundle", "runtime"): "imgtool load DIR",
               ("bundle", "registry"): "imgtool push DIR --to HOST/NAMESPACE"}


@dataclass(frozen=True)
class End:
    kind: str  # registry | bundle | runtime
    value: str

    def __str__(self) -> str:
        return f"{self.kind}:{self.value}"


def parse_end(text: str, role: str) -> End:
    """`KIND:VALUE` (source or destination); raises UsageError."""
    kind, sep, value = text.partition(":")
    if not sep or kind not in KINDS:
        raise UsageError(f"invalid {role} {text!r}: use registry:REF, bundle:DIR or runtime:[NAME]",
                         hint="e.g. imgtool copy registry:v0.22.1rc1 runtime:, or imgtool copy bundle:old bundle:new")
    if kind == "runtime" and value not in RUNTIME_NAMES:
        raise UsageError(f"invalid {role} {text!r}: the runtime is docker, containerd, podman or auto")
    if kind != "runtime" and not value:
        raise UsageError(f"invalid {role} {text!r}: {kind}: needs a {'reference' if kind == 'registry' else 'directory'}")
    return End(kind, value)


def check_pair(source: End, destination: End) -> None:
    """The pairs `copy` runs; another verb's pair is refused naming the verb. Raises UsageError."""
    pair = (source.kind, destination.kind)
    if pair in OTHER_VERBS:
        raise UsageError(f"copy {source.kind} → {destination.kind} is `{OTHER_VERBS[pair].split()[1]}`'s job",
                         hint=f"run {OTHER_VERBS[pair]}")
    if pair not in (("registry", "runtime"), ("bundle", "bundle")):
        raise UsageError(f"cannot copy {source.kind} → {destination.kind}: "
                         "copy runs registry → runtime and bundle → bundle")
    if source.kind == "registry" and sys.version_info < (3, 9):
        raise UsageError("imgtool copy registry:... needs Python 3.9 or newer; this is Python "
                         f"{sys.version_info[0]}.{sys.version_info[1]}")


def check_bundle_options(source: End, **given: Optional[str]) -> None:
    """--expect and --sign-key are for a bundle source (a bundle → bundle copy); raises UsageError."""
    for name, value in given.items():
        if value is not None and source.kind != "bundle":
            raise UsageError(f"--{name.replace('_', '-')} is for a bundle source (copy bundle:DIR bundle:DIR)",
                             hint="a registry source is checked by its digests as it is downloaded")


@dataclass
class CopyOptions:
    source: End
    destination: End
    platforms: Sequence[Platform] = ()  # registry sources: the platform(s) to copy (default: the runtime's)
    mirror: str = "auto"
    probe_timeout: float = 5.0
    connections: Tuple[int, int] = (12, 32)  # per source, at most at once
    tags: Sequence[str] = ()  # runtime destinations: further names (as load --tag)
    arch: Optional[str] = None
    force: bool = False
    pin: bool = True
    chunk_size: Optional[int] = None  # bundle destinations
    compress: str = "none"
    have: Optional[Path] = None  # bundle destinations: leave out what the offline side holds (a delta)
    created: Optional[str] = None
    signers: Optional[str] = None  # bundle sources: the signature policy
    expect: Optional[str] = None  # bundle sources: the sha256 of bundle.json (as load --expect)
    sign_key: Optional[str] = None  # bundle destinations: sign the new bundle.json with it


@dataclass
class CopyResult:
    source: str
    destination: str
    images: List[Any]  # runtime: LoadedImage; bundle: bundle.format.BundleImage
    bundle: Any = None  # bundle destinations: writer.BundleResult
    stats: Any = None
    warnings: List[str] = field(default_factory=list)
    signed: Any = None  # bundle destinations with --sign-key: bundle.signature.Signed

    def to_json(self) -> dict:
        out = {"source": self.source, "destination": self.destination,
               "images": [im.to_json() for im in self.images], "warnings": self.warnings}
        if self.bundle is not None:
            out["bundle"] = self.bundle.to_json()
        return out


def registry_to_runtime(opts: CopyOptions, config: "MirrorConfig", store: "Store", runtime: "Runtime",
                        progress: Progress) -> CopyResult:
    """The image(s) of `opts.source` for the runtime's platform (or --arch), downloaded into the cache and streamed
    into the runtime as they arrive; raises ImgtoolError subclasses (nothing registered stays)."""
    from .ends.registry_source import RegistrySource
    from .ends.runtime_dest import RuntimeDestination
    from .mirrors import Clients
    from .resolve import resolve_image, resolve_refs

    destination = RuntimeDestination(runtime, progress, tags=opts.tags, arch=opts.arch, force=opts.force,
                                     pin=opts.pin)
    platforms = list(opts.platforms) or [Platform.parse(f"linux/{destination.facts.arch}")
                                         if destination.facts.arch else Platform.host()]
    clients = Clients(config)
    store.create()
    resolutions = resolve_refs(config, [opts.source.value], opts.mirror, progress, opts.probe_timeout,
                               clients=clients)
    pulled = [(resolve_image(res, p, store), res.sources) for res in resolutions for p in platforms]
    source = RegistrySource(pulled, store, progress, opts.connections)
    copied = copy(source, destination)
    return CopyResult(str(opts.source), f"{destination.what} {destination.facts.version}", copied.result,
                      stats=copied.stats, warnings=destination.warnings)


def bundle_to_bundle(opts: CopyOptions, progress: Progress) -> CopyResult:
    """The images and models of the bundle `opts.source` written as a new bundle: cut into other parts, compressed or
    not, or a delta leaving out the layers `--have`'s inventory holds (the models are carried whole, as the source
    holds them: a file it left out stays left out). The source is checked as `load` checks it before a byte is
    written (the signature policy, --expect, bundle.json against SHA256SUMS and the files, every part there at its
    size: verify.check_source), then every blob against its digest as it is read; imgtool.pyz is carried over.
    The new bundle.json is new, so a signature does not carry over: with `sign_key` it is signed, else a signed
    source's copy says it is unsigned (a warning). Raises UsageError, SignatureError/VerifyError (exit 3, nothing
    written), ImgtoolError (the new bundle is not written: no bundle.json)."""
    from . import dirlock, gz
    from .bundle import signature
    from .bundle.format import TOOL_PYZ
    from .bundle.verify import check_source
    from .delta import DeltaPlan
    from .ends.bundle_dest import BundleDestination, read_have
    from .ends.bundle_source import BundleSource

    src, out = Path(opts.source.value), Path(opts.destination.value)
    if out.resolve() == src.resolve():
        raise UsageError(f"copy {src} into itself: name another directory as the destination")
    if opts.sign_key:
        signature.check_key(opts.sign_key)
    have, _ = read_have(opts.have, None)
    index, report = check_source(src, signers=opts.signers, expect=opts.expect, doing="copy", progress=progress)
    source = BundleSource(src, index)
    if index.is_delta:
        raise UsageError(f"{src} is a delta bundle: its left-out layers are not in it, so it cannot be copied "
                         "into a bundle of its own", hint="copy the full bundle it was cut against")
    for w in report.warnings:
        progress.warn(w)
    images = source.images()
    delta = DeltaPlan.make(have, None, images) if have is not None else None
    tool = {TOOL_PYZ: src / TOOL_PYZ} if any(f.name == TOOL_PYZ for f in index.files) else {}
    destination = BundleDestination(out, progress, chunk_size=opts.chunk_size, compress=opts.compress,
                                    force=opts.force, gzip=gz.compressor(), delta=delta, created=opts.created,
                                    extra_files=tool, models=index.models)
    with dirlock.lock_output(out, "copy"):
        copied = copy(source, destination)
    written = copied.result
    warnings = list(report.warnings)
    signed = None
    if opts.sign_key:
        signed = signature.sign_written(out, opts.sign_key, written.bundle_json_sha256)
    elif report.signature is not None and report.signature.state is not State.UNSIGNED:
        unsigned = unsigned_copy(src, out, report.signature.signer)
        progress.warn(unsigned)
        warnings.append(unsigned)
    written.warnings.extend(warnings)
    return CopyResult(str(opts.source), str(opts.destination), list(written.images), bundle=written,
                      warnings=warnings, signed=signed)


def unsigned_copy(src: Path, out: Path, signer: Optional[str]) -> str:
    """What copy says when the source is signed and no --sign-key was given."""
    by = f" (by {signer})" if signer else ""
    return (f"the new bundle {out} is unsigned: {src} is signed{by}, but a signature covers only the bundle.json it "
            "was made for, and the copy's bundle.json is new (its parts, compression and time of making); sign it: "
            f"imgtool sign {out} --sign-key KEY (or copy with --sign-key KEY)")
