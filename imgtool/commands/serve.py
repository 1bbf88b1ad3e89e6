"""imgtool serve: bundles as a read-only registry."""

import pathlib

import click

from ..errors import UsageError
from .options import bundle_usage, common, json_option, signers_option
from .output import emit_json, progress


@click.command()
@click.argument("bundle_dirs", metavar="DIR...", nargs=-1, required=True, type=click.Path(file_okay=False))
@click.option("--listen", default="0.0.0.0:5000", show_default=True, metavar="ADDR:PORT",
              help="Where to answer (port 0: any free port, printed).")
@click.option("--tls-cert", type=click.Path(dir_okay=False), metavar="FILE",
              help="Serve HTTPS with this PEM certificate (chain); needs --tls-key.")
@click.option("--tls-key", type=click.Path(dir_okay=False), metavar="FILE", help="The PEM private key of --tls-cert.")
@click.option("--max-clients", type=click.IntRange(1, 65536), default=4096, show_default=True, metavar="N",
              help="Connections held open at once; when all are, a new one closes the longest-idle kept-alive one "
                   "(else the slowest to send its request). The open-file limit is raised to fit (said when).")
@click.option("--timeout", type=click.FloatRange(0.1, 3600), default=60.0, show_default=True, metavar="SECONDS",
              help="An answer must move $IMGTOOL_MIN_RATE (default 1K) bytes a second over each SECONDS, or it is "
                   "cut; a request's line and headers must come whole within min(20, SECONDS).")
@click.option("--unpack-to", type=click.Path(file_okay=False, path_type=pathlib.Path), metavar="DIR",
              help="Serve a --compress'ed bundle from its archive unpacked once into DIR (needs the tar's size; kept "
                   "for the next start). Uncompressed bundles are always served in place.")
@click.option("--advertise", metavar="HOST[:PORT]",
              help="The address nodes reach this server by, in the node configuration printed (default: the --listen "
                   "address; listening on every address, this host's name).")
@click.option("--tls-ca", type=click.Path(dir_okay=False), metavar="FILE",
              help="The CA certificate that issued --tls-cert: written into the node configuration for each runtime.")
@click.option("--print-node-config", is_flag=True,
              help="Print only what each node needs to pull from this server (containerd hosts.toml, Podman "
                   "registries.conf, Docker daemon.json, the CA) and exit; serve prints it at start too.")
@json_option("node configuration (with --print-node-config)")
@signers_option
@common
def serve(bundle_dirs, listen, tls_cert, tls_key, max_clients, timeout, unpack_to, advertise, tls_ca,
          print_node_config, as_json, signers):
    """Serve bundles as a read-only registry, so every node of a cluster pulls from this one.

    The OCI distribution API straight from the bundles' parts (no copy, no unpacking; a --compress'ed
    bundle only with --unpack-to): manifests by tag and digest (upstream's index by its digest, as fetch
    kept it; a tag held for several architectures as upstream's index when the bundle holds all it lists,
    else as an index of them), blobs with Range, tags/list, _catalog. quay.io/ascend/vllm-ascend:TAG is
    served as ascend/vllm-ascend:TAG, as quay.io/ascend/vllm-ascend:TAG, and to containerd's mirror
    requests (hosts.toml), so pods keep their upstream image names. At start it prints what each node
    needs (docs/serve.md). Each bundle must pass the signature policy and have every part at its size first; every
    blob's digest is checked in the background from the start (one asked for sooner: then, or as it is
    sent, its last bytes held back until it matched). One log line per request on stderr; Ctrl-C (or
    SIGTERM) stops it (exit 130).
    """
    from ..bundle.catalog import Catalog
    from ..config import min_rate
    from ..bundle.reader import read_index
    from ..serve import Settings, hold_bundles, nodes_need, open_bundles, parse_advertise, parse_listen, read_ca
    from ..serve import serve as run_server

    host, port = parse_listen(listen)
    if bool(tls_cert) != bool(tls_key):
        raise UsageError("--tls-cert and --tls-key go together", hint="give both, or neither for plain HTTP")
    if tls_ca and not tls_cert:
        raise UsageError("--tls-ca goes with --tls-cert", hint="it names the CA that issued --tls-cert")
    if as_json and not print_node_config:
        raise UsageError("--json goes with --print-node-config", hint="serve's own output is lines of text")
    settings = Settings(host, port, tls_cert, tls_key, max_clients, timeout, min_rate(),
                        advertise=parse_advertise(advertise) if advertise else None, tls_ca=tls_ca)
    if tls_ca:
        read_ca(tls_ca)  # a bad CA file is exit 2 before the bundles are checked
    for d in bundle_dirs:
        bundle_usage(d, None)
    if print_node_config:
        shown = settings.advertise[1] if settings.advertise and settings.advertise[1] else port
        if not shown:
            raise UsageError("--print-node-config needs the port nodes connect to, not 0",
                             hint="give --listen ADDR:PORT, or --advertise HOST:PORT")
        nodes, why = nodes_need(Catalog([read_index(pathlib.Path(d))[0] for d in bundle_dirs]), settings, shown)
        if as_json:
            emit_json(nodes.to_json())
            return
        for line in ([f"# note: {why}"] if why else []) + nodes.lines():
            click.echo(line)
        return
    with hold_bundles(bundle_dirs):  # from before the check until the server stops: nothing replaces them meanwhile
        catalog, unpacked = open_bundles(bundle_dirs, signers=signers, progress=progress(), unpack_to=unpack_to)
        run_server(bundle_dirs, catalog, settings, say=lambda line: click.echo(line),
                   log=lambda line: click.echo(line, err=True), unpacked=unpacked)
