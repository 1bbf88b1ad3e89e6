"""The verbs together: the `imgtool` group, each verb's module added to it, and the console entry point."""

import os
import sys
import threading
import time

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
OFFLINE_VERBS = ("verify, load, copy (bundle → bundle), doctor, "
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


M_ARENA_MAX = -8  # glibc's mallopt parameter
TRIM_EVERY = 0.25  # seconds between two looks at the resident memory
TRIM_ABOVE = 64 * 1024 * 1024  # resident bytes over which freed memory goes back to the system


def _libc():
    """The C library as ctypes sees it, or None (no ctypes)."""
    try:
        import ctypes

        return ctypes.CDLL(None)
    except (ImportError, OSError):
        return None


def _two_malloc_arenas(libc) -> None:
    """glibc gives each thread that meets contention an arena of its own (up to 8 per core) and keeps what is
    freed in it: with a dozen download threads reading 256 KiB at a time, fetch's peak RSS rose with the
    connections. Two arenas: fetch of the scale-0.25 bench image 97-99 -> 82-86 MiB, the same speed
    (docs/benchmarks.md). Nothing on other C libraries (no mallopt) or when ctypes is missing."""
    try:
        libc.mallopt(M_ARENA_MAX, 2)
    except AttributeError:
        pass


def _return_freed_memory(libc) -> None:
    """A daemon thread that looks at the resident memory four times a second and, above TRIM_ABOVE, gives glibc's
    freed memory back to the system (malloc_trim: the free pages inside its heaps, not only the top). The download
    threads' reads free a buffer per read; on a slow link each read fills it partly and the heaps fragment, so
    fetch's peak RSS grew with the run and the connections: 118 MiB from two sources on the constrained link at the
    bench's scale 0.25, 155 MiB at scale 1. Trimming always made a loopback fetch 1.6x slower (each freed page
    faulted in again); below the mark nothing is done (docs/benchmarks.md). Only where /proc and glibc are."""
    try:
        import ctypes

        trim = libc.malloc_trim
        page = os.sysconf("SC_PAGE_SIZE")
        statm = os.open("/proc/self/statm", os.O_RDONLY)
    except (AttributeError, OSError, ValueError):
        return
    trim.argtypes = [ctypes.c_size_t]

    def loop() -> None:
        while True:
            time.sleep(TRIM_EVERY)
            if int(os.pread(statm, 64, 0).split()[1]) * page > TRIM_ABOVE:
                trim(0)

    threading.Thread(target=loop, name="malloc-trim", daemon=True).start()


def main(argv=None) -> None:
    """Console entry point: runs the CLI and maps every failure to one line and an exit code."""
    libc = _libc()
    if libc is not None:
        _two_malloc_arenas(libc)  # before any thread: arenas are made as threads first allocate
        _return_freed_memory(libc)
    invoke(cli, sys.argv[1:] if argv is None else list(argv))
