"""`imgtool copy SOURCE DESTINATION`: every pair of ends that makes sense, one pipeline (issues 37, 47).

An end is written KIND:VALUE:
- `registry:REF` (a source): an image in a registry, resolved through mirrors.toml as `fetch` does;
- `registry:HOST[:PORT][/NAMESPACE]` (a destination): a registry pushed to as `push --to` names it (the image's
  repository path goes under NAMESPACE);
- `bundle:DIR`: a bundle directory (a source read in place, compressed too; or a destination written);
- `docker:NAME` (a source): an image in the local Docker (`$DOCKER_HOST`), as `export` names it;
- `runtime:` (or `runtime:docker|containerd|podman`, a destination): the runtime `load` would choose.

`PAIRS` is the table of what runs: every source with every destination. A pair a verb already runs goes through
that verb's core function (fetch, load, push, export: the same checks, the same words); the others are the
pipeline's ends put together with the checks of the verbs that own them (a registry source's digests as fetch
checks them, a runtime destination's landing as load lands, a registry destination's HEADs and mounts as push
does). A runtime is no source (Docker's images are `docker:NAME`) and `docker:` no destination (`runtime:docker`).
"""

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import (TYPE_CHECKING, Any, Callable, ContextManager, Dict, List, Optional, Sequence,
                    Tuple)

from .errors import UsageError
from .model import Platform
from .progress import Progress
from .trust import State

if TYPE_CHECKING:
    from .config import MirrorConfig
    from .ends.registry_source import RegistrySource
    from .pipeline import Destination
    from .runtimes.base import Runtime
    from .store import Store

SOURCES = ("registry", "bundle", "docker")
DESTINATIONS = ("registry", "bundle", "runtime")
RUNTIME_NAMES = ("", "auto", "docker", "containerd", "podman")
SOURCE_FORMS = "registry:REF, bundle:DIR or docker:NAME"
DESTINATION_FORMS = "registry:HOST[:PORT][/NAMESPACE], bundle:DIR or runtime:[NAME]"


@dataclass(frozen=True)
class Pair:
    """A pair `copy` runs; `verb`: the verb that runs it too (copy calls its core function), or None."""

    source: str
    destination: str
    verb: Optional[str]


PAIRS = (Pair("registry", "bundle", "fetch"), Pair("registry", "runtime", None), Pair("registry", "registry", None),
         Pair("bundle", "bundle", None), Pair("bundle", "runtime", "load"), Pair("bundle", "registry", "push"),
         Pair("docker", "bundle", "export"), Pair("docker", "runtime", None), Pair("docker", "registry", None))


@dataclass(frozen=True)
class End:
    kind: str  # registry | bundle | docker | runtime
    value: str

    def __str__(self) -> str:
        return f"{self.kind}:{self.value}"


def parse_end(text: str, role: str) -> End:
    """`KIND:VALUE` as a source or a destination; raises UsageError (an end that is no `role`: one line naming what
    to use)."""
    kind, sep, value = text.partition(":")
    forms = SOURCE_FORMS if role == "source" else DESTINATION_FORMS
    if role == "source" and kind == "runtime":
        raise UsageError(f"invalid source {text!r}: a runtime is a destination; an image in the local Docker is "
                         "the source docker:NAME",
                         hint="containerd and Podman are not read from: copy from the registry or bundle the image "
                              "came from")
    if role == "destination" and kind == "docker":
        raise UsageError(f"invalid destination {text!r}: docker: is a source (an image in the local Docker); "
                         "load into Docker with runtime:docker")
    if not sep or kind not in (SOURCES if role == "source" else DESTINATIONS):
        raise UsageError(f"invalid {role} {text!r}: use {forms}",
                         hint="e.g. imgtool copy registry:v0.22.1rc1 runtime:, or imgtool copy bundle:old bundle:new")
    if kind == "runtime" and value not in RUNTIME_NAMES:
        raise UsageError(f"invalid {role} {text!r}: the runtime is docker, containerd, podman or auto")
    if kind != "runtime" and not value:
        what = {"bundle": "a directory", "docker": "an image name"}.get(kind, "a reference" if role == "source"
                                                                         else "a registry HOST[:PORT][/NAMESPACE]")
        raise UsageError(f"invalid {role} {text!r}: {kind}: needs {what}")
    if kind == "registry" and role == "destination":
        from .push import parse_target

        try:
            parse_target(value)
        except UsageError:
            raise UsageError(f"invalid destination {text!r}: expected registry:HOST[:PORT][/NAMESPACE], "
                             "e.g. registry:harbor.local/ascend") from None
    return End(kind, value)


