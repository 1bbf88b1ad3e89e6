"""imgtool tags: the tags of a repository."""

import click

from .options import common, json_option, mirror_option, mirrors_option, registries
from .output import emit_json, progress, table


@click.command()
@click.argument("ref", required=False)
@click.option("--filter", "pattern", metavar="GLOB", help="Only tags matching GLOB, e.g. 'v0.22*'.")
@mirror_option
@mirrors_option
@json_option("result")
@common
def tags(ref, pattern, mirror, mirrors_file, as_json):
    """List the tags of REF's repository (default: the default image), newest first, with variants."""
    from ..mirrors import sources_for
    from ..tags import list_tags

    config = registries(mirrors_file)
    parsed = config.parse_ref(ref or "latest")
    result = list_tags(sources_for(parsed, config, mirror), parsed.name, pattern)
    report = progress()
    for note in result.notes:
        report.note(note)
    if as_json:
        emit_json({"repository": parsed.name, "source": result.source.name,
                   "tags": [{"tag": t.tag, "release": t.release, "hardware": t.hardware, "os": t.os,
                             "variant": t.variant} for t in result.tags]})
        return
    click.echo(table([(t.tag, t.release or "-", t.hardware or "-", t.os or "-") for t in result.tags],
                     ["tag", "release", "hardware", "os"]))
