"""imgtool self-bundle: build imgtool.pyz."""

import click

from .options import common, json_option
from .output import emit_json, progress


@click.command("self-bundle")
@click.option("-o", "--output", type=click.Path(dir_okay=False), default="imgtool.pyz", show_default=True,
              help="Where to write the zipapp.")
@json_option("build")
@common
def self_bundle(output, as_json):
    """Build imgtool.pyz: imgtool and its pure-Python dependencies in one file (`python3 imgtool.pyz ...`).

    The same file `fetch` puts into every bundle, built from the installed packages (no
    network); carry it once to hosts that have python3 (3.7+ offline and for push, 3.9+ for fetch) but cannot
    pip install.
    """
    from ..selfbundle import build

    tool = build(output)
    report = progress()
    for warning in tool.warnings:
        report.warn(warning)
    for note in tool.notes:
        report.note(note)
    if as_json:
        emit_json(tool.to_json())
        return
    click.echo(f"wrote {tool.path}: imgtool {tool.version} for {tool.python_text()}, "
               f"{tool.size // 1024} KiB, sha256 {tool.sha256}")
    click.echo("  " + ", ".join(f"{k} {v}" for k, v in tool.packages.items() if k != "imgtool"))
    click.echo(f"run it: python3 {tool.path} load BUNDLE_DIR")
