"""The command line: the only module that imports click. One thin function per verb.

Each verb parses options into values, calls one core function, and prints its result
(a table, or JSON with --json). Errors are turned into `error:`/`hint:` lines in
exactly one place, `main()`.
"""

import json
import sys
import traceback

import click

from . import __version__
from . import progress as progress_mod
from .errors import EXIT_ERROR, EXIT_USAGE, ImgtoolError

_STATE = {"debug": False, "quiet": False}


def _set_flag(name):
    def callback(ctx, param, value):
        if value:
            _STATE[name] = True
        return value

    return callback


def common(f):
    """--debug and -q/--quiet, accepted after the verb as well as before it."""
    f = click.option("--debug", is_flag=True, expose_value=False, is_eager=True, callback=_set_flag("debug"),
                     help="Show tracebacks on errors.")(f)
    f = click.option("-q", "--quiet", is_flag=True, expose_value=False, is_eager=True, callback=_set_flag("quiet"),
                     help="No progress output.")(f)
    return f


def progress():
    """The progress reporter for this run (decided after all options are parsed)."""
    return progress_mod.choose(_STATE["quiet"])


def emit_json(obj) -> None:
    click.echo(json.dumps(obj, indent=2, sort_keys=False))


def table(rows, headers) -> str:
    """A plain left-aligned text table."""
    rows = [[str(c) for c in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    out = ["  ".join(h.upper().ljust(w) for h, w in zip(headers, widths)).rstrip()]
    out += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    return "\n".join(out)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="imgtool", message="%(prog)s %(version)s")
@common
def cli():
    """imgtool: carry vllm-ascend container images into air-gapped Ascend hosts.

    \b
    Connected side:  imgtool fetch v0.22.1rc1 --arch arm64
    Offline side:    imgtool load ./vllm-ascend-v0.22.1rc1-arm64
    """


# --- connected side --------------------------------------------------------

mirrors_option = click.option("--mirrors", "mirrors_file", metavar="FILE",
                              help="mirrors.toml to use (default: $IMGTOOL_MIRRORS, ~/.config/imgtool/mirrors.toml, built-in).")
mirror_option = click.option("--mirror", default="auto", show_default=True, metavar="NAME|auto",
                             help="Force one source from mirrors.toml, or probe all and use the healthy ones.")


def _size_option(value):
    from .model import parse_size

    return None if value is None else parse_size(value, "--chunk-size")


@cli.command()
@click.argument("refs", nargs=-1, required=True)
@click.option("--arch", help="Architecture(s): amd64, arm64 (aliases x86_64, aarch64); comma list allowed.")
@click.option("--platform", "platform_", metavar="OS/ARCH[/VARIANT]", help="Platform, e.g. linux/arm64/v8.")
@click.option("-o", "--output", type=click.Path(), help="Bundle directory (default: named from image, tag, arch).")
@mirror_option
@mirrors_option
@click.option("--chunk-size", metavar="SIZE", help="Cut the archive into parts of SIZE (4G, 700M, 4GiB; binary units).")
@click.option("--compress", type=click.Choice(["none", "gzip", "zstd"]), default="none", show_default=True,
              help="Compress the whole archive (layers are already gzip).")
@click.option("--jobs", type=int, default=4, show_default=True, help="Parallel downloads.")
@click.option("--force", is_flag=True, help="Replace an existing output directory.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@common
def fetch(refs, arch, platform_, output, mirror, mirrors_file, chunk_size, compress, jobs, force, as_json):
    """Pull images from the fastest healthy mirror into a verified bundle directory.

    REFS are tags of the default image (v0.22.1rc1, v0.22.1rc1-a3), NAME:TAG, or full
    references (host/path:tag, ...@sha256:...). Several go into one bundle.
    """
    from .config import load_mirrors
    from .fetch import FetchOptions, fetch as do_fetch, parse_platforms

    config = load_mirrors(mirrors_file)
    opts = FetchOptions(refs=refs, platforms=parse_platforms(arch, platform_), output=output, mirror=mirror,
                        chunk_size=_size_option(chunk_size), compress=compress, jobs=jobs, force=force)
    result = do_fetch(config, opts, progress())
    summary = result.bundle.summary(result.images, result.stats)
    if as_json:
        emit_json(summary)
    else:
        click.echo(result.bundle.describe(result.images, result.stats))


@cli.command()
@click.argument("ref")
@mirror_option
@mirrors_option
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@common
def inspect(ref, mirror, mirrors_file, as_json):
    """Show an image's platforms, sizes, layer counts, digest and the source that answered."""
    from .config import load_mirrors
    from .fetch import inspect as do_inspect
    from .model import format_size

    r = do_inspect(load_mirrors(mirrors_file), ref, mirror, progress())
    if as_json:
        emit_json({
            "ref": r.ref.tagged, "digest": str(r.digest), "media_type": r.media_type,
            "source": {"name": r.source.name, "reference": r.source.location},
            "platforms": [{"platform": str(p.platform), "manifest_digest": str(p.manifest_digest),
                           "compressed_size": p.size, "layers": p.layers} for p in r.platforms],
        })
        return
    click.echo(f"{r.ref.tagged}\ndigest:  {r.digest}\ntype:    {r.media_type}\nsource:  {r.source.describe()}\n")
    click.echo(table([(str(p.platform), format_size(p.size), p.layers, str(p.manifest_digest)) for p in r.platforms],
                     ["platform", "compressed", "layers", "manifest digest"]))


@cli.command("mirrors")
@click.argument("ref", required=False)
@mirrors_option
@click.option("--timeout", type=float, default=5.0, show_default=True, help="Probe timeout in seconds.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@common
def mirrors_cmd(ref, mirrors_file, timeout, as_json):
    """Probe every source for REF (default: the default image): reachable, latency, digest."""
    from .config import load_mirrors
    from .fetch import mirror_report

    config = load_mirrors(mirrors_file)
    probes = mirror_report(config, ref, timeout)
    if as_json:
        emit_json({"config": config.path, "sources": [p.to_json() for p in probes]})
        return
    rows = []
    for p in probes:
        status = "ok" if p.digest else ("reachable" if p.reachable else "unreachable")
        rows.append((p.source.name, p.source.location, status,
                     f"{p.latency * 1000:.0f} ms" if p.latency is not None else "-",
                     p.digest.short if p.digest else "-", p.error or ""))
    click.echo(f"config: {config.path}")
    click.echo(table(rows, ["name", "reference", "status", "latency", "digest", "error"]))


def main(argv=None) -> None:
    """Console entry point: runs the CLI and maps every failure to one line and an exit code."""
    try:
        code = cli.main(args=argv, prog_name="imgtool", standalone_mode=False)
    except ImgtoolError as e:
        if _STATE["debug"]:
            traceback.print_exc()
        click.echo(f"error: {e.message}", err=True)
        if e.hint:
            click.echo(f"hint: {e.hint}", err=True)
        sys.exit(e.exit_code)
    except click.exceptions.Abort:
        click.echo("error: aborted", err=True)
        sys.exit(130)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code if e.exit_code is not None else EXIT_USAGE)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        click.echo("error: interrupted", err=True)
        sys.exit(130)
    except BrokenPipeError:
        sys.exit(EXIT_ERROR)
    except Exception as e:  # a bug: say so in one line unless --debug
        if _STATE["debug"]:
            traceback.print_exc()
        click.echo(f"error: internal error: {type(e).__name__}: {e}", err=True)
        click.echo("hint: rerun with --debug for a traceback and report it", err=True)
        sys.exit(EXIT_ERROR)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":  # pragma: no cover
    main()
