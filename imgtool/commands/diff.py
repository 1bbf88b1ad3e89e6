"""imgtool diff: compare two bundles (or a bundle and an inventory)."""

import click

from .options import common, json_option
from .output import emit_json


@click.command("diff")
@click.argument("old", metavar="OLD")
@click.argument("new", metavar="NEW")
@json_option("comparison")
@common
def diff_cmd(old, new, as_json):
    """Compare two bundles (or a bundle and an `imgtool inventory` file): images, platforms, layers, models.

    Shared layers are what a delta bundle (`fetch --base OLD`) leaves out; of a model, the files whose sha256 the
    old bundle holds.
    """
    from ..diff import diff_paths

    result = diff_paths(old, new)
    if as_json:
        emit_json(result.to_json())
    else:
        click.echo("\n".join(result.describe()))