def pair_of(source: End, destination: End) -> Pair:
    """The pair of `PAIRS` these ends make; raises UsageError (a pair that needs Python 3.9: fetch's and export's
    sources)."""
    pair = next(p for p in PAIRS if (p.source, p.destination) == (source.kind, destination.kind))
    if source.kind in ("registry", "docker") and sys.version_info < (3, 9):
        raise UsageError(f"imgtool copy {source.kind}:... needs Python 3.9 or newer; this is Python "
                         f"{sys.version_info[0]}.{sys.version_info[1]}",
                         hint="copy from a bundle here (bundle:DIR to bundle:, runtime: or registry:)")
    return pair


# each option for one kind of end: (role, kind, what copy writes for it)
OPTION_ENDS = {"expect": ("source", "bundle", "a bundle source (copy bundle:DIR ...)"),
               "signers": ("source", "bundle", "a bundle source (copy bundle:DIR ...)"),
               "sign_key": ("destination", "bundle", "a bundle destination (copy ... bundle:DIR)"),
               "have": ("destination", "bundle", "a bundle destination (copy ... bundle:DIR)"),
               "base": ("destination", "bundle", "a bundle destination (copy ... bundle:DIR)"),
               "insecure": ("destination", "registry", "a registry destination (copy ... registry:HOST)"),
               "ca_cert": ("destination", "registry", "a registry destination (copy ... registry:HOST)")}


def check_options(source: End, destination: End, **given: Any) -> None:
    """Each option given is for an end of this pair (--expect for a bundle source, --insecure for a registry
    destination, ...); a delta (--have, --base) is not cut from Docker (export cuts none). Raises UsageError."""
    ends = {"source": source.kind, "destination": destination.kind}
    for name, value in given.items():
        role, kind, words = OPTION_ENDS[name]
        if value not in (None, False) and ends[role] != kind:
            raise UsageError(f"--{name.replace('_', '-')} is for {words}",
                             hint="a registry source is checked by its digests as it is downloaded"
                             if name in ("expect", "signers") else None)
    if source.kind == "docker" and (given.get("have") or given.get("base")):
        raise UsageError("--have and --base are for a registry or bundle source: a copy from Docker (as export) "
                         "writes a full bundle")


@dataclass
class CopyOptions:
    source: End
    destination: End
    platforms: Sequence[Platform] = ()  # registry sources: the platform(s) to copy (default: the runtime's, else
    #                                     this host's)
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
    base: Optional[Path] = None  # bundle destinations: leave out what this earlier bundle holds (a delta)
    created: Optional[str] = None
    signers: Optional[str] = None  # bundle sources: the signature policy
    expect: Optional[str] = None  # bundle sources: the sha256 of bundle.json (as load --expect)
    sign_key: Optional[str] = None  # bundle destinations: sign the new bundle.json with it
    insecure: bool = False  # registry destinations (as push)
    ca_cert: Optional[str] = None
    waits: Dict[str, Any] = field(default_factory=dict)  # registry destinations: the client's waits (as push)


@dataclass
class Reach:
    """What a pair opens, each only when it needs it (the command builds them: the runtime the options choose, the
    Docker at $DOCKER_HOST, mirrors.toml, the cache)."""

    progress: Progress
    config: Callable[[], "MirrorConfig"]
    store: Callable[[], "Store"]
    runtime: Callable[[], ContextManager["Runtime"]]
    docker: Callable[[], ContextManager[Any]]


@dataclass
class CopyResult:
    source: str
    destination: str
    images: List[Any]  # runtime: LoadedImage; bundle: bundle.format.BundleImage; registry: PushedImage
    bundle: Any = None  # bundle destinations: writer.BundleResult
    stats: Any = None
    warnings: List[str] = field(default_factory=list)
    signed: Any = None  # bundle destinations with --sign-key: bundle.signature.Signed
    summary: Optional[Callable[[], dict]] = None  # what --json prints, where the verb's own result says it
    describe: Optional[Callable[[], str]] = None  # the closing lines, where the verb's own result says them

    def to_json(self) -> dict:
        if self.summary is not None:
            return self.summary()
        out = {"source": self.source, "destination": self.destination,
               "images": [im.to_json() for im in self.images], "warnings": self.warnings}
        if self.bundle is not None:
            out["bundle"] = self.bundle.to_json()
        return out


