"""imgtool copy: the pipeline's other pairs (registry → runtime, bundle → bundle)."""

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
              help="registry: the architecture to copy (default: the runtime's); runtime: of a tag held for several, "
                   "this one.")
@mirror_option
@mirrors_option
@click.option("--tag", "tags", multiple=True, metavar="NAME", help="runtime: also tag the image NAME[:TAG]. Repeatable.")
@click.option("--no-pin", is_flag=True, help="runtime: on containerd, leave the images unpinned.")
@click.option("--chunk-size", metavar="SIZE", help="bundle: " + CHUNK_SIZE_HELP)
@click.option("--compress", type=click.Choice(COMPRESSIONS), default="none", show_default=True,
              help="bundle: compress the whole archive.")
@click.option("--have", type=click.Path(dir_okay=False), metavar="FILE",
              help="bundle: a delta, leaving out the layers the offline runtime holds (FILE from `imgtool inventory -o`).")
@click.option("--force", is_flag=True,
              help="runtime: load even when its disk looks too small; bundle: replace an existing directory.")
@expect_option("bundle: the sha256 of the source's bundle.json that `fetch` printed.")
@signers_option
@click.option("--sign-key", metavar="KEY",
              help="bundle: sign the new bundle.json (a signed source's signature does not carry over: the copy's "
                   "bundle.json is new): an SSH private key, or the .pub of a key in ssh-agent.")
@runtime_options
@json_option("result")
@common
def copy_cmd(source, destination, arch, mirror, mirrors_file, tags, no_pin, chunk_size, compress, have, force, expect,
             signers, sign_key, runtime, address, namespace, as_json):
    """Copy images from SOURCE to DESTINATION through the one pipeline.

    \b
    SOURCE       registry:REF (resolved through mirrors.toml as fetch does) or bundle:DIR
    DESTINATION  runtime: (or runtime:docker|containerd|podman; default auto, as load) or bundle:DIR
    \b
    registry → runtime: a connected node loads the image straight from the registry, checked and
    landed as `load` lands a bundle (on a Kubernetes node: where the kubelet looks, pinned).
    bundle → bundle: cut a bundle again (--chunk-size), compress or decompress it (--compress),
    or cut a delta from a full bundle offline (--have). The source is checked as load checks it
    before a byte is written (signature policy, --expect, SHA256SUMS, every part at its size; exit 3
    and nothing written), and every blob as it is read. A signature does not carry over: --sign-key.
    """
    from ..copying import CopyOptions, check_bundle_options, check_pair, parse_end, registry_to_runtime
    from ..fetch import parse_platforms
    from ..runtimes.choice import open_runtime

    src, dst = parse_end(source, "source"), parse_end(destination, "destination")
    check_pair(src, dst)
    check_bundle_options(src, expect=expect, sign_key=sign_key)
    if src.kind == "bundle":
        bundle_usage(src.value, expect)
    opts = CopyOptions(src, dst, platforms=parse_platforms(arch, None) if arch and src.kind == "registry" else (),
                       mirror=mirror, tags=tags, arch=arch, force=force, pin=not no_pin,
                       chunk_size=size_value(chunk_size), compress=compress, have=have, signers=signers,
                       expect=expect, sign_key=sign_key)
    p = progress()
    if src.kind == "registry":
        config = registries(mirrors_file)
        choice = runtime_choice(dst.value if dst.value not in ("", "auto") else runtime, address, namespace)
        say_choice(choice)
        with open_runtime(choice) as daemon:
            result = registry_to_runtime(opts, config, blob_store(), daemon, p)
        if as_json:
            emit_json(result.to_json())
            return
        rows = [(", ".join(im.tags) or im.ref, im.docker_id[7:19], im.platform) for im in result.images]
        click.echo(table(rows, ["name", "id", "platform"]))
        click.echo(f"copied {len(result.images)} image(s) from {result.source} to {result.destination}")
        return
    from ..copying import bundle_to_bundle

    result = bundle_to_bundle(opts, p)
    bundle_report(result.bundle.summary(), result.bundle.describe, result.signed, as_json)

