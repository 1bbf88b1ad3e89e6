"""How a run's results and failures are printed: tables, JSON, and the `error:`/`hint:` lines.

Every failure of a verb is turned into output in one place, `invoke()`; the verbs print their results
through `emit_json` and `table`, their progress through `progress()`.
"""

import json
import sys
import traceback
from dataclasses import dataclass
from typing import Optional

import click

from .. import progress as progress_mod
from ..errors import EXIT_ERROR, EXIT_USAGE, ImgtoolError
from ..text import for_terminal


@dataclass
class Run:
    """What one run of the CLI learns as it parses, for invoke() to print its failure as asked: invoke() makes
    one per call and hands it to click as the context object (no module state outlives a call)."""

    debug: bool = False
    quiet: bool = False
    json: bool = False
    json_printed: bool = False
    verb: str = ""  # the verb being run (`imgtool fetch`), for errors click raises without a context


def current_run() -> Run:
    """This run's `Run` (one is made on the root context when the CLI is called without invoke())."""
    return click.get_current_context().ensure_object(Run)


def set_flag(name):
    """An option callback that records a flag (--debug, --quiet, --json) on this run's `Run`."""
    def callback(ctx, param, value):
        if value:
            setattr(ctx.ensure_object(Run), name, True)
        return value

    return callback


def progress():
    """The progress reporter for this run (decided after all options are parsed)."""
    return progress_mod.choose(current_run().quiet)


def emit_json(obj) -> None:
    current_run().json_printed = True
    click.echo(json.dumps(obj, indent=2, sort_keys=False))


MAX_PROBLEMS_SHOWN = 20  # a crafted bundle.json can make tens of thousands: --json lists them all


def failed(run: Run, message: str, hint: Optional[str], code: int, problems=()) -> None:
    """The one place a failure is printed: `error:` (+ the first problems, + `hint:`) on stderr, and
    with --json a JSON document on stdout unless the verb printed its own (verify's failed report)."""
    click.echo(f"error: {for_terminal(message)}", err=True)
    problems = list(problems)
    for problem in problems[:MAX_PROBLEMS_SHOWN]:
        click.echo(f"  - {for_terminal(problem)}", err=True)
    if len(problems) > MAX_PROBLEMS_SHOWN:
        click.echo(f"  - and {len(problems) - MAX_PROBLEMS_SHOWN} more (--json lists every one)", err=True)
    if hint:
        click.echo(f"hint: {for_terminal(hint)}", err=True)
    if run.json and not run.json_printed:
        click.echo(json.dumps({"ok": False, "exit_code": code, "error": message, "hint": hint,
                               "problems": [str(p) for p in problems]}, indent=2))
    sys.exit(code)


