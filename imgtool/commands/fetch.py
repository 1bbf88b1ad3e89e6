"""imgtool fetch: registry -> bundle."""

import dataclasses

import click

from ..bundle.format import COMPRESSIONS
from .options import (
    CHUNK_SIZE_HELP, blob_store, common, gzip_level_option, gzip_library_option, json_option, mirror_option, mirrors_option,
    on_command_line, registries, renamed, sign_key_option, size_value, tool_option, warn_chunk_size
)
from .output import bundle_report, progress


def _fetch_interrupted(store):
    """Ctrl-C during fetch, before its layers went straight into the bundle (fetch.py says that case): what is
    kept, and that running it again resumes."""
    from ..errors import Interrupted

    from ..fetch import RESUME_HINT

    return Interrupted(f"interrupted: finished layers and partial downloads are kept in the cache "
                       f"({store.root}); the bundle was not finished (it has no bundle.json)", hint=RESUME_HINT)


# fetch -f SPEC: what the spec decides unless given on the command line (lock.spec_fetch_options' names)
_SPEC_OPTIONS = (("platforms", "arch"), ("platforms", "platform_"), ("mirrors", "mirrors_file"), ("output", "output"),
                 ("mirror", "mirror"), ("chunk_size", "chunk_size"), ("compress", "compress"))


@click.command()
@click.argument("refs", nargs=-1)
@click.option("-f", "--file", "spec_file", metavar="SPEC",
              help="Build the bundle a spec file describes (bundle.toml), pinned by bundle.lock beside it if present.")
@click.option("--created", metavar="TIME", help="bundle.json's creation time, UTC 2025-06-01T08:00:00Z or unix "
                                              "seconds (default: $SOURCE_DATE_EPOCH, else now).")
@click.option("--arch", help="Architecture(s): amd64, arm64 (aliases x86_64, aarch64); comma list allowed.")
@click.option("--platform", "platform_", metavar="OS/ARCH[/VARIANT]", help="Platform, e.g. linux/arm64/v8.")
@click.option("-o", "--output", type=click.Path(), help="Bundle directory (default: named from image, tag, arch).")
@mirror_option
@mirrors_option
@click.option("--chunk-size", metavar="SIZE", help=CHUNK_SIZE_HELP)
@click.option("--compress", type=click.Choice(COMPRESSIONS), default="none", show_default=True,
              help="Compress the whole archive (layers are already gzip).")
@click.option("--layers", "layers", type=click.Choice(["compat", "as-is", "plain"]), default="compat", show_default=True,
              help="compat: rewrite zstd layers as gzip, so Docker before 23.0 (Kylin's 18.09) loads the bundle "
                   "(the image ID stays, the manifest digest changes); as-is: the registry's bytes (Docker 23+ "
                   "only when they are zstd); plain: every layer uncompressed, as docker save writes them.")
@click.option("--check-diff-ids", is_flag=True,
              help="Also unpack every layer kept as the registry serves it and check it against the image config's "
                   "diff_id before the bundle is sealed (about 2.6 CPU s per GB unpacked; blob digests are always "
                   "checked, and verify, Docker and containerd check diff_ids offline).")
@gzip_level_option
@gzip_library_option
@renamed("--connections", old=("--jobs",), type=int, default=None, metavar="N",
         help="Connections to each source (a registry and its mirrors are each a source, as is each model hub "
              "endpoint).  [default: 12 to a registry, 24 to a model hub endpoint]")
@click.option("--max-connections", type=int, default=None, metavar="N",
              help="Connections at once over every source.  [default: 32 over the registries, 48 over a model's hub "
                   "endpoints]")
@click.option("--force", is_flag=True, help="Replace an existing output directory.")
@click.option("--have", type=click.Path(dir_okay=False), metavar="FILE",
              help="Delta: leave out layers the offline Docker holds (FILE from `imgtool inventory -o`).")
@click.option("--base", type=click.Path(file_okay=False), metavar="DIR",
              help="Delta: leave out layers of this earlier bundle (assumed loaded on the offline side).")
@tool_option
@sign_key_option
@json_option("result")
@common
def fetch(spec_file, created, refs, arch, platform_, output, mirror, mirrors_file, chunk_size, compress, layers,
          check_diff_ids, gzip_level, gzip_library, connections, max_connections, force, have, base, tool, sign_key, as_json):
    """Pull images and models from the fastest healthy mirror into a verified bundle directory.

    REFS are tags of the default image (v0.22.1rc1, v0.22.1rc1-a3), NAME:TAG, or full
    references (host/path:tag, ...@sha256:...), and models: hf:ORG/NAME[@REVISION],
    modelscope:ORG/NAME[@REVISION] ($HF_ENDPOINT, $MODELSCOPE_DOMAIN and [[model_mirrors]]
    are honoured), or a snapshot already downloaded: hf:ORG/NAME=DIR, or a Hugging Face
    cache's .../models--ORG--NAME/snapshots/COMMIT. Several go into one bundle. Or -f SPEC: a bundle.toml naming images,
    models and platforms, pinned by `imgtool lock`.
    """
    from ..memory import tune_for_downloads
    from ..config import source_date_epoch
    from ..fetch import FetchOptions, fetch as do_fetch, parse_platforms
    from ..lock import spec_fetch_options
    from ..spec import parse_created
    from ..weights import is_model_ref

    tune_for_downloads()  # measured with it (memory.py says why)

    config = registries(mirrors_file)
    opts = FetchOptions(refs=refs, platforms=parse_platforms(arch, platform_), output=output, mirror=mirror,
                        chunk_size=size_value(chunk_size), compress=compress, jobs=connections,
                        max_connections=max_connections, force=force, have=have, base=base, tool=tool, layers=layers,
                        check_diff_ids=check_diff_ids, sign_key=sign_key, gzip_level=gzip_level, gzip_library=gzip_library,
                        created=parse_created(created, source_date_epoch()))
    if spec_file:
        given = {field for field, option in _SPEC_OPTIONS if on_command_line(option)}
        config, opts = spec_fetch_options(spec_file, opts, config, given, progress())
    warn_chunk_size(opts.chunk_size)
    if any(is_model_ref(r) for r in opts.refs):
        from .. import config as settings  # read through the module: the tests' stand-in hubs replace it

        opts = dataclasses.replace(opts, hubs=settings.hub_environment())
    store = blob_store()
    try:
        result = do_fetch(config, opts, store, progress())
    except KeyboardInterrupt:
        raise _fetch_interrupted(store) from None
    summary = result.bundle.summary(result.images, result.stats)
    if spec_file:
        summary.update(spec=spec_file, lock=str(opts.lock.path) if opts.lock else None)
    bundle_report(summary, lambda: result.bundle.describe(result.images, result.stats), result.signed, as_json)
