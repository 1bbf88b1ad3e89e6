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
    """Show an image's platforms, sizes, layer counts, digest and the source that answered.

    A model (hf:ORG/NAME[@REVISION], modelscope:ORG/NAME[@REVISION]): the commit its revision
    names, each endpoint's answer, and every file's size and sha256.
    """
    from ..inspection import inspect as do_inspect
    from ..model import format_size
    from ..weights import is_model_ref

    if is_model_ref(ref):
        _inspect_model(ref, mirror, mirrors_file, as_json)
        return
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


def _inspect_model(ref, mirror, mirrors_file, as_json):
    from .. import config as settings  # read through the module: the tests' stand-in hubs replace it
    from ..inspection import inspect_model
    from ..model import format_size

    res = inspect_model(registries(mirrors_file), settings.hub_environment(), ref, mirror, blob_store(), progress())
    files = sorted(res.snapshot.files, key=lambda f: f.path)
    if as_json:
        emit_json({"ref": str(res.ref), "commit": res.commit, "size": res.snapshot.size,
                   "endpoints": [p.to_json() for p in res.probes],
                   "files": [{"path": f.path, "size": f.size, "sha256": str(f.sha256), "media_type": f.media_type}
                             for f in files]})
        return
    click.echo("\n".join(for_terminal(line) for line in (
        str(res.ref), f"commit:  {res.commit}",
        f"size:    {format_size(res.snapshot.size)} in {len(files)} files")))
    for p in res.probes:
        state = ("stale: " + str(p.commit)[:12] + ", not used" if p.stale else
                 f"{p.latency * 1000:.0f} ms" if p.latency is not None else p.error or "no answer")
        click.echo(for_terminal(f"source:  {p.hub.name} ({p.hub.http.base_url}): {state}"))
    click.echo()
    click.echo(table([(f.path, str(f.size), str(f.sha256)) for f in files], ["file", "bytes", "sha256"]))