def run(opts: CopyOptions, reach: Reach) -> CopyResult:
    """The pair `opts` names, run; raises ImgtoolError subclasses (what the pair's verb raises)."""
    pair = pair_of(opts.source, opts.destination)
    return _RUNS[(pair.source, pair.destination)](opts, reach)


# --- the verbs' pairs: their core functions ------------------------------------------------------------------------

def registry_to_bundle(opts: CopyOptions, reach: Reach) -> CopyResult:
    """`fetch REF -o DIR` (its checks, delta, space, layers kept as compat, imgtool.pyz carried)."""
    from .fetch import FetchOptions, fetch

    fetched = fetch(reach.config(), FetchOptions(
        refs=[opts.source.value], platforms=list(opts.platforms) or [Platform.host()],
        output=Path(opts.destination.value), mirror=opts.mirror, chunk_size=opts.chunk_size, compress=opts.compress,
        jobs=opts.connections[0], max_connections=opts.connections[1], force=opts.force,
        probe_timeout=opts.probe_timeout, have=opts.have, base=opts.base, created=opts.created,
        sign_key=opts.sign_key), reach.store(), reach.progress)
    return CopyResult(str(opts.source), str(opts.destination), list(fetched.bundle.images), bundle=fetched.bundle,
                      stats=fetched.stats, signed=fetched.signed,
                      summary=lambda: fetched.bundle.summary(fetched.images, fetched.stats),
                      describe=lambda: fetched.bundle.describe(fetched.images, fetched.stats))


def bundle_to_runtime(opts: CopyOptions, reach: Reach) -> CopyResult:
    """`load DIR` (the signature policy, --expect, every part and blob, the landing)."""
    from .bundle.reader import read_index
    from .load import load_bundle

    src = Path(opts.source.value)
    read_index(src)  # no bundle.json, or a broken one, is named before the runtime is asked anything (as load)
    with reach.runtime() as daemon:
        loaded = load_bundle(src, daemon, tags=opts.tags, expect=opts.expect, force=opts.force,
                             progress=reach.progress, arch=opts.arch, signers=opts.signers, pin=opts.pin)
    if not loaded.sent:  # sent: load said them as it sent
        for w in loaded.warnings:
            reach.progress.warn(w)
    return CopyResult(str(opts.source), f"{loaded.daemon['title']} {loaded.daemon['version']}", loaded.images,
                      warnings=loaded.warnings, summary=loaded.to_json)


def bundle_to_registry(opts: CopyOptions, reach: Reach) -> CopyResult:
    """`push DIR --to HOST[/NAMESPACE]` (the bundle checked as load checks it, a delta's base in the registry)."""
    from .push import push_bundle

    pushed = push_bundle(Path(opts.source.value), opts.destination.value, insecure=opts.insecure,
                         ca_cert=opts.ca_cert, progress=reach.progress, waits=opts.waits, expect=opts.expect,
                         signers=opts.signers)
    return _pushed(opts, pushed)


def docker_to_bundle(opts: CopyOptions, reach: Reach) -> CopyResult:
    """`export NAME -o DIR` (docker save, layers gzipped into the cache, imgtool.pyz carried)."""
    from .export import ExportOptions, check_options as check_export, export

    options = ExportOptions([opts.source.value], output=Path(opts.destination.value), chunk_size=opts.chunk_size,
                            compress=opts.compress, force=opts.force, sign_key=opts.sign_key)
    check_export(options)  # bad input is exit 2 before Docker is asked
    with reach.docker() as daemon:
        exported = export(options, daemon, reach.store(), reach.progress)
    return CopyResult(str(opts.source), str(opts.destination), list(exported.bundle.images), bundle=exported.bundle,
                      signed=exported.signed, summary=lambda: exported.bundle.summary(exported.images),
                      describe=lambda: exported.bundle.describe(exported.images))


# --- the pipeline's pairs: ends put together -----------------------------------------------------------------------

def registry_to_runtime(opts: CopyOptions, reach: Reach) -> CopyResult:
    """The image(s) of `opts.source` for the runtime's platform (or --arch), downloaded into the cache and streamed
    into the runtime as they arrive, landed as load lands them; raises ImgtoolError subclasses (nothing registered
    stays)."""
    with reach.runtime() as runtime:
        destination = _runtime_destination(opts, runtime, reach.progress)
        platforms = list(opts.platforms) or [Platform.parse(f"linux/{destination.facts.arch}")
                                             if destination.facts.arch else Platform.host()]
        return _into_runtime(opts, _registry_source(opts, reach, platforms), destination)


