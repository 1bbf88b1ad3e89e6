"""imgtool mirrors: probe every source of mirrors.toml for a reference."""

import click

from .options import common, json_option, mirrors_option, registries
from .output import emit_json, table


@click.command("mirrors")
@click.argument("ref", required=False)
@mirrors_option
@click.option("--timeout", type=float, default=5.0, show_default=True, help="Probe timeout in seconds.")
@json_option("result")
@common
def mirrors_cmd(ref, mirrors_file, timeout, as_json):
    """Probe every source for REF: reachable, latency, digest. Exit 4 when none is reachable or has REF.

    Without REF: the newest release tag of the default image that a source lists (the image
    publishes no `latest`); when no source lists tags, reachability only.
    """
    from ..mirror_report import mirror_report

    config = registries(mirrors_file)
    report = mirror_report(config, ref, timeout)
    if as_json:
        emit_json({"config": config.path, "reference": report.ref.tagged if report.ref else None,
                   "chosen": report.chosen or None, "sources": [p.to_json() for p in report.probes]})
    else:
        rows = []
        for p in report.probes:
            status = "ok" if p.digest else ("reachable" if p.reachable else "unreachable")
            rows.append((p.source.name, p.source.location, status,
                         f"{p.latency * 1000:.0f} ms" if p.latency is not None else "-",
                         p.digest.short if p.digest else "-", p.error or ""))
        click.echo(f"config: {config.path}")
        if report.ref is not None:
            click.echo(f"probed: {report.ref.tagged}" + (f" ({report.chosen})" if report.chosen else ""))
        else:
            click.echo(f"probed: /v2/ only ({report.chosen})")
        click.echo(table(rows, ["name", "reference", "status", "latency", "digest", "error"]))
    failure = report.failure(str(config.path))
    if failure is not None:
        raise failure