def table(rows, headers) -> str:
    """A plain left-aligned text table, one line per row (a cell's control characters escaped)."""
    rows = [[for_terminal(c) for c in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    out = ["  ".join(h.upper().ljust(w) for h, w in zip(headers, widths)).rstrip()]
    out += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    return "\n".join(out)


class HintedUsageError(click.UsageError):
    """A usage error that knows what to suggest (the `hint:` line)."""

    def __init__(self, message, ctx=None, hint=None):
        super().__init__(message, ctx)
        self.hint = hint


def usage_lines(e: click.UsageError, verb: str = ""):
    """click's own usage error as our two lines: (error text, hint) without click's Usage block."""
    text = " ".join(e.format_message().split()).rstrip(".")
    text = text[:1].lower() + text[1:]
    hint = getattr(e, "hint", None)
    if hint is None:
        where = e.ctx.command_path if e.ctx is not None else verb or "imgtool"
        usage = " ".join(e.ctx.get_usage().split()) if e.ctx is not None else ""
        if isinstance(e, click.NoSuchOption):
            text = f"no such option: {e.option_name}"
            if e.possibilities:
                if e.ctx is not None:  # an old spelling kept for a release is suggested as its new name
                    # (options.Renamed's `old`, read here without importing options, which imports this module)
                    renamed = {o: p.opts[0] for p in e.ctx.command.params for o in getattr(p, "old", ())}
                    e.possibilities = [renamed.get(p, p) for p in e.possibilities]
                hint = f"did you mean {' or '.join(sorted(set(e.possibilities)))}? {where} -h lists the options"
        if hint is None:
            hint = (usage[:1].lower() + usage[1:] + "; " if usage else "") + f"{where} -h explains every option"
    return text, hint


def bundle_report(summary: dict, describe, signed, as_json: bool) -> None:
    """fetch/export's report: the bundle's, then who signed it (bundle.signature.Signed, or None)."""
    if as_json:
        summary["signature"] = {"path": str(signed.path), "signer": signed.signer} if signed else None
        emit_json(summary)
        return
    click.echo(describe())
    if signed:
        click.echo(f"signed: {signed.path} by {signed.signer}")
        click.echo(_signed_offline_line(signed.path.parent))


def model_lines(models) -> list:
    """Each model of a bundle (bundle.format.BundleModel) as verify lists it: reference, commit, files, size, and
    the files a delta leaves out."""
    from ..errors import counted
    from ..model import format_size
    from ..text import for_terminal

    out = []
    for m in models:
        left = len(m.files) - len(m.carried)
        out.append(for_terminal(f"  {m.ref}  commit {m.commit[:12]}  {counted(len(m.files), 'file')}  "
                                f"{format_size(m.size)}" + (f"  ({left} left out: a delta)" if left else "")))
    return out


def models_json(models) -> list:
    """The models of a bundle as --json reports list them."""
    return [{"ref": m.ref, "commit": m.commit, "manifest_digest": str(m.manifest_digest), "files": len(m.files),
             "size": m.size, "omitted_files": len(m.files) - len(m.carried)} for m in models]


def _signed_offline_line(bundle_dir) -> str:
    """After `offline side: ... --expect ...`: a site that trusts the key needs no hash, only its policy."""
    import shlex

    from ..bundle.format import LOAD_SH, TOOL_PYZ

    d = shlex.quote(str(bundle_dir))
    pyz = (f"python3 {shlex.quote(str(bundle_dir / TOOL_PYZ))} load {d}, or: "
           if (bundle_dir / TOOL_PYZ).is_file() else "")
    return (f"offline side, where allowed_signers lists this key: imgtool load {d}   (the installed imgtool; "
            f"{pyz}sh {shlex.quote(str(bundle_dir / LOAD_SH))} check the policy too, but for damage only)")


def echo_signature(verdict) -> None:
    """verify/load: the signature's line, when the bundle is signed or a policy asked for a signature."""
    from ..trust import State

    if verdict is not None and (verdict.state is not State.UNSIGNED or verdict.policy):
        click.echo(f"signature: {verdict.message}")


def invoke(group, args) -> None:
    """Run the verbs on `args` and exit: every failure becomes one line (and a JSON document with --json)
    and an exit code, here."""
    run = Run()
    try:
        code = group.main(args=args, prog_name="imgtool", standalone_mode=False, obj=run)
    except ImgtoolError as e:
        if run.debug:
            traceback.print_exc()
        failed(run, e.message, e.hint, e.exit_code, getattr(e, "problems", ()))  # VerifyError: every finding
    except click.UsageError as e:  # click's own parsing (missing argument, bad choice...): our two lines
        text, hint = usage_lines(e, run.verb)
        run.json = run.json or "--json" in args  # a parse error comes before --json's callback
        failed(run, text, hint, EXIT_USAGE)
    except click.exceptions.Abort as e:  # click turns Ctrl-C into Abort (after a new line on stderr)
        failed(run, "interrupted" if isinstance(e.__context__, KeyboardInterrupt) else "aborted", None, 130)
    except click.ClickException as e:  # not a usage error (click.FileError...): still the one printer
        failed(run, e.format_message(), None, e.exit_code if e.exit_code is not None else EXIT_USAGE)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        failed(run, "interrupted", None, 130)
    except BrokenPipeError:
        sys.exit(EXIT_ERROR)
    except Exception as e:  # a bug: say so in one line unless --debug
        if run.debug:
            traceback.print_exc()
        failed(run, f"internal error: {type(e).__name__}: {e}", "rerun with --debug for a traceback and report it",
                EXIT_ERROR)
    sys.exit(code if isinstance(code, int) else 0)
