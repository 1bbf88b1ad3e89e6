"""imgtool inventory: what this host's runtime already holds."""

import click

from ..errors import counted
from .options import common, json_option, runtime_choice, runtime_options
from .output import emit_json, progress


@click.command()
@click.option("-o", "--output", type=click.Path(dir_okay=False), metavar="FILE",
              help="Write the inventory to FILE (atomically) instead of standard output.")
@runtime_options
@json_option("inventory (with -o: where it went)")
@common
def inventory(output, runtime, address, namespace, as_json):
    """What this host's runtime already holds (image IDs, tags, layer diff_ids), as JSON.

    Carry it to the connected side: `imgtool fetch REF --have FILE` then leaves out every
    layer this runtime already has (a delta bundle). On a Kubernetes node: containerd's k8s.io.
    """
    from ..inventory import check_output, take_inventory
    from ..runtimes.choice import open_runtime

    path = check_output(output)  # a bad -o is named before the runtime is asked anything
    with open_runtime(runtime_choice(runtime, address, namespace), timeout=120) as rt:
        result = take_inventory(rt, path)
    if result.path is None:  # the inventory is JSON already: --json prints it as it is
        click.echo(result.data.decode(), nl=False)
    elif as_json:
        emit_json({"path": str(result.path), "images": len(result.inventory.images), "layers": result.layers})
    else:
        progress().note(f"inventory: {counted(len(result.inventory.images), 'image')}, "
                        f"{counted(result.layers, 'distinct layer')} -> {output}")