def registry_to_registry(opts: CopyOptions, reach: Reach) -> CopyResult:
    """The image(s) of `opts.source` (this host's platform, or --arch's), downloaded through the cache and pushed
    as push pushes a bundle's: what the destination holds is neither downloaded nor sent, the manifests byte for
    byte (a tag held for several platforms gets an index). Raises ImgtoolError subclasses."""
    source = _registry_source(opts, reach, list(opts.platforms) or [Platform.host()])
    return _into_registry(opts, source, _registry_destination(opts, f"registry:{opts.source.value}", reach.progress))


def docker_to_runtime(opts: CopyOptions, reach: Reach) -> CopyResult:
    """The image saved from the local Docker (its layers gzipped into the cache, as export) and landed in the
    runtime as load lands a bundle's. Raises ImgtoolError subclasses."""
    with reach.docker() as daemon, reach.runtime() as runtime:
        destination = _runtime_destination(opts, runtime, reach.progress)
        return _into_runtime(opts, _docker_source(opts, reach, daemon), destination)


def docker_to_registry(opts: CopyOptions, reach: Reach) -> CopyResult:
    """The image saved from the local Docker (as export) and pushed as push pushes a bundle's: a blob the registry
    holds is not sent (export's gzip is deterministic: the same layer, the same digest). Raises ImgtoolError."""
    with reach.docker() as daemon:
        return _into_registry(opts, _docker_source(opts, reach, daemon),
                              _registry_destination(opts, f"docker:{opts.source.value}", reach.progress))


def _registry_source(opts: CopyOptions, reach: Reach, platforms: Sequence[Platform]) -> "RegistrySource":
    """The reference resolved through mirrors.toml for each platform, its blobs to come through the cache."""
    from .ends.registry_source import RegistrySource
    from .mirrors import Clients
    from .resolve import resolve_image, resolve_refs

    config, store = reach.config(), reach.store()
    store.create()
    resolutions = resolve_refs(config, [opts.source.value], opts.mirror, reach.progress, opts.probe_timeout,
                               clients=Clients(config))
    pulled = [(resolve_image(res, p, store), res.sources) for res in resolutions for p in platforms]
    return RegistrySource(pulled, store, reach.progress, opts.connections)


def _docker_source(opts: CopyOptions, reach: Reach, daemon: Any) -> Any:
    """The image in the local Docker as export reads it (what a killed export left removed first)."""
    from . import gz
    from .ends.docker_source import DockerSource

    store = reach.store()
    store.create()
    stale = store.remove_stale()
    if stale:
        reach.progress.note(stale)
    return DockerSource([opts.source.value], daemon, store, reach.progress, 0, gz.compressor())


def _runtime_destination(opts: CopyOptions, runtime: "Runtime", progress: Progress) -> Any:
    from .ends.runtime_dest import RuntimeDestination

    return RuntimeDestination(runtime, progress, tags=opts.tags, arch=opts.arch, force=opts.force, pin=opts.pin)


def _registry_destination(opts: CopyOptions, name: str, progress: Progress) -> Any:
    """The registry `registry:HOST[/NAMESPACE]` names, reached as push reaches it."""
    from .ends.registry_dest import RegistryDestination
    from .push import connect, parse_target

    host, namespace = parse_target(opts.destination.value)
    client, scheme = connect(host, opts.insecure, opts.ca_cert, opts.waits)
    return RegistryDestination(client, host, namespace, scheme, progress,
                               name=name, to=opts.destination.value)


def _into_runtime(opts: CopyOptions, source: Any, destination: Any) -> CopyResult:
    from .pipeline import copy

    copied = copy(source, destination)
    return CopyResult(str(opts.source), f"{destination.what} {destination.facts.version}", copied.result,
                      stats=copied.stats, warnings=destination.warnings)


def _into_registry(opts: CopyOptions, source: Any, destination: "Destination[Any, Any]") -> CopyResult:
    import time

    from .pipeline import copy

    started = time.monotonic()
    pushed = copy(source, destination).result
    pushed.seconds = time.monotonic() - started
    return _pushed(opts, pushed)


def _pushed(opts: CopyOptions, pushed: Any) -> CopyResult:
    return CopyResult(str(opts.source), str(opts.destination), pushed.images, warnings=pushed.warnings,
                      summary=pushed.to_json, describe=pushed.describe)



