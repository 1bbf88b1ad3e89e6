"""imgtool verify: check a bundle directory."""

import click

from ..errors import counted
from ..text import for_terminal
from .options import bundle_usage, common, json_option, renamed, signers_option
from .output import echo_signature, emit_json, model_lines, models_json, progress


@click.command()
@click.argument("bundle_dir", metavar="DIR", type=click.Path(file_okay=False))
@click.option("--expect", metavar="SHA256", help="The sha256 of bundle.json that `fetch` printed (publish it).")
@click.option("--quick", is_flag=True, help="Check parts only (sizes, sha256), not every blob and diff_id inside.")
@renamed("--threads", old=("--jobs",), type=click.IntRange(1, 64), default=None, metavar="N",
         help="Hashing threads (default: the number of CPUs).")
@signers_option
@json_option("report")
@common
def verify(bundle_dir, expect, quick, threads, signers, as_json):
    """Check a bundle directory: bundle.json, every part, and every blob inside.

    Exit 0 when the bundle is sound, 3 when not (each problem is named, with what to do).
    """
    from ..bundle.verify import verify_bundle
    from ..model import format_size

    bundle_usage(bundle_dir, expect)
    p = progress()
    report = verify_bundle(bundle_dir, expect=expect, quick=quick, progress=p, jobs=threads, signers=signers)
    for w in report.warnings:
        p.warn(w)
    if as_json:
        doc = report.to_json()
        if report.index.models:
            doc["models"] = models_json(report.index.models)
        emit_json(doc)
    elif report.ok:
        what = "parts checked (quick: the blobs inside were not)" if quick else \
            (f"{counted(len(report.index.parts), 'part')}, {counted(report.blobs_checked, 'blob')} and "
             f"{counted(report.layers_checked, 'layer diff_id')} checked")
        models = f", {len(report.index.models)} model(s)" if report.index.models else ""
        click.echo(f"ok: {report.dir}: {len(report.index.images)} image(s){models}; {what}; "
                   f"{format_size(report.bytes_read)} in {report.seconds:.1f} s")
        for im in report.index.images:
            click.echo(for_terminal(f"  {im.ref}  {im.platform}  ID {im.image_id.short}"))
        for line in model_lines(report.index.models):
            click.echo(line)
        if report.index.is_delta:
            from ..delta import describe_requirements, requirements

            chains = report.index.omitted_chains()
            click.echo(f"delta bundle: {counted(len(chains), 'layer')} left out on purpose "
                       f"(Docker must already hold them: {describe_requirements(requirements(chains))})")
        if report.unpacked_size is not None:
            click.echo(f"unpacked size: {format_size(report.unpacked_size)}")
        click.echo(f"bundle.json sha256: {report.bundle_json_sha256}")
        echo_signature(report.signature)
    report.raise_if_bad()
