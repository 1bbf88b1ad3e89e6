"""imgtool serve: bundles as a read-only registry."""

import pathlib

import click

from ..errors import UsageError
from .options import bundle_usage, common, signers_option
from .output import progress


@click.command()
@click.argument("bundle_dirs", metavar="DIR...", nargs=-1, required=True, type=click.Path(file_okay=False))
@click.option("--listen", default="0.0.0.0:5000", show_default=True, metavar="ADDR:PORT",
              help="Where to answer (port 0: any free port, printed).")
@click.option("--tls-cert", type=click.Path(dir_okay=False), metavar="FILE",
              help="Serve HTTPS with this PEM certificate (chain); needs --tls-key.")
@click.option("--tls-key", type=click.Path(dir_okay=False), metavar="FILE", help="The PEM private key of --tls-cert.")
@click.option("--max-clients", type=click.IntRange(1, 1024), default=64, show_default=True, metavar="N",
              help="Connections served at once; more wait until one ends.")
@click.option("--timeout", type=click.FloatRange(0.1, 3600), default=60.0, show_default=True, metavar="SECONDS",
              help="A client silent (or not reading) this long is disconnected.")
@click.option("--unpack-to", type=click.Path(file_okay=False, path_type=pathlib.Path), metavar="DIR",
              help="Serve a --compress'ed bundle from its archive unpacked once into DIR (needs the tar's size; kept "
                   "for the next start). Uncompressed bundles are always served in place.")
@signers_option
@common
def serve(bundle_dirs, listen, tls_cert, tls_key, max_clients, timeout, unpack_to, signers):
    """Serve bundles as a read-only registry, so every node of a cluster pulls from this one.

    The OCI distribution API straight from the bundles' parts (no copy, no unpacking; a --compress'ed
    bundle only with --unpack-to): manifests by tag and digest (a tag held for several architectures
    as an index of them), blobs with Range, tags/list, _catalog. quay.io/ascend/vllm-ascend:TAG is served as
    ascend/vllm-ascend:TAG, as quay.io/ascend/vllm-ascend:TAG, and to containerd's mirror requests
    (hosts.toml), so pods keep their upstream image names. Each bundle must pass `verify --quick`
    and the signature policy first; each blob's digest is checked before it is first served.
    One log line per request on stderr; Ctrl-C (or SIGTERM) stops it (exit 130).
    """
    from ..serve import Settings, hold_bundles, open_bundles, parse_listen
    from ..serve import serve as run_server

    host, port = parse_listen(listen)
    if bool(tls_cert) != bool(tls_key):
        raise UsageError("--tls-cert and --tls-key go together", hint="give both, or neither for plain HTTP")
    for d in bundle_dirs:
        bundle_usage(d, None)
    with hold_bundles(bundle_dirs):  # from before the check until the server stops: nothing replaces them meanwhile
        catalog, unpacked = open_bundles(bundle_dirs, signers=signers, progress=progress(), unpack_to=unpack_to)
        settings = Settings(host, port, tls_cert, tls_key, max_clients, timeout)
        run_server(bundle_dirs, catalog, settings, say=lambda line: click.echo(line),
                   log=lambda line: click.echo(line, err=True), unpacked=unpacked)
