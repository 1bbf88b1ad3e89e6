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
    """Pin every image of a bundle spec to its index and platform manifest digests, and every
    model to its commit and each file's size and sha256 (bundle.lock).

    `imgtool fetch -f SPEC` then fetches exactly those, however the tags and branches move.
    """
    from .. import config as settings  # read through the module: the tests' stand-in hubs replace it
    from ..lock import lock_spec

    waits = settings.network_waits()
    result = lock_spec(spec_file, update, mirror if on_command_line("mirror") else None, mirrors_file, waits.read_timeout,
                       blob_store(), progress(), waits.helper_timeout, waits=waits,
                       hubs=settings.hub_environment() if _has_models(spec_file) else None)
    spec, lock = result.spec, result.lock
    if as_json:
        emit_json(result.to_json())
    elif not result.written:
        click.echo(f"{spec.lock_path}: up to date with {spec.path} ({len(lock.images)} image(s) x "
                   f"{len(lock.platforms)} platform(s){_models(lock)} pinned); --update re-resolves the tags")
    else:
        for c in result.changes:
            click.echo(c.describe())
        moved = sum(1 for c in result.changes if c.kind != "unchanged")
        click.echo(f"wrote {spec.lock_path}: {len(lock.images)} image(s) x {len(lock.platforms)} platform(s)"
                   + _models(lock) + (f", {moved} change(s)" if result.old is not None else ""))


def _models(lock) -> str:
    return f", {len(lock.models)} model(s)" if lock.models else ""


def _has_models(spec_file) -> bool:
    """Whether the spec names models (the hub variables are read, and checked, only then); a spec that cannot be
    read says so in lock_spec."""
    from ..errors import ImgtoolError
    from ..spec import load_spec

    try:
        return bool(load_spec(spec_file).models)
    except ImgtoolError:
        return False
