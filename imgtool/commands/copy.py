"""imgtool copy: every pair of ends (copying.PAIRS) through the one pipeline."""

import click

from ..bundle.format import COMPRESSIONS
from .options import (CHUNK_SIZE_HELP, blob_store, bundle_usage, common, expect_option, json_option, mirror_option,
                      mirrors_option, registries, runtime_choice, runtime_options, say_choice, signers_option,
                      size_value)
from .output import bundle_report, emit_json, progress, table


@click.command("copy")
@click.argument("source", metavar="SOURCE")
@click.argument("destination", metavar="DESTINATION")
@click.option("--arch", metavar="ARCH",
              help="registry: the architecture(s) to copy, a comma list (default: the runtime's, else this host's); "
                   "runtime: of a tag held for several, this one.")
@mirror_option
@mirrors_option
@click.option("--tag", "tags", multiple=True, metavar="NAME", help="runtime: also tag the image NAME[:TAG]. Repeatable.")
@click.option("--no-pin", is_flag=True, help="runtime: on containerd, leave the images unpinned.")
@click.option("--chunk-size", metavar="SIZE", help="bundle: " + CHUNK_SIZE_HELP)
@click.option("--compress", type=click.Choice(COMPRESSIONS), default="none", show_default=True,
              help="bundle: compress the whole archive.")
@click.option("--have", type=click.Path(dir_okay=False), metavar="FILE",
              help="bundle: a delta, leaving out the layers the offline runtime holds (FILE from `imgtool inventory -o`).")
@click.option("--base", type=click.Path(file_okay=False), metavar="DIR",
              help="bundle: a delta, leaving out the layers of this earlier bundle (assumed loaded offline).")
@click.option("--force", is_flag=True,
              help="runtime: load even when its disk looks too small; bundle: replace an existing directory.")
@click.option("--insecure", is_flag=True, help="registry: unverified HTTPS, or plain HTTP (as push).")
@click.option("--ca-cert", type=click.Path(dir_okay=False), metavar="FILE", help="registry: its CA certificate.")
@expect_option("bundle: the sha256 of the source's bundle.json that `fetch` printed.")
@signers_option
@click.option("--sign-key", metavar="KEY",
              help="bundle: sign the new bundle.json (a signed source's signature does not carry over: the copy's "
                   "bundle.json is new): an SSH private key, or the .pub of a key in ssh-agent.")
@runtime_options
@json_option("result")
@common
def copy_cmd(source, destination, arch, mirror, mirrors_file, tags, no_pin, chunk_size, compress, have, base, force,
             insecure, ca_cert, expect, signers, sign_key, runtime, address, namespace, as_json):
    """Copy images from SOURCE to DESTINATION through the one pipeline.

    \b
    SOURCE       registry:REF (resolved through mirrors.toml as fetch does), bundle:DIR,
                 or docker:NAME (an image in the local Docker, as export names it)
    DESTINATION  registry:HOST[:PORT][/NAMESPACE] (as push --to), bundle:DIR,
                 or runtime: (runtime:docker|containerd|podman; default auto, as load)
    \b
    Every source with every destination. The verbs' pairs run as the verb does (registry → bundle
    is fetch, bundle → runtime load, bundle → registry push, docker → bundle export); the others
    take each end's checks from the verb that owns it: a registry source checked digest by digest
    as fetch checks it, a bundle source as load checks it before a byte goes out (signature policy,
    --expect, SHA256SUMS; exit 3 and nothing written), a runtime landed as load lands, a registry
    sent only the blobs it lacks, as push. bundle → bundle cuts a bundle again (--chunk-size),
    compresses it (--compress) or cuts a delta offline (--have, --base).
    """
    from ..copying import CopyOptions, Reach, check_options, pair_of, parse_end, run
    from ..fetch import parse_platforms

    src, dst = parse_end(source, "source"), parse_end(destination, "destination")
    pair = pair_of(src, dst)
    check_options(src, dst, expect=expect, signers=signers, sign_key=sign_key, have=have, base=base,
                  insecure=insecure, ca_cert=ca_cert)
    if src.kind == "bundle":
        bundle_usage(src.value, expect)
    if src.kind in ("registry", "docker") and dst.kind == "bundle":
        from ..memory import tune_for_downloads

        tune_for_downloads()  # fetch's and export's: measured with it (memory.py says why)
    opts = CopyOptions(src, dst, platforms=parse_platforms(arch, None) if arch and src.kind == "registry" else (),
                       mirror=mirror, tags=tags, arch=arch, force=force, pin=not no_pin,
                       chunk_size=size_value(chunk_size), compress=compress, have=have, base=base, signers=signers,
                       expect=expect, sign_key=sign_key, insecure=insecure, ca_cert=ca_cert,
                       waits=_waits() if dst.kind == "registry" else {})
    p = progress()
    result = run(opts, Reach(p, config=lambda: registries(mirrors_file), store=_once(blob_store),
                             runtime=lambda: _runtime(runtime if dst.value in ("", "auto") else dst.value, address,
                                                      namespace),
                             docker=_docker))
    if dst.kind == "bundle":
        bundle_report(result.to_json(), result.describe, result.signed, as_json)
        return
    if as_json:
        emit_json(result.to_json())
        return
    for w in result.warnings if dst.kind == "registry" else ():  # as push says them
        p.warn(w)
    if result.describe is not None:
        click.echo(result.describe())
        return
    rows = [(", ".join(im.tags) or im.ref, im.docker_id[7:19], im.platform) for im in result.images]
    click.echo(table(rows, ["name", "id", "platform"]))
    if result.images and all(im.was_present for im in result.images):
        click.echo(f"{result.destination} already holds the {len(result.images)} image(s) of {result.source}: "
                   "nothing was sent")
        return
    click.echo(f"copied {len(result.images)} image(s) from {result.source} to {result.destination}"
               + ("" if pair.verb is None else f" (as {pair.verb})"))


def _once(make):
    made: list = []

    def get():
        if not made:
            made.append(make())
        return made[0]

    return get


def _runtime(name, address, namespace):
    from ..runtimes.choice import open_runtime

    choice = runtime_choice(name, address, namespace)
    say_choice(choice)
    return open_runtime(choice)


def _docker():
    from ..config import docker_host
    from ..runtimes.docker import open_daemon

    return open_daemon(host=docker_host())


def _waits():
    """$IMGTOOL_READ_TIMEOUT, $IMGTOOL_RESPONSE_TIMEOUT, $IMGTOOL_MIN_RATE for the registry pushed to, as push."""
    from ..config import network_waits

    net = network_waits()
    return {"read_timeout": net.read_timeout, "response_timeout": net.response_timeout, "min_rate": net.min_rate,
            "helper_timeout": net.helper_timeout}
