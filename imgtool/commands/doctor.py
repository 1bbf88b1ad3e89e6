"""imgtool doctor: check this offline host."""

import click

from ..errors import EXIT_ERROR
from .options import common, json_option, runtime_choice, runtime_options
from .output import emit_json


@click.command()
@click.argument("bundle_dir", metavar="[DIR]", required=False, type=click.Path(file_okay=False))
@runtime_options
@click.option("--models-dir", metavar="DIR", default=None,
              help="Also list the models placed in DIR (imgtool load --models-dir DIR).")
@json_option("checks")
@common
def doctor(bundle_dir, runtime, address, namespace, models_dir, as_json):
    """Check this offline host: the runtimes (Docker, containerd, Podman), storage, free space,
    architecture, pigz, OS, and the models placed in the Hugging Face and ModelScope caches (each with its
    revision and size; a file missing fails, a file that may be written is warned about).

    With DIR, also whether that bundle fits this host. Exit 0 when nothing failed, 1 otherwise
    (a runtime that is absent fails only when no runtime is found, or when --runtime names it).
    """
    from ..doctor import run_checks

    checks = run_checks(bundle_dir, choice=runtime_choice(runtime, address, namespace), models_dir=models_dir)
    if as_json:
        emit_json([c.to_json() for c in checks])
    else:
        for c in checks:
            click.echo(f"{c.status.upper():<5} {c.name:<12} {c.detail}")
            if c.advice:
                click.echo(f"{'':<18}-> {c.advice}")
    if any(c.status == "fail" for c in checks):
        click.get_current_context().exit(EXIT_ERROR)
