"""imgtool presets: the docker run presets for Ascend hosts."""

import click

from .options import common, json_option, presets_option
from .output import emit_json, table


@click.command("presets")
@presets_option
@json_option("presets")
@common
def presets_cmd(presets_file, as_json):
    """List the docker run presets for Ascend hosts (see run-flags and run)."""
    from .. import presets as P

    pset = P.load_presets(presets_file)
    if as_json:
        emit_json(pset.to_json())
        return
    rows = [(p.name, P.format_cards(p.cards), p.tag_pattern, p.description) for p in pset.presets]
    click.echo(table(rows, ["preset", "cards", "image tag", "description"]))
    click.echo("")
    click.echo("--multi-node applies to: " + ", ".join(p.name for p in pset.presets if p.multi_node))
    aliases = [f"{a} = {p.name}" for p in pset.presets for a in p.aliases]
    if aliases:
        click.echo("aliases: " + ", ".join(aliases))
    for e in pset.env_presets:
        click.echo(f"--env-preset {e.name}: {e.description}")
