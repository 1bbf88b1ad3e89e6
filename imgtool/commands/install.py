"""imgtool self-install and self-update: the host's own trusted imgtool."""

import click

from .options import bundle_usage, common, json_option, signers_option
from .output import emit_json, progress


@click.command("self-install")
@click.option("--prefix", default="/usr/local", show_default=True, metavar="DIR", type=click.Path(file_okay=False),
              help="Install into DIR/lib/imgtool/imgtool.pyz and DIR/bin/imgtool.")
@json_option("result")
@common
def self_install(prefix, as_json):
    """Install this imgtool.pyz as the host's own imgtool, the copy that checks every later bundle.

    First check the file with this host's sha256sum against the value published out of band (fetch
    prints `imgtool.pyz sha256: ...`): nothing inside a bundle can make that check for itself. Then
    `python3 imgtool.pyz self-install` copies it to PREFIX/lib/imgtool/ and writes PREFIX/bin/imgtool,
    a launcher for this python3 (3.7+). A bundle's own load.sh and imgtool.pyz protect only against
    damage; the installed copy also against an edited bundle. Update it with `imgtool self-update DIR`.
    """
    import shutil
    from pathlib import Path

    from ..install import self_install as install

    done = install(Path(prefix).expanduser())
    if as_json:
        emit_json(done.to_json())
        return
    click.echo(f"installed imgtool {done.version}: {done.launcher} runs {done.pyz} with {done.python}")
    click.echo(f"imgtool.pyz sha256: {done.sha256}")
    found = shutil.which("imgtool")
    if found is None or Path(found).resolve() != Path(str(done.launcher)).resolve():
        progress().warn(f"{Path(str(done.launcher)).parent} is not first on PATH here"
                        + (f" ({found} is found first)" if found else "") + f": run {done.launcher}")
    click.echo("check every bundle with it: imgtool verify DIR && imgtool load DIR   "
               "(update it only with: imgtool self-update DIR)")


@click.command("self-update")
@click.argument("bundle_dir", metavar="DIR", type=click.Path(file_okay=False))
@click.option("--expect", metavar="SHA256", help="The sha256 of the bundle's bundle.json, published with the release.")
@click.option("--allow-downgrade", is_flag=True,
              help="Install DIR's imgtool even when it is older than (or another build of) this one.")
@signers_option
@json_option("result")
@common
def self_update(bundle_dir, expect, allow_downgrade, signers, as_json):
    """Replace the installed imgtool with the imgtool.pyz of bundle DIR, once this copy verified DIR.

    DIR's bundle.json must be signed by a key the site's allowed_signers lists, or match --expect;
    its imgtool.pyz must match what that bundle.json records, and be newer than this imgtool
    (an older one only with --allow-downgrade: an old release, still signed, may lack a fix).
    Otherwise exit 3, nothing replaced. The same version: said, nothing replaced, exit 0.
    """
    from ..install import self_update as update

    bundle_usage(bundle_dir, expect)
    done = update(bundle_dir, expect=expect, signers=signers, allow_downgrade=allow_downgrade)
    if as_json:
        emit_json(done.to_json())
        return
    if done.unchanged:
        click.echo(done.unchanged)
        return
    click.echo(f"updated imgtool {done.previous} -> {done.version}: {done.pyz} (sha256 {done.sha256})")
