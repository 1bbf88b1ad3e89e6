"""imgtool export: the local Docker -> bundle."""

import click

from ..bundle.format import COMPRESSIONS
from .options import (
    CHUNK_SIZE_HELP, blob_store, common, gzip_level_option, gzip_library_option, json_option, renamed, sign_key_option,
    size_value, tool_option, warn_chunk_size
)
from .output import bundle_report, progress


@click.command()
@click.argument("images", nargs=-1, required=True)
@click.option("-o", "--output", type=click.Path(), help="Bundle directory (default: named from image, tag, arch).")
@click.option("--chunk-size", metavar="SIZE", help=CHUNK_SIZE_HELP)
@click.option("--compress", type=click.Choice(COMPRESSIONS), default="none", show_default=True,
              help="Compress the whole archive (layers are gzip-compressed anyway).")
@gzip_level_option
@gzip_library_option
@renamed("--threads", old=("--jobs",), type=click.IntRange(1, 64), default=None, metavar="N",
         help="Compression threads (default: the number of CPUs).")
@click.option("--force", is_flag=True, help="Replace an existing output directory.")
@tool_option
@sign_key_option
@json_option("result")
@common
def export(images, output, chunk_size, compress, gzip_level, gzip_library, threads, force, tool, sign_key, as_json):
    """Write a bundle from images already in the local Docker (for users who pulled with docker).

    IMAGES are names as `docker images` shows them (or IDs of tagged images). Layers arrive
    uncompressed from `docker save` and are gzip-compressed in parallel, so the bundle still
    loads on old Docker.
    """
    from ..memory import tune_for_downloads
    from ..config import docker_host
    from ..runtimes.docker import open_daemon
    from ..export import ExportOptions, check_options, export as do_export

    tune_for_downloads()  # measured with it (memory.py says why)

    opts = ExportOptions(images, output=output, chunk_size=size_value(chunk_size), compress=compress,
                         gzip_level=gzip_level, gzip_library=gzip_library, jobs=threads or 0, force=force, tool=tool,
                         sign_key=sign_key)
    warn_chunk_size(opts.chunk_size)
    check_options(opts)  # bad input is exit 2 before Docker is asked
    with open_daemon(host=docker_host()) as daemon:
        result = do_export(opts, daemon, blob_store(), progress())
    bundle_report(result.bundle.summary(result.images), lambda: result.bundle.describe(result.images), result.signed,
                   as_json)
