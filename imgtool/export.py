"""`imgtool export`: the same bundle from images already in a local Docker daemon: the pipeline's Docker → bundle
(ends/docker_source.py saves and gzips the layers; ends/bundle_dest.py writes the bundle, as for `fetch`).
"""

from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, List, Optional, Sequence

from . import dirlock, gz
from .ends.bundle_dest import BundleDestination, Bundled
from .ends.docker_source import DockerSource
from .model import PulledImage
from .pipeline import copy
from .progress import Progress
from .selfbundle import bundle_tool
from .store import Store

if TYPE_CHECKING:
    from .bundle.signature import Signed
    from .bundle.writer import BundleResult
    from .runtimes.docker import Daemon


@dataclass
class ExportOptions:
    """Everything `imgtool export` was asked to do."""

    names: Sequence[str]  # as `docker images` shows them, or IDs of tagged images
    output: Optional[Path] = None  # None: named from image, tag and arch
    chunk_size: Optional[int] = None
    compress: str = "none"
    gzip_level: int = 1
    gzip_library: str = "auto"  # gz.LIBRARIES: ISA-L when installed, or zlib (tests force either)
    jobs: int = 0  # compression threads; 0: the CPU count
    force: bool = False
    tool: bool = True  # put imgtool.pyz into the bundle (--no-tool)
    sign_key: Optional[str] = None  # sign bundle.json once the bundle is complete (bundle/signature.py)


@dataclass
class ExportResult:
    images: List[PulledImage]
    bundle: "BundleResult"
    signed: Optional["Signed"] = None  # with sign_key


def check_options(opts: ExportOptions) -> None:
    """What `export` is asked, checked before Docker is: the output directory, the signing key.

    Raises UsageError, SshKeygenMissing."""
    from .bundle import signature, writer

    gz.compressor(opts.gzip_level, opts.gzip_library)
    if opts.output is not None:
        writer.check_output_dir(Path(opts.output), opts.force)
    if opts.sign_key:
        signature.check_key(opts.sign_key)


def export(opts: ExportOptions, daemon: "Daemon", store: Store, progress: Progress) -> ExportResult:
    """Save images from `daemon` into `store` and write a bundle of them; the caller checked `opts` with
    `check_options` before it opened the daemon. Raises DaemonError, ExportError, UsageError.
    """
    from .bundle import signature, writer

    store.create()
    stale = store.remove_stale()  # what a killed export left: nothing can resume it
    if stale:
        progress.note(stale)
    gzip = gz.compressor(opts.gzip_level, opts.gzip_library)
    source = DockerSource(opts.names, daemon, store, progress, opts.jobs, gzip)
    images = source.images()
    out = Path(opts.output) if opts.output else Path(writer.default_bundle_name(images))
    with dirlock.lock_output(out, "export"):  # a second run into it refuses, naming this one; so does a served one
        writer.check_output_dir(out, opts.force)
        destination = BundleDestination(out, progress, chunk_size=opts.chunk_size, compress=opts.compress,
                                        force=opts.force, gzip=gzip,
                                        extra_files=bundle_tool(store.root, progress) if opts.tool else {})
        # bundle.json says by what the layers Docker saved uncompressed were gzipped here
        result = copy(source, destination, lambda plan, _: replace(plan, destination=Bundled(
            gzipped_layers=bool(source.made)))).result
        signed = signature.sign_written(out, opts.sign_key, result.bundle_json_sha256) if opts.sign_key \
            else None
    return ExportResult(images, result, signed)
