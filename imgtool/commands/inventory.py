"""imgtool inventory: what this host's runtime already holds."""

from pathlib import Path

import click

from ..errors import counted
from .options import common, json_option, runtime_choice, runtime_options
from .output import emit_json, progress


@click.command()
@click.option("-o", "--output", type=click.Path(dir_okay=False), metavar="FILE",
              help="Write the inventory to FILE (atomically) instead of standard output.")
@click.option("--models-dir", "models_dirs", multiple=True, type=click.Path(file_okay=False), metavar="DIR",
              help="Also list the models `load --models-dir DIR` placed there. Repeatable.")
@runtime_options
@json_option("inventory (with -o: where it went)")
@common
def inventory(output, models_dirs, runtime, address, namespace, as_json):
    """What this host's runtime already holds (image IDs, tags, layer diff_ids), and its models, as JSON.

    The models are those placed here (the Hugging Face and ModelScope caches, --models-dir): each
    file's path, size and sha256, read from the caches' listings, never by hashing the weights; and those
    the runtime holds as modelcar images (`load --models image`), read from the images' layer annotations.

    Carry it to the connected side: `imgtool fetch REF --have FILE` then leaves out every
    layer this runtime already has (a delta bundle). On a Kubernetes node: containerd's k8s.io.
    """
    from ..inventory import check_output, take_inventory
    from ..runtimes.choice import open_runtime

    path = check_output(output)  # a bad -o is named before the runtime is asked anything
    with open_runtime(runtime_choice(runtime, address, namespace), timeout=120) as rt:
        result = take_inventory(rt, path, [Path(d) for d in models_dirs])
    for note in result.notes:  # a modelcar image not listed as a held model
        progress().note(note)
    if result.path is None:  # the inventory is JSON already: --json prints it as it is
        click.echo(result.data.decode(), nl=False)
    elif as_json:
        emit_json({"path": str(result.path), "images": len(result.inventory.images), "layers": result.layers,
                   "models": len(result.inventory.models)})
    else:
        progress().note(f"inventory: {counted(len(result.inventory.images), 'image')}, "
                        f"{counted(result.layers, 'distinct layer')}, {counted(len(result.inventory.models), 'model')}"
                        f" -> {output}")