def bundle_to_bundle(opts: CopyOptions, reach: Reach) -> CopyResult:
    """The images and models of the bundle `opts.source` written as a new bundle: cut into other parts, compressed or
    not, or a delta leaving out what `--have`'s inventory (or `--base`'s bundle) holds (the models are carried as
    the source holds them: a file it left out stays left out). The source is checked as `load`
    checks it before a byte is written (the signature policy, --expect, bundle.json against SHA256SUMS and the
    files, every part there at its size: verify.check_source), then every blob against its digest as it is read;
    imgtool.pyz is carried over. A delta for a containerd image store names the blobs that store holds for the
    layers it leaves out, as `fetch --have` does (heldblobs.py: a zstd delta whose base's blobs cannot be found is
    refused). The new bundle.json is new, so a signature does not carry over: with `sign_key` it is signed, else a
    signed source's copy says it is unsigned (a warning). Raises UsageError, SignatureError/VerifyError (exit 3,
    nothing written), ImgtoolError (the new bundle is not written: no bundle.json)."""
    from . import dirlock, gz
    from .bundle import signature
    from .bundle.format import TOOL_PYZ
    from .bundle.verify import check_source
    from .delta import DeltaPlan
    from .ends.bundle_dest import BundleDestination, read_have
    from .ends.bundle_source import BundleSource
    from .pipeline import copy

    src, out, progress = Path(opts.source.value), Path(opts.destination.value), reach.progress
    if out.resolve() == src.resolve():
        raise UsageError(f"copy {src} into itself: name another directory as the destination")
    if opts.sign_key:
        signature.check_key(opts.sign_key)
    have, base = read_have(opts.have, opts.base)
    index, report = check_source(src, signers=opts.signers, expect=opts.expect, doing="copy", progress=progress)
    source = BundleSource(src, index)
    if index.is_delta:
        raise UsageError(f"{src} is a delta bundle: its left-out layers are not in it, so it cannot be copied "
                         "into a bundle of its own", hint="copy the full bundle it was cut against")
    for w in report.warnings:
        progress.warn(w)
    images = source.images()
    delta = DeltaPlan.make(have, base, images) if have is not None else None
    transform = _held_blobs(opts, reach, images, delta) if delta is not None else None
    tool = {TOOL_PYZ: src / TOOL_PYZ} if any(f.name == TOOL_PYZ for f in index.files) else {}
    destination = BundleDestination(out, progress, chunk_size=opts.chunk_size, compress=opts.compress,
                                    force=opts.force, gzip=gz.compressor(), delta=delta, created=opts.created,
                                    extra_files=tool, models=index.models)
    with dirlock.lock_output(out, "copy"):
        copied = copy(source, destination, transform)
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
                      warnings=warnings, signed=signed, summary=written.summary, describe=written.describe)


def _held_blobs(opts: CopyOptions, reach: Reach, images: Sequence[Any], delta: Any) -> Any:
    """fetch --have's check, before a byte is written: the blobs a containerd image store holds for the layers the
    delta leaves out (found in the cache or from the sources mirrors.toml names), refused for zstd layers when not
    found (UsageError); the layer transform that names them in the manifests."""
    import dataclasses

    from . import heldblobs, transcode

    store = reach.store()
    store.create()  # the manifests looked up, and those rewritten, go into the cache as fetch's do
    left_out, held = heldblobs.held_blobs(images, delta, reach.config(), opts.mirror, store, reach.progress,
                                          opts.probe_timeout)
    if not any(left_out):
        return None

    def name(plan: Any, _source: Any) -> Any:
        named = transcode.name_held_blobs(plan.images, left_out, held, "as-is", store, reach.progress)
        return dataclasses.replace(plan, images=tuple(named))

    return name


def unsigned_copy(src: Path, out: Path, signer: Optional[str]) -> str:
    """What copy says when the source is signed and no --sign-key was given."""
    by = f" (by {signer})" if signer else ""
    return (f"the new bundle {out} is unsigned: {src} is signed{by}, but a signature covers only the bundle.json it "
            "was made for, and the copy's bundle.json is new (its parts, compression and time of making); sign it: "
            f"imgtool sign {out} --sign-key KEY (or copy with --sign-key KEY)")


_RUNS: Dict[Tuple[str, str], Callable[[CopyOptions, Reach], CopyResult]] = {
    ("registry", "bundle"): registry_to_bundle, ("registry", "runtime"): registry_to_runtime,
    ("registry", "registry"): registry_to_registry, ("bundle", "bundle"): bundle_to_bundle,
    ("bundle", "runtime"): bundle_to_runtime, ("bundle", "registry"): bundle_to_registry,
    ("docker", "bundle"): docker_to_bundle, ("docker", "runtime"): docker_to_runtime,
    ("docker", "registry"): docker_to_registry}
