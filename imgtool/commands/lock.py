"""imgtool lock: pin a bundle spec's images to digests (bundle.lock)."""

import click

from .options import blob_store, common, json_option, mirror_option, mirrors_option, on_command_line
from .output import emit_json, progress


@click.command("lock")
@click.option("-f", "--file", "spec_file", metavar="SPEC", default="bundle.toml", show_default=True,
              help="The bundle spec; the lock is written beside it as bundle.lock.")
@click.option("--update", is_flag=True, help="Re-resolve every tag (even when the lock fits) and report what moved.")
@mirror_option
@mirrors_option
@json_option("changes")
@common
def lock_cmd(spec_file, update, mirror, mirrors_file, as_json):
    """Pin every image of a bundle spec to its index and platform manifest digests (bundle.lock).

    `imgtool fetch -f SPEC` then fetches exactly those digests, however the tags move.
    """
    from ..config import network_waits
    from ..lock import lock_spec

    waits = network_waits()
    result = lock_spec(spec_file, update, mirror if on_command_line("mirror") else None, mirrors_file, waits.read_timeout,
                       blob_store(), progress(), waits.helper_timeout, waits=waits)
    spec, lock = result.spec, result.lock
    if as_json:
        emit_json(result.to_json())
    elif not result.written:
        click.echo(f"{spec.lock_path}: up to date with {spec.path} ({len(lock.images)} image(s) x "
                   f"{len(lock.platforms)} platform(s) pinned); --update re-resolves the tags")
    else:
        for c in result.changes:
            click.echo(c.describe())
        moved = sum(1 for c in result.changes if c.kind != "unchanged")
        click.echo(f"wrote {spec.lock_path}: {len(lock.images)} image(s) x {len(lock.platforms)} platform(s)"
                   + (f", {moved} change(s)" if result.old is not None else ""))
