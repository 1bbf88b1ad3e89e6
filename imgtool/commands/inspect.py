"""imgtool inspect: an image's platforms, sizes and digests, from the registry."""

import click

from ..text import for_terminal
from .options import blob_store, common, json_option, mirror_option, mirrors_option, registries
from .output import emit_json, progress, table


@click.command()
@click.argument("ref")
@mirror_option
@mirrors_option
@json_option("result")
@common
def inspect(ref, mirror, mirrors_file, as_json):
    """Show an image's platforms, sizes, layer counts, digest and the source that answered."""
    from ..inspection import inspect as do_inspect
    from ..model import format_size

    r = do_inspect(registries(mirrors_file), ref, mirror, blob_store(), progress())
    if as_json:
        emit_json({
            "ref": r.ref.tagged, "digest": str(r.digest), "media_type": r.media_type,
            "source": {"name": r.source.name, "reference": r.source.location},
            "platforms": [{"platform": str(p.platform), "manifest_digest": str(p.manifest_digest),
                           "compressed_size": p.size, "layers": p.layers} for p in r.platforms],
        })
        return
    click.echo("\n".join(for_terminal(line) for line in (r.ref.tagged, f"digest:  {r.digest}", f"type:    {r.media_type}",
                                                          f"source:  {r.source.describe()}")) + "\n")
    click.echo(table([(str(p.platform), format_size(p.size), p.layers, str(p.manifest_digest)) for p in r.platforms],
                     ["platform", "compressed", "layers", "manifest digest"]))
