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
