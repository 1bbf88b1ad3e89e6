"""The verbs together: the `imgtool` group, each verb's module added to it, and the console entry point."""

import sys

import click

from .. import __version__
from ..errors import UsageError, exit_codes_help
from . import copy, diff, doctor, export, fetch, inspect, install, inventory, load, lock, mirrors, presets, push, run, \
    selfbundle, serve, sign, tags, verify
from .options import common
from .output import HintedUsageError, Run, invoke


# Verbs whose libraries (requests 2.32, urllib3 2, docker 7) need Python 3.9+. imgtool.pyz runs the
# rest on 3.7 too: Kylin V10's system python3 (daemon.py talks to Docker and registry.py to the
# site registry over the stdlib there).
NEEDS_PY39 = ("export", "fetch", "inspect", "lock", "mirrors", "self-bundle", "tags")
OFFLINE_VERBS = ("verify, load, copy (from a bundle), doctor, "
                 "inventory, presets, run-flags, run, diff, push, serve, sign, self-install, self-update")


class _Verbs(click.Group):
    """The verbs; a mistyped one is named with the closest real one (difflib)."""

    def resolve_command(self, ctx, args):
        name = args[0] if args else ""
        if name and not name.startswith("-") and self.get_command(ctx, name) is None:
            import difflib

            close = difflib.get_close_matches(name, self.list_commands(ctx), n=1, cutoff=0.6)
            hint = (f"did you mean {close[0]}? " if close else "") + f"{ctx.command_path} -h lists the commands"
            raise HintedUsageError(f"unknown command {name!r}", ctx, hint)
        resolved = super().resolve_command(ctx, args)
        ctx.ensure_object(Run).verb = f"{ctx.command_path} {resolved[0]}"
        if resolved[0] in NEEDS_PY39 and sys.version_info < (3, 9):
            raise UsageError(f"imgtool {resolved[0]} needs Python 3.9 or newer; this is Python "
                             f"{sys.version_info[0]}.{sys.version_info[1]}",
                             hint=f"run it on a host with python3 3.9+; here imgtool can {OFFLINE_VERBS}")
        return resolved


@click.group(cls=_Verbs, context_settings={"help_option_names": ["-h", "--help"]}, epilog=exit_codes_help())
@click.version_option(__version__, "--version", prog_name="imgtool", message="%(prog)s %(version)s")
@common
def cli():
    """imgtool: carry vllm-ascend container images into air-gapped Ascend hosts.

    \b
    Connected side:  imgtool fetch v0.22.1rc1 --arch arm64
    Offline side:    imgtool load ./vllm-ascend-v0.22.1rc1-arm64
    """


for verb in (fetch.fetch, export.export, copy.copy_cmd, inspect.inspect, mirrors.mirrors_cmd, tags.tags, lock.lock_cmd, diff.diff_cmd,
             presets.presets_cmd, run.run_flags, run.run_cmd, verify.verify, load.load, push.push, serve.serve, sign.sign,
             inventory.inventory, doctor.doctor, selfbundle.self_bundle, install.self_install, install.self_update):
    cli.add_command(verb)


def main(argv=None) -> None:
    """Console entry point: runs the CLI and maps every failure to one line and an exit code."""
    invoke(cli, sys.argv[1:] if argv is None else list(argv))
