"""The command line: the only module that imports click. One thin function per verb.

Each verb parses options into values, calls one core function, and prints its result
(a table, or JSON with --json). Errors are turned into `error:`/`hint:` lines in
exactly one place, `main()`.
"""

import json
import pathlib
import sys
import traceback
from dataclasses import dataclass
from typing import Optional

import click

from . import __version__
from . import progress as progress_mod
from .bundle.format import COMPRESSIONS
from .config import carriers_help
from .errors import EXIT_ERROR, EXIT_USAGE, ImgtoolError, UsageError, exit_codes_help
from .runtimes.choice import CHOICES, PROGRAMS
from .text import for_terminal

@dataclass
class _Run:
    """What one run of the CLI learns as it parses, for main() to print its failure as asked: main() makes
    one per call and hands it to click as the context object (no module state outlives a call)."""

    debug: bool = False
    quiet: bool = False
    json: bool = False
    json_printed: bool = False
    verb: str = ""  # the verb being run (`imgtool fetch`), for errors click raises without a context


def _run() -> _Run:
    """This run's `_Run` (one is made on the root context when the CLI is called without main())."""
    return click.get_current_context().ensure_object(_Run)


def _set_flag(name):
    def callback(ctx, param, value):
        if value:
            setattr(ctx.ensure_object(_Run), name, True)
        return value

    return callback


def common(f):
    """--debug and -q/--quiet, accepted after the verb as well as before it."""
    f = click.option("--debug", is_flag=True, expose_value=False, is_eager=True, callback=_set_flag("debug"),
                     help="Show tracebacks on errors.")(f)
    f = click.option("-q", "--quiet", is_flag=True, expose_value=False, is_eager=True, callback=_set_flag("quiet"),
                     help="No progress output.")(f)
    return f


def json_option(what: str = "result"):
    """--json, one declaration for every verb that has it: the result as JSON, and on failure a JSON
    document too (main() prints {"ok": false, "error": ...} when the verb printed none)."""
    return click.option("--json", "as_json", is_flag=True, is_eager=True, callback=_set_flag("json"),
                        help=f"Print the {what} as JSON (on failure: the error as JSON).")


def progress():
    """The progress reporter for this run (decided after all options are parsed)."""
    return progress_mod.choose(_run().quiet)


def emit_json(obj) -> None:
    _run().json_printed = True
    click.echo(json.dumps(obj, indent=2, sort_keys=False))


MAX_PROBLEMS_SHOWN = 20  # a crafted bundle.json can make tens of thousands: --json lists them all


def _failed(run: _Run, message: str, hint: Optional[str], code: int, problems=()) -> None:
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


class _UsageError(click.UsageError):
    """A usage error that knows what to suggest (the `hint:` line)."""

    def __init__(self, message, ctx=None, hint=None):
        super().__init__(message, ctx)
        self.hint = hint


# Verbs whose libraries (requests 2.32, urllib3 2, docker 7) need Python 3.9+. imgtool.pyz runs the
# rest on 3.7 too: Kylin V10's system python3 (runtimes/docker.py talks to Docker and registry.py to the
# site registry over the stdlib there).
NEEDS_PY39 = ("export", "fetch", "inspect", "lock", "mirrors", "self-bundle", "tags")
OFFLINE_VERBS = "verify, load, doctor, inventory, presets, run-flags, run, diff, push, serve, sign, self-install, self-update"


class _Verbs(click.Group):
    """The verbs; a mistyped one is named with the closest real one (difflib)."""

    def resolve_command(self, ctx, args):
        name = args[0] if args else ""
        if name and not name.startswith("-") and self.get_command(ctx, name) is None:
            import difflib

            close = difflib.get_close_matches(name, self.list_commands(ctx), n=1, cutoff=0.6)
            hint = (f"did you mean {close[0]}? " if close else "") + f"{ctx.command_path} -h lists the commands"
            raise _UsageError(f"unknown command {name!r}", ctx, hint)
        resolved = super().resolve_command(ctx, args)
        ctx.ensure_object(_Run).verb = f"{ctx.command_path} {resolved[0]}"
        if resolved[0] in NEEDS_PY39 and sys.version_info < (3, 9):
            raise UsageError(f"imgtool {resolved[0]} needs Python 3.9 or newer; this is Python "
                             f"{sys.version_info[0]}.{sys.version_info[1]}",
                             hint=f"run it on a host with python3 3.9+; here imgtool can {OFFLINE_VERBS}")
        return resolved


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
                hint = f"did you mean {' or '.join(sorted(e.possibilities))}? {where} -h lists the options"
        if hint is None:
            hint = (usage[:1].lower() + usage[1:] + "; " if usage else "") + f"{where} -h explains every option"
    return text, hint


@click.group(cls=_Verbs, context_settings={"help_option_names": ["-h", "--help"]}, epilog=exit_codes_help())
@click.version_option(__version__, "--version", prog_name="imgtool", message="%(prog)s %(version)s")
@common
def cli():
    """imgtool: carry vllm-ascend container images into air-gapped Ascend hosts.

    \b
    Connected side:  imgtool fetch v0.22.1rc1 --arch arm64
    Offline side:    imgtool load ./vllm-ascend-v0.22.1rc1-arm64
    """


# --- connected side --------------------------------------------------------

CHUNK_SIZE_HELP = ("Cut the archive into parts of SIZE, named for the carrier they fit (" + carriers_help() + ")."
                   " Discs need UDF for parts over 4 GiB.")
mirrors_option = click.option("--mirrors", "mirrors_file", metavar="FILE",
                              help="mirrors.toml to use (default: $IMGTOOL_MIRRORS, ~/.config/imgtool/mirrors.toml, built-in).")
tool_option = click.option("--tool/--no-tool", default=True, show_default=True,
                           help="Put imgtool.pyz (imgtool for any python3 3.7+, no install) into the bundle.")
sign_key_option = click.option("--sign-key", metavar="KEY",
                               help="Sign bundle.json once the bundle is complete (bundle.json.sig): an SSH private key, "
                                    "or the .pub of a key in ssh-agent.")
gzip_library_option = click.option(
    "--gzip-library", type=click.Choice(["auto", "isal", "zlib"]), default="auto", show_default=True,
    help="What gzips the layers imgtool compresses and a gzip archive: ISA-L (the isal package, several times faster) "
         "when installed, else zlib; bundle.json records it. zlib rebuilds a bundle made without isal byte for byte.")
mirror_option = click.option("--mirror", default="auto", show_default=True, metavar="NAME|auto",
                             help="Force one source from mirrors.toml, or probe all and use the healthy ones.")


def _size_option(value):
    from .config import parse_chunk_size

    return None if value is None else parse_chunk_size(value, "--chunk-size")


def _warn_chunk_size(size) -> None:
    from .config import chunk_size_warning

    warning = chunk_size_warning(size)
    if warning:
        progress().warn(warning)


def _given(name) -> bool:
    """True when the option was on the command line (not its default)."""
    from click.core import ParameterSource

    return click.get_current_context().get_parameter_source(name) == ParameterSource.COMMANDLINE


def _registries(mirrors_file):
    """The registry verbs' MirrorConfig, with $IMGTOOL_READ_TIMEOUT, $IMGTOOL_RESPONSE_TIMEOUT, $IMGTOOL_MIN_RATE
    and $IMGTOOL_CREDENTIAL_HELPER_TIMEOUT read once, here."""
    from .config import load_mirrors, network_waits

    return load_mirrors(mirrors_file, waits=network_waits())


def _store():
    """The blob cache at $IMGTOOL_CACHE, built once here; the verb makes its directories once its input is
    checked (bad input is exit 2 with nothing written)."""
    from .config import cache_dir
    from .store import Store

    return Store(cache_dir(), create=False)


def _fetch_interrupted(store):
    """Ctrl-C during fetch: what is kept, and that running it again resumes."""
    from .errors import Interrupted

    return Interrupted(f"interrupted: finished layers and partial downloads are kept in the cache "
                       f"({store.root}); the bundle was not finished (it has no bundle.json)",
                       hint="run the same command again to resume: it downloads only what is missing "
                            "and finishes the bundle")


# fetch -f SPEC: what the spec decides unless given on the command line (lock.spec_fetch_options' names)
_SPEC_OPTIONS = (("platforms", "arch"), ("platforms", "platform_"), ("mirrors", "mirrors_file"), ("output", "output"),
                 ("mirror", "mirror"), ("chunk_size", "chunk_size"), ("compress", "compress"))


def _bundle_report(summary: dict, describe, signed, as_json: bool) -> None:
    """fetch/export's report: the bundle's, then who signed it (bundle.signature.Signed, or None)."""
    if as_json:
        summary["signature"] = {"path": str(signed.path), "signer": signed.signer} if signed else None
        emit_json(summary)
        return
    click.echo(describe())
    if signed:
        click.echo(f"signed: {signed.path} by {signed.signer}")
        click.echo(_signed_offline_line(signed.path.parent))


def _signed_offline_line(bundle_dir) -> str:
    """After `offline side: ... --expect ...`: a site that trusts the key needs no hash, only its policy."""
    import shlex

    from .bundle.format import LOAD_SH, TOOL_PYZ

    d = shlex.quote(str(bundle_dir))
    pyz = (f"python3 {shlex.quote(str(bundle_dir / TOOL_PYZ))} load {d}, or: "
           if (bundle_dir / TOOL_PYZ).is_file() else "")
    return (f"offline side, where allowed_signers lists this key: imgtool load {d}   (the installed imgtool; "
            f"{pyz}sh {shlex.quote(str(bundle_dir / LOAD_SH))} check the policy too, but for damage only)")


@cli.command()
@click.argument("refs", nargs=-1)
@click.option("-f", "--file", "spec_file", metavar="SPEC",
              help="Build the bundle a spec file describes (bundle.toml), pinned by bundle.lock beside it if present.")
@click.option("--created", metavar="TIME", help="bundle.json's creation time, UTC 2025-06-01T08:00:00Z or unix "
                                              "seconds (default: $SOURCE_DATE_EPOCH, else now).")
@click.option("--arch", help="Architecture(s): amd64, arm64 (aliases x86_64, aarch64); comma list allowed.")
@click.option("--platform", "platform_", metavar="OS/ARCH[/VARIANT]", help="Platform, e.g. linux/arm64/v8.")
@click.option("-o", "--output", type=click.Path(), help="Bundle directory (default: named from image, tag, arch).")
@mirror_option
@mirrors_option
@click.option("--chunk-size", metavar="SIZE", help=CHUNK_SIZE_HELP)
@click.option("--compress", type=click.Choice(COMPRESSIONS), default="none", show_default=True,
              help="Compress the whole archive (layers are already gzip).")
@click.option("--layers", "layers", type=click.Choice(["compat", "as-is", "plain"]), default="compat", show_default=True,
              help="compat: rewrite zstd layers as gzip, so Docker before 23.0 (Kylin's 18.09) loads the bundle "
                   "(the image ID stays, the manifest digest changes); as-is: the registry's bytes (Docker 23+ "
                   "only when they are zstd); plain: every layer uncompressed, as docker save writes them.")
@gzip_library_option
@click.option("--jobs", type=int, default=12, show_default=True,
              help="Connections to each source (a registry and its mirrors are each a source).")
@click.option("--max-connections", type=int, default=32, show_default=True,
              help="Connections at once over every source.")
@click.option("--force", is_flag=True, help="Replace an existing output directory.")
@click.option("--have", type=click.Path(dir_okay=False), metavar="FILE",
              help="Delta: leave out layers the offline Docker holds (FILE from `imgtool inventory -o`).")
@click.option("--base", type=click.Path(file_okay=False), metavar="DIR",
              help="Delta: leave out layers of this earlier bundle (assumed loaded on the offline side).")
@tool_option
@sign_key_option
@json_option("result")
@common
def fetch(spec_file, created, refs, arch, platform_, output, mirror, mirrors_file, chunk_size, compress, layers,
          gzip_library, jobs, max_connections, force, have, base, tool, sign_key, as_json):
    """Pull images from the fastest healthy mirror into a verified bundle directory.

    REFS are tags of the default image (v0.22.1rc1, v0.22.1rc1-a3), NAME:TAG, or full
    references (host/path:tag, ...@sha256:...). Several go into one bundle. Or -f SPEC:
    a bundle.toml naming images and platforms, pinned by `imgtool lock`.
    """
    from .config import source_date_epoch
    from .fetch import FetchOptions, fetch as do_fetch, parse_platforms
    from .lock import spec_fetch_options
    from .spec import parse_created

    config = _registries(mirrors_file)
    opts = FetchOptions(refs=refs, platforms=parse_platforms(arch, platform_), output=output, mirror=mirror,
                        chunk_size=_size_option(chunk_size), compress=compress, jobs=jobs,
                        max_connections=max_connections, force=force, have=have, base=base, tool=tool, layers=layers,
                        sign_key=sign_key, gzip_library=gzip_library,
                        created=parse_created(created, source_date_epoch()))
    if spec_file:
        given = {field for field, option in _SPEC_OPTIONS if _given(option)}
        config, opts = spec_fetch_options(spec_file, opts, config, given, progress())
    _warn_chunk_size(opts.chunk_size)
    store = _store()
    try:
        result = do_fetch(config, opts, store, progress())
    except KeyboardInterrupt:
        raise _fetch_interrupted(store) from None
    summary = result.bundle.summary(result.images, result.stats)
    if spec_file:
        summary.update(spec=spec_file, lock=str(opts.lock.path) if opts.lock else None)
    _bundle_report(summary, lambda: result.bundle.describe(result.images, result.stats), result.signed, as_json)


@cli.command()
@click.argument("images", nargs=-1, required=True)
@click.option("-o", "--output", type=click.Path(), help="Bundle directory (default: named from image, tag, arch).")
@click.option("--chunk-size", metavar="SIZE", help=CHUNK_SIZE_HELP)
@click.option("--compress", type=click.Choice(COMPRESSIONS), default="none", show_default=True,
              help="Compress the whole archive (layers are gzip-compressed anyway).")
@click.option("--gzip-level", type=int, default=1, show_default=True,
              help="gzip level for the layers, 1 (fast: ISA-L when installed) to 9 (small); 2-9 are zlib's.")
@gzip_library_option
@click.option("--jobs", type=int, default=0, help="Compression threads (default: the CPU count).")
@click.option("--force", is_flag=True, help="Replace an existing output directory.")
@tool_option
@sign_key_option
@json_option("result")
@common
def export(images, output, chunk_size, compress, gzip_level, gzip_library, jobs, force, tool, sign_key, as_json):
    """Write a bundle from images already in the local Docker (for users who pulled with docker).

    IMAGES are names as `docker images` shows them (or IDs of tagged images). Layers arrive
    uncompressed from `docker save` and are gzip-compressed in parallel, so the bundle still
    loads on old Docker.
    """
    from .config import docker_host
    from .runtimes.docker import open_daemon
    from .export import ExportOptions, check_options, export as do_export

    opts = ExportOptions(images, output=output, chunk_size=_size_option(chunk_size), compress=compress,
                         gzip_level=gzip_level, gzip_library=gzip_library, jobs=jobs, force=force, tool=tool,
                         sign_key=sign_key)
    _warn_chunk_size(opts.chunk_size)
    check_options(opts)  # bad input is exit 2 before Docker is asked
    with open_daemon(host=docker_host()) as daemon:
        result = do_export(opts, daemon, _store(), progress())
    _bundle_report(result.bundle.summary(result.images), lambda: result.bundle.describe(result.images), result.signed,
                   as_json)


@cli.command()
@click.argument("ref")
@mirror_option
@mirrors_option
@json_option("result")
@common
def inspect(ref, mirror, mirrors_file, as_json):
    """Show an image's platforms, sizes, layer counts, digest and the source that answered."""
    from .inspection import inspect as do_inspect
    from .model import format_size

    r = do_inspect(_registries(mirrors_file), ref, mirror, _store(), progress())
    if as_json:
        emit_json({
            "ref": r.ref.tagged, "digest": str(r.digest), "media_type": r.media_type,
            "source": {"name": r.source.name, "reference": r.source.location},
            "platforms": [{"platform": str(p.platform), "manifest_digest": str(p.manifest_digest),
                           "compressed_size": p.size, "layers": p.layers} for p in r.platforms],
        })
        return
    click.echo("\n".join(for_terminal(line) for line in (r.ref.tagged, f"digest:  {r.digest}", f"type:    {r.media_type}",
                                                          f"source:  {r.source.describe()}")) + "\n")
    click.echo(table([(str(p.platform), format_size(p.size), p.layers, str(p.manifest_digest)) for p in r.platforms],
                     ["platform", "compressed", "layers", "manifest digest"]))


@cli.command("mirrors")
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
    from .mirror_report import mirror_report

    config = _registries(mirrors_file)
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


# --- Ascend hosts: docker run presets ----------------------------------------------


class _CommandAfterDashes(click.Command):
    """A verb whose words after `--` are the container's command, kept apart from IMAGE."""

    def parse_args(self, ctx, args):
        if "--" in args:
            i = args.index("--")
            ctx.meta["imgtool.container_command"] = tuple(args[i + 1:])
            args = args[:i]
        return super().parse_args(ctx, args)

    def collect_usage_pieces(self, ctx):
        return super().collect_usage_pieces(ctx) + ["[-- CMD...]"]


presets_option = click.option("--presets", "presets_file", metavar="FILE",
                              help="Presets file merged over the built-in ones (default: $IMGTOOL_PRESETS, "
                                   "~/.config/imgtool/presets.toml).")


def run_options(f):
    """The options `run-flags` and `run` share: what changes the container."""
    options = [
        click.option("--devices", metavar="0,1|0-7|all",
                     help="Cards /dev/davinciN to pass (default: all of the preset's; run: those present)."),
        click.option("--shm-size", metavar="SIZE", help="Size of /dev/shm, e.g. 16g (default: the preset's)."),
        click.option("--privileged", is_flag=True,
                     help="Add --privileged (never added unless asked for or required by the preset)."),
        click.option("--net", "network", metavar="host|bridge|none|NAME", help="Container network; host drops -p."),
        click.option("--multi-node", is_flag=True, help="Multi-node serving: host network plus hccn_tool."),
        click.option("--name", metavar="NAME", help="Container name (default: vllm-ascend)."),
        click.option("--env-preset", "env_presets", multiple=True, metavar="NAME",
                     help="deterministic (FAQ 15) or expandable-segments (FAQ 12); repeatable."),
        click.option("-e", "--env", multiple=True, metavar="NAME=VALUE", help="Environment variable; repeatable."),
        click.option("-v", "--volume", "volumes", multiple=True, metavar="/HOST:/CONTAINER[:ro]",
                     help="Extra bind mount, e.g. the model directory; repeatable."),
        click.option("-p", "--publish", multiple=True, metavar="[IP:]HOST:CONTAINER",
                     help="Published port, replacing the preset's 8000:8000; repeatable."),
        click.option("-d", "--detach", is_flag=True, help="Start in the background, like docker run -itd."),
        click.option("--rm/--no-rm", "remove", default=True, show_default=True,
                     help="Remove the container when it exits."),
        click.option("--runtime", type=click.Choice(CHOICES), default="auto", show_default=True,
                     help="The runtime: `docker run` or `podman run` (the same flags; podman also gets --pull=never); "
                          "auto chooses as load does: on a Kubernetes node the kubelet's runtime (containerd: a Pod, "
                          "run-flags --format k8s), elsewhere the first of Docker, containerd, Podman that answers."),
        mirrors_option,
        presets_option,
    ]
    for option in reversed(options):
        f = option(f)
    return f


def _run_spec(preset_name, kw, program=PROGRAMS[0]):
    """(PresetSet, Preset, RunSpec without image, MirrorConfig) from a verb's options, rendered for `program`."""
    from . import presets as P
    from .config import load_mirrors

    pset = P.load_presets(kw.pop("presets_file"))
    preset = pset.get(preset_name)
    command = click.get_current_context().meta.get("imgtool.container_command", ())
    opts = P.RunOptions(
        devices=kw["devices"], shm_size=kw["shm_size"], privileged=kw["privileged"], network=kw["network"],
        name=kw["name"] or P.DEFAULT_NAME, env_presets=tuple(kw["env_presets"]), env=tuple(kw["env"]),
        volumes=tuple(kw["volumes"]), publish=tuple(kw["publish"]), multi_node=kw["multi_node"],
        detach=kw["detach"], remove=kw["remove"], command=command, program=program)
    spec = P.build_spec(pset, preset_name, opts)
    return pset, preset, spec, load_mirrors(kw["mirrors_file"])


ASK_TIMEOUT = 5  # run-flags asks the runtime about local images, and needs no runtime at all


def _ask_runtime(choice):
    """The runtime `choice` names (auto: as load chooses), opened to ask about local images, or None when none
    answers (run-flags needs no runtime): the caller closes it."""
    from .errors import DaemonError
    from .runtimes.choice import open_runtime

    try:
        return open_runtime(choice, timeout=ASK_TIMEOUT, create=False)
    except DaemonError:
        return None


def _local_tags(repository, runtime):
    """Tags of `repository` in `runtime`, or None when there is none or it cannot be asked."""
    from .errors import DaemonError

    try:
        return runtime.local_tags(repository) if runtime is not None else None
    except DaemonError:
        return None


def _arch_warning(spec, runtime):
    """The runtime's warning for an image of another architecture, or None (also when it cannot be asked)."""
    from .errors import DaemonError

    try:
        return runtime.arch_warning(spec.image) if runtime is not None else None
    except DaemonError:
        return None  # run-flags works without a runtime


def _warn_spec(spec, preset, default_image, runtime):
    from . import presets as P

    warning = P.privileged_warning(spec)
    if warning:
        progress().warn(warning)
    mismatch = P.suffix_mismatch(preset, spec.image, default_image)
    if mismatch:
        progress().warn(mismatch)
    if not spec.image_is_placeholder:  # the same warning as load and doctor: exec format error ahead
        wrong_arch = _arch_warning(spec, runtime)
        if wrong_arch:
            progress().warn(wrong_arch)


def _image_to_run(spec, preset, image, default_image, local_tags):
    """The spec with IMAGE (a bare tag: of the default image), else the newest local image for the preset;
    raises UsageError when there is none. `local_tags(repository)` asks the runtime."""
    from . import presets as P
    from .errors import UsageError

    if image:
        return spec.with_image(P.normalize_image(image, default_image))
    newest, placeholder = P.default_image_for(preset, default_image, local_tags(default_image))
    if placeholder:
        raise UsageError(f"no {default_image} image for preset {preset.name} is loaded in {spec.program.title} "
                         f"(looked for tags {', '.join(preset.tag_patterns)})",
                         hint=f"name one: imgtool run {preset.name} IMAGE, or load a bundle first: imgtool load DIR")
    return spec.with_image(newest)


@cli.command("presets")
@presets_option
@json_option("presets")
@common
def presets_cmd(presets_file, as_json):
    """List the docker run presets for Ascend hosts (see run-flags and run)."""
    from . import presets as P

    pset = P.load_presets(presets_file)
    if as_json:
        emit_json(pset.to_json())
        return
    rows = [(p.name, P.format_cards(p.cards), p.tag_pattern, p.description) for p in pset.presets]
    click.echo(table(rows, ["preset", "cards", "image tag", "description"]))
    click.echo("")
    click.echo("--multi-node applies to: " + ", ".join(p.name for p in pset.presets if p.multi_node))
    aliases = [f"{a} = {p.name}" for p in pset.presets for a in p.aliases]
    if aliases:
        click.echo("aliases: " + ", ".join(aliases))
    for e in pset.env_presets:
        click.echo(f"--env-preset {e.name}: {e.description}")


@cli.command("run-flags", cls=_CommandAfterDashes)
@click.argument("preset")
@click.option("--image", metavar="REF",
              help="Image or tag (default: the newest one for PRESET loaded in the runtime, else a placeholder).")
@run_options
@click.option("--one-line", is_flag=True, help="Print the command on one line instead of one flag per line.")
@click.option("--format", "fmt", type=click.Choice([p.name for p in PROGRAMS] + ["k8s"]), default=None,
              help="docker run, podman run, or a Kubernetes Pod/Deployment as YAML (default: --runtime's).")
@click.option("--kind", type=click.Choice(["pod", "deployment"]), default=None,
              help="k8s: a Pod (the default) or a Deployment.")
@click.option("--resource-name", metavar="DOMAIN/NAME",
              help="k8s: the device plugin's NPU resource (default: the preset's, e.g. huawei.com/Ascend910).")
@click.option("--bundle", "bundle_dir", metavar="DIR",
              help="k8s: name the image by the manifest digest this bundle holds for it (and its architecture).")
@click.option("--arch", metavar="ARCH",
              help="k8s --bundle: of a tag the bundle holds for several architectures, pin this one's manifest.")
@json_option("flags")
@common
def run_flags(preset, image, one_line, as_json, fmt, kind, resource_name, bundle_dir, arch, **kw):
    """Print the docker (or podman) run command for PRESET (a2, a3, 300i-duo, 200i-pro, a5, ...), ready to paste,
    or with --format k8s a Kubernetes Pod (or Deployment) for it.

    Words after -- become the container's command:

    \b
        imgtool run-flags a2 -v /data/models:/models -- vllm serve /models/Qwen3-8B
        imgtool run-flags a2 --format k8s --bundle DIR -- vllm serve Qwen/Qwen3-8B > pod.yaml
    """

    choice = _runtime_choice(kw.pop("runtime"), None, None)
    runtime = _ask_runtime(choice)
    try:
        fmt, program = _run_format(choice, runtime, fmt)
        if runtime is not None and fmt != "k8s" and runtime.traits.run_program != program:
            runtime.close()
            runtime = None  # the runtime that answered is not the one the command is for: not asked
        _run_flags(preset, image, one_line, as_json, fmt, kind, resource_name, bundle_dir, arch, kw, program, runtime)
    finally:
        if runtime is not None:
            runtime.close()


def _run_format(choice, runtime, fmt):
    """(the format, the program rendered): --format's, else the chosen runtime's `run` program, else (a runtime
    without one: containerd, whose containers the kubelet starts) a Pod. Raises UsageError."""
    from .errors import UsageError
    from .runtimes.choice import ROOMS

    if choice.effective != "auto":
        traits = ROOMS[choice.effective]
    else:  # the runtime that answered, as load would choose it; Docker's syntax when none does
        traits = runtime.traits if runtime is not None else next(iter(ROOMS.values()))
    programs = {p.name: p for p in PROGRAMS}
    if fmt is None:
        return ("k8s", PROGRAMS[0]) if traits.run_program is None else (traits.run_program.name, traits.run_program)
    if fmt in programs and choice.runtime != "auto" and traits.run_program != programs[fmt]:
        raise UsageError(f"--format {fmt} and --runtime {choice.runtime} name different programs: give one")
    return fmt, programs.get(fmt, traits.run_program or PROGRAMS[0])


def _run_flags(preset, image, one_line, as_json, fmt, kind, resource_name, bundle_dir, arch, kw, program, runtime):
    from . import presets as P
    from .errors import UsageError

    if fmt != "k8s":
        for given, flag in ((kind, "--kind"), (resource_name, "--resource-name"), (bundle_dir, "--bundle"),
                            (arch, "--arch")):
            if given is not None:
                raise UsageError(f"{flag} applies to --format k8s")
    elif one_line:
        raise UsageError("--one-line applies to --format docker and podman")
    elif arch is not None and bundle_dir is None:
        raise UsageError("--arch applies with --bundle: it chooses which of the bundle's manifests the Pod names")
    pset, p, spec, config = _run_spec(preset, kw, program)
    if fmt == "k8s":
        _k8s_flags(spec, p, image, config.default_image, kind, resource_name, bundle_dir, arch, as_json, runtime)
        return
    if image:
        spec = spec.with_image(P.normalize_image(image, config.default_image))
    else:
        spec = spec.with_image(*P.default_image_for(p, config.default_image,
                                                    _local_tags(config.default_image, runtime)))
    _warn_spec(spec, p, config.default_image, runtime)
    if spec.image_is_placeholder:
        progress().warn(f"no {config.default_image} image for preset {p.name} is loaded here; "
                        f"replace {P.PLACEHOLDER_TAG} in the command or pass --image")
    if as_json:
        emit_json(spec.to_json())
    else:
        click.echo(P.render_command(spec, one_line=one_line))


def _k8s_flags(spec, preset, image, default_image, kind, resource_name, bundle_dir, arch, as_json, runtime):
    """run-flags --format k8s: the Pod or Deployment, by digest from a bundle, else by tag (as for docker)."""
    from . import presets as P

    options = P.KubeOptions(kind=kind or "pod", resource_name=resource_name)
    architecture = pinned = None
    if bundle_dir is not None:
        wanted = P.normalize_image(image, default_image) if image else None
        held = P.image_from_bundle(bundle_dir, preset, wanted, default_image, arch)
        spec, architecture, pinned = spec.with_image(held.ref), held.architecture, held.pinned
    elif image:
        spec = spec.with_image(P.normalize_image(image, default_image))
    else:
        spec = spec.with_image(*P.default_image_for(preset, default_image, _local_tags(default_image, runtime)))
    doc = P.manifest(spec, preset, options, architecture)  # bad input is exit 2 before any warning
    for warning in (P.privileged_warning(spec), P.suffix_mismatch(preset, spec.image, default_image)):
        if warning:
            progress().warn(warning)
    if spec.image_is_placeholder:
        progress().warn(f"no {default_image} image for preset {preset.name} is loaded here; "
                        f"replace {P.PLACEHOLDER_TAG} in the manifest, pass --image, or --bundle DIR")
    if pinned is not None:  # warned about by tag (its hardware suffix), written by digest
        doc = P.manifest(spec.with_image(pinned), preset, options, architecture)
    if as_json:
        emit_json(doc)
    else:
        click.echo(P.to_yaml(doc), nl=False)


@cli.command("run", cls=_CommandAfterDashes)
@click.argument("preset")
@click.argument("image", required=False)
@run_options
@click.option("--allow-missing-devices", is_flag=True,
              help="Leave out absent device nodes and host files (to try a preset on a machine without NPUs).")
@common
def run_cmd(preset, image, allow_missing_devices, **kw):
    """Start a container for PRESET through Docker (or podman) and follow it; exits with its exit code.

    Uses the cards of this host within the preset's range. IMAGE defaults to the newest
    image for PRESET loaded in the runtime. Words after -- are the container's command:

    \b
        imgtool run a3 v0.11.0rc1-a3 -v /data/models:/models -- vllm serve /models/Qwen3-32B
    """
    from . import presets as P
    from .runtimes.choice import ROOMS, open_runtime, refuse_without_run, runner

    choice = _runtime_choice(kw.pop("runtime"), None, None)
    devices_given = P.explicit_cards(kw["devices"])
    pset, p, spec, config = _run_spec(preset, kw)
    spec, left_out = P.fit_to_host(spec, pset, devices_given, allow_missing_devices)
    if left_out:
        progress().note(f"--allow-missing-devices: leaving out {len(left_out)} absent path(s): {', '.join(left_out)}")
    _say_choice(choice)
    if choice.effective in ROOMS:
        refuse_without_run(ROOMS[choice.effective])  # before asking it anything
    with open_runtime(choice, timeout=None) as opened:  # a container's output may pause for hours: no read timeout
        runtime, program = runner(opened)
        spec = spec.for_program(program)
        spec = _image_to_run(spec, p, image, config.default_image, runtime.local_tags)
        _warn_spec(spec, p, config.default_image, runtime)
        code, container = runtime.run_container(spec, lambda interactive: P.render_argv(spec.for_terminal(interactive)))
    if spec.detach:
        click.echo(container)
    click.get_current_context().exit(code)


# --- offline side: verify, load, doctor --------------------------------------------


signers_option = click.option(
    "--signers", metavar="FILE",
    help="Only a bundle signed by a key in FILE (OpenSSH allowed_signers) passes (default: $IMGTOOL_SIGNERS, "
         "~/.config/imgtool/allowed_signers, /etc/imgtool/allowed_signers; none: a signature is checked and reported).")


def runtime_options(f):
    """--runtime, --address, --namespace: one declaration for load, inventory and doctor."""
    f = click.option("--namespace", metavar="NS",
                     help="containerd's namespace (default: $CONTAINERD_NAMESPACE, else k8s.io, the kubelet's).")(f)
    f = click.option("--address", metavar="SOCKET",
                     help="containerd's socket (default: $CONTAINERD_ADDRESS, else /run/containerd/containerd.sock).")(f)
    f = click.option("--runtime", "runtime", type=click.Choice(CHOICES),
                     default="auto", show_default=True,
                     help="Where images go: Docker (DOCKER_HOST), containerd (a Kubernetes node) or Podman; "
                          "auto: on a Kubernetes node the kubelet's runtime (its configuration says which), "
                          "elsewhere Docker if its socket answers, else containerd if its socket answers, else Podman.")(f)
    return f


def _runtime_choice(runtime, address, namespace):
    """The runtime options, the runtimes' variables and this node's kubelet (read-only), as a Choice; the
    kubelet's files that cannot be read are said on stderr."""
    from .config import runtime_environment
    from .runtimes import kubelet
    from .runtimes.choice import Choice

    warnings: list = []
    found = kubelet.find(warnings)
    for w in dict.fromkeys(warnings):
        progress().warn(w)
    return Choice.from_options(runtime, address, namespace, runtime_environment(), kubelet=found)


def _say_choice(choice) -> None:
    """Why auto chose the kubelet's runtime, or that the choice sends images where the kubelet does not look."""
    p = progress()
    if choice.reason():
        p.note(choice.reason())
    if choice.elsewhere():
        p.warn(choice.elsewhere() + ": Pods on this node will not find the images there")


def _bundle_usage(bundle_dir, expect) -> None:
    """Bad input is exit 2 before any reading or Docker: --expect's form, DIR's existence."""
    from .bundle.format import parse_expect
    from .bundle.reader import bundle_directory

    if expect is not None:
        parse_expect(expect)
    bundle_directory(bundle_dir)


@cli.command()
@click.argument("bundle_dir", metavar="DIR", type=click.Path(file_okay=False))
@click.option("--expect", metavar="SHA256", help="The sha256 of bundle.json that `fetch` printed (publish it).")
@click.option("--quick", is_flag=True, help="Check parts only (sizes, sha256), not every blob and diff_id inside.")
@click.option("--jobs", type=click.IntRange(1, 64), default=None, help="Threads for hashing (default: CPU count).")
@signers_option
@json_option("report")
@common
def verify(bundle_dir, expect, quick, jobs, signers, as_json):
    """Check a bundle directory: bundle.json, every part, and every blob inside.

    Exit 0 when the bundle is sound, 3 when not (each problem is named, with what to do).
    """
    from .bundle.verify import verify_bundle
    from .model import format_size

    _bundle_usage(bundle_dir, expect)
    p = progress()
    report = verify_bundle(bundle_dir, expect=expect, quick=quick, progress=p, jobs=jobs, signers=signers)
    for w in report.warnings:
        p.warn(w)
    if as_json:
        emit_json(report.to_json())
    elif report.ok:
        what = "parts checked (quick: the blobs inside were not)" if quick else \
            f"{len(report.index.parts)} parts, {report.blobs_checked} blobs and {report.layers_checked} layer diff_ids checked"
        click.echo(f"ok: {report.dir}: {len(report.index.images)} image(s); {what}; "
                   f"{format_size(report.bytes_read)} in {report.seconds:.1f} s")
        for im in report.index.images:
            click.echo(for_terminal(f"  {im.ref}  {im.platform}  ID {im.image_id.short}"))
        if report.index.is_delta:
            from .delta import describe_requirements, requirements

            chains = report.index.omitted_chains()
            click.echo(f"delta bundle: {len(chains)} layers left out on purpose "
                       f"(Docker must already hold them: {describe_requirements(requirements(chains))})")
        if report.unpacked_size is not None:
            click.echo(f"unpacked size: {format_size(report.unpacked_size)}")
        click.echo(f"bundle.json sha256: {report.bundle_json_sha256}")
        _echo_signature(report.signature)
    report.raise_if_bad()


@cli.command()
@click.argument("bundle_dir", metavar="DIR", type=click.Path(file_okay=False))
@click.option("--tag", "tags", multiple=True, metavar="NAME",
              help="Also tag the image NAME[:TAG] (SOURCE=NAME when the bundle holds several). Repeatable.")
@click.option("--expect", metavar="SHA256", help="The sha256 of bundle.json that `fetch` printed.")
@click.option("--force", is_flag=True, help="Load even when Docker's disk looks too small.")
@click.option("--arch", metavar="ARCH",
              help="Of a tag held for several architectures, load this one (default: the runtime host's).")
@click.option("--all-platforms", is_flag=True,
              help="Of a tag held for several architectures, load every one; the tag names the host's "
                   "(or --arch's), the others are kept by ID (on containerd: by digest, REPO@sha256:...).")
@click.option("--quick", is_flag=True,
              help="When Docker already holds the images: check only that every part is there at its size "
                   "(default: also every part's sha256 and every blob) before tagging.")
@click.option("--no-pin", is_flag=True,
              help="On containerd, leave the images unpinned (by default they are labelled io.cri-containerd.pinned="
                   "pinned, which the kubelet's image GC skips on containerd 1.7+).")
@signers_option
@runtime_options
@json_option("result")
@common
def load(bundle_dir, tags, expect, force, arch, all_platforms, quick, no_pin, signers, runtime, address, namespace,
         as_json):
    """Check a bundle, then stream it into Docker, containerd or Podman and confirm it.

    Every part's sha256, every tar header and every blob's digest are checked while the parts
    stream into the runtime; the first mismatch cuts the upload short, the runtime drops what it
    got and nothing is loaded (the runtime checks each layer's diff_id itself). Missing or
    wrong-size parts, SHA256SUMS and --expect are checked before the runtime is sent anything.
    On a Kubernetes node, the image goes where the kubelet reads images (containerd: its endpoint,
    namespace k8s.io, unpacked and pinned; cri-dockerd: Docker).
    """
    from .bundle.load import load_bundle
    from .bundle.reader import read_index
    from .model import format_size
    from .runtimes.choice import open_runtime

    _bundle_usage(bundle_dir, expect)
    choice = _runtime_choice(runtime, address, namespace)
    read_index(bundle_dir)  # no bundle.json, or a broken one, is named before the runtime is asked anything
    p = progress()
    _say_choice(choice)
    with open_runtime(choice) as daemon:
        result = load_bundle(bundle_dir, daemon, tags=tags, expect=expect, force=force, quick=quick, progress=p,
                             arch=arch, signers=signers, all_platforms=all_platforms, pin=not no_pin)
    if as_json:
        emit_json(dict(result.to_json(), runtime_choice=choice.reason() or None))
        return
    if not result.sent:
        for w in result.warnings:
            p.warn(w)
    for im in result.images:
        if im.finished:
            p.note(f"finished {im.ref}: an earlier load had left it unfinished ({im.finished})")
    pinned = [im.ref for im in result.images if im.pinned]
    if pinned:
        p.note(f"pinned: {', '.join(pinned)} (io.cri-containerd.pinned=pinned: the kubelet's image GC keeps "
               "them on containerd 1.7+)")
    rows = [(", ".join(im.tags) or im.ref, im.docker_id[7:19], im.platform, format_size(im.size)) for im in result.images]
    click.echo(table(rows, ["name", "id", "platform", "size"]))
    where = _runtime_title(result.daemon)
    if result.sent:
        click.echo(f"loaded {len(result.images)} image(s) from {result.dir} in {result.seconds:.1f} s "
                   f"({format_size(result.bytes_sent)} sent to {where} {result.daemon['version']}"
                   f"{_namespace_words(result.daemon)})")
    else:
        click.echo(f"already loaded: nothing sent to {where} ({result.dir}{_namespace_words(result.daemon)})")
    _echo_signature(result.signature)


def _runtime_title(facts: dict) -> str:
    return facts["title"]


def _namespace_words(facts: dict) -> str:
    return f", namespace {facts['namespace']}" if facts.get("namespace") else ""


def _echo_signature(verdict) -> None:
    """verify/load: the signature's line, when the bundle is signed or a policy asked for a signature."""
    from .trust import State

    if verdict is not None and (verdict.state is not State.UNSIGNED or verdict.policy):
        click.echo(f"signature: {verdict.message}")


@cli.command()
@click.argument("bundle_dir", metavar="DIR", type=click.Path(file_okay=False))
@click.option("--to", "to", required=True, metavar="HOST[:PORT][/NAMESPACE]",
              help="The registry inside the offline network (distribution, Harbor) and a namespace.")
@click.option("--insecure", is_flag=True, help="Unverified HTTPS, or plain HTTP (like dockerd's insecure-registries).")
@click.option("--ca-cert", type=click.Path(dir_okay=False), metavar="FILE", help="CA certificate of the registry.")
@json_option("result")
@common
def push(bundle_dir, to, insecure, ca_cert, as_json):
    """Push a bundle's images into a registry, so many nodes `docker pull` instead of each loading it.

    Credentials come from ~/.docker/config.json (docker login). The target repository is
    NAMESPACE/ + the image's path without its registry host:
    quay.io/ascend/vllm-ascend:v1 --to reg:5000/ai  ->  reg:5000/ai/ascend/vllm-ascend:v1
    """
    from .config import network_waits
    from .push import push_bundle

    net = network_waits()  # $IMGTOOL_READ_TIMEOUT, $IMGTOOL_RESPONSE_TIMEOUT, $IMGTOOL_MIN_RATE, as the other verbs
    waits = {"read_timeout": net.read_timeout, "response_timeout": net.response_timeout, "min_rate": net.min_rate,
             "helper_timeout": net.helper_timeout}
    result = push_bundle(bundle_dir, to, insecure=insecure, ca_cert=ca_cert, progress=progress(), waits=waits)
    for w in result.warnings:  # digests that differ from upstream's: said on stderr, as load's warnings are
        progress().warn(w)
    if as_json:
        emit_json(result.to_json())
    else:
        click.echo(result.describe())


@cli.command()
@click.argument("bundle_dirs", metavar="DIR...", nargs=-1, required=True, type=click.Path(file_okay=False))
@click.option("--listen", default="0.0.0.0:5000", show_default=True, metavar="ADDR:PORT",
              help="Where to answer (port 0: any free port, printed).")
@click.option("--tls-cert", type=click.Path(dir_okay=False), metavar="FILE",
              help="Serve HTTPS with this PEM certificate (chain); needs --tls-key.")
@click.option("--tls-key", type=click.Path(dir_okay=False), metavar="FILE", help="The PEM private key of --tls-cert.")
@click.option("--max-clients", type=click.IntRange(1, 1024), default=64, show_default=True, metavar="N",
              help="Connections served at once; more wait until one ends.")
@click.option("--timeout", type=click.FloatRange(0.1, 3600), default=60.0, show_default=True, metavar="SECONDS",
              help="A client silent (or not reading) this long is disconnected.")
@click.option("--unpack-to", type=click.Path(file_okay=False, path_type=pathlib.Path), metavar="DIR",
              help="Serve a --compress'ed bundle from its archive unpacked once into DIR (needs the tar's size; kept "
                   "for the next start). Uncompressed bundles are always served in place.")
@signers_option
@common
def serve(bundle_dirs, listen, tls_cert, tls_key, max_clients, timeout, unpack_to, signers):
    """Serve bundles as a read-only registry, so every node of a cluster pulls from this one.

    The OCI distribution API straight from the bundles' parts (no copy, no unpacking; a --compress'ed
    bundle only with --unpack-to): manifests by tag and digest (a tag held for several architectures
    as an index of them), blobs with Range, tags/list, _catalog. quay.io/ascend/vllm-ascend:TAG is served as
    ascend/vllm-ascend:TAG, as quay.io/ascend/vllm-ascend:TAG, and to containerd's mirror requests
    (hosts.toml), so pods keep their upstream image names. Each bundle must pass `verify --quick`
    and the signature policy first; each blob's digest is checked before it is first served.
    One log line per request on stderr; Ctrl-C (or SIGTERM) stops it (exit 130).
    """
    from .serve import Settings, hold_bundles, open_bundles, parse_listen
    from .serve import serve as run_server

    host, port = parse_listen(listen)
    if bool(tls_cert) != bool(tls_key):
        raise UsageError("--tls-cert and --tls-key go together", hint="give both, or neither for plain HTTP")
    for d in bundle_dirs:
        _bundle_usage(d, None)
    with hold_bundles(bundle_dirs):  # from before the check until the server stops: nothing replaces them meanwhile
        catalog, unpacked = open_bundles(bundle_dirs, signers=signers, progress=progress(), unpack_to=unpack_to)
        settings = Settings(host, port, tls_cert, tls_key, max_clients, timeout)
        run_server(bundle_dirs, catalog, settings, say=lambda line: click.echo(line),
                   log=lambda line: click.echo(line, err=True), unpacked=unpacked)


@cli.command()
@click.argument("bundle_dir", metavar="DIR", type=click.Path(file_okay=False))
@click.option("--key", required=True, metavar="KEY",
              help="An SSH private key, or the .pub of a key that ssh-agent holds (ssh-add -l lists them).")
@click.option("--quick", is_flag=True,
              help="Check only sizes and checksums before signing (not every blob inside the parts).")
@click.option("--jobs", type=click.IntRange(1, 64), default=None, metavar="N",
              help="Parts hashed in parallel (default: the number of CPUs).")
@json_option("result")
@common
def sign(bundle_dir, key, quick, jobs, as_json):
    """Sign a bundle: DIR/bundle.json.sig, an SSH signature (ssh-keygen -Y sign) over bundle.json.

    bundle.json pins every part's size and sha256, so this signs the whole bundle. Offline
    sites that list your public key in an allowed_signers file then load only bundles you signed.
    Only a bundle that verifies is signed: first every check of `imgtool verify` but the signature
    (SHA256SUMS, load.sh, imgtool.pyz, every part, and unless --quick every blob and layer inside),
    exit 3 and nothing written otherwise. Signing again (another key) replaces the signature.
    """
    from .bundle.signature import sign_bundle, signing_key_and_tool
    from .bundle.verify import verify_bundle

    _bundle_usage(bundle_dir, None)
    signing_key_and_tool(key)  # no key file or no ssh-keygen is said before the parts are read
    p = progress()
    report = verify_bundle(bundle_dir, quick=quick, progress=p, jobs=jobs, signature=False)
    for w in report.warnings:
        p.warn(w)
    report.raise_if_bad("sign")
    signed = sign_bundle(bundle_dir, key, checked=report.bundle_json_sha256)
    if as_json:
        emit_json({"dir": bundle_dir, "signature": str(signed.path), "signer": signed.signer})
    else:
        click.echo(f"signed: {signed.path} by {signed.signer}")


@cli.command()
@click.option("-o", "--output", type=click.Path(dir_okay=False), metavar="FILE",
              help="Write the inventory to FILE (atomically) instead of standard output.")
@runtime_options
@common
def inventory(output, runtime, address, namespace):
    """What this host's runtime already holds (image IDs, tags, layer diff_ids), as JSON.

    Carry it to the connected side: `imgtool fetch REF --have FILE` then leaves out every
    layer this runtime already has (a delta bundle). On a Kubernetes node: containerd's k8s.io.
    """
    from .inventory import check_output, take_inventory
    from .runtimes.choice import open_runtime

    path = check_output(output)  # a bad -o is named before the runtime is asked anything
    with open_runtime(_runtime_choice(runtime, address, namespace), timeout=120) as rt:
        result = take_inventory(rt, path)
    if result.path is None:
        click.echo(result.data.decode(), nl=False)
    else:
        progress().note(f"inventory: {len(result.inventory.images)} images, "
                        f"{result.layers} distinct layers -> {output}")


@cli.command()
@click.argument("bundle_dir", metavar="[DIR]", required=False, type=click.Path(file_okay=False))
@runtime_options
@json_option("checks")
@common
def doctor(bundle_dir, runtime, address, namespace, as_json):
    """Check this offline host: the runtimes (Docker, containerd, Podman), storage, free space,
    architecture, pigz, OS.

    With DIR, also whether that bundle fits this host. Exit 0 when nothing failed, 1 otherwise
    (a runtime that is absent fails only when no runtime is found, or when --runtime names it).
    """
    from .doctor import run_checks

    checks = run_checks(bundle_dir, choice=_runtime_choice(runtime, address, namespace))
    if as_json:
        emit_json([c.to_json() for c in checks])
    else:
        for c in checks:
            click.echo(f"{c.status.upper():<5} {c.name:<12} {c.detail}")
            if c.advice:
                click.echo(f"{'':<18}-> {c.advice}")
    if any(c.status == "fail" for c in checks):
        click.get_current_context().exit(EXIT_ERROR)


@cli.command()
@click.argument("ref", required=False)
@click.option("--filter", "pattern", metavar="GLOB", help="Only tags matching GLOB, e.g. 'v0.22*'.")
@mirror_option
@mirrors_option
@json_option("result")
@common
def tags(ref, pattern, mirror, mirrors_file, as_json):
    """List the tags of REF's repository (default: the default image), newest first, with variants."""
    from .mirrors import sources_for
    from .tags import list_tags

    config = _registries(mirrors_file)
    parsed = config.parse_ref(ref or "latest")
    result = list_tags(sources_for(parsed, config, mirror), parsed.name, pattern)
    report = progress()
    for note in result.notes:
        report.note(note)
    if as_json:
        emit_json({"repository": parsed.name, "source": result.source.name,
                   "tags": [{"tag": t.tag, "release": t.release, "hardware": t.hardware, "os": t.os,
                             "variant": t.variant} for t in result.tags]})
        return
    click.echo(table([(t.tag, t.release or "-", t.hardware or "-", t.os or "-") for t in result.tags],
                     ["tag", "release", "hardware", "os"]))


# --- release engineering: bundle specs, locks, diffs --------------------------------


@cli.command("lock")
@click.option("-f", "--file", "spec_file", metavar="SPEC", default="bundle.toml", show_default=True,
              help="The bundle spec; the lock is written beside it as bundle.lock.")
@click.option("--update", is_flag=True, help="Re-resolve every tag (even when the lock fits) and report what moved.")
@mirror_option
@mirrors_option
@json_option("changes")
@common
def lock_cmd(spec_file, update, mirror, mirrors_file, as_json):
    """Pin every image of a bundle spec to its index and platform manifest digests (bundle.lock).

    `imgtool fetch -f SPEC` then fetches exactly those digests, however the tags move.
    """
    from .config import network_waits
    from .lock import lock_spec

    waits = network_waits()
    result = lock_spec(spec_file, update, mirror if _given("mirror") else None, mirrors_file, waits.read_timeout,
                       _store(), progress(), waits.helper_timeout, waits=waits)
    spec, lock = result.spec, result.lock
    if as_json:
        emit_json(result.to_json())
    elif not result.written:
        click.echo(f"{spec.lock_path}: up to date with {spec.path} ({len(lock.images)} image(s) x "
                   f"{len(lock.platforms)} platform(s) pinned); --update re-resolves the tags")
    else:
        for c in result.changes:
            click.echo(c.describe())
        moved = sum(1 for c in result.changes if c.kind != "unchanged")
        click.echo(f"wrote {spec.lock_path}: {len(lock.images)} image(s) x {len(lock.platforms)} platform(s)"
                   + (f", {moved} change(s)" if result.old is not None else ""))


@cli.command("diff")
@click.argument("old", metavar="OLD")
@click.argument("new", metavar="NEW")
@json_option("comparison")
@common
def diff_cmd(old, new, as_json):
    """Compare two bundles (or a bundle and an `imgtool inventory` file): images, platforms, layers.

    Shared layers are what a delta bundle (`fetch --base OLD`) leaves out.
    """
    from .diff import diff_paths

    result = diff_paths(old, new)
    if as_json:
        emit_json(result.to_json())
    else:
        click.echo("\n".join(result.describe()))


@cli.command("self-bundle")
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
    from .selfbundle import build

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


@cli.command("self-install")
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

    from .install import self_install as install

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


@cli.command("self-update")
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
    from .install import self_update as update

    _bundle_usage(bundle_dir, expect)
    done = update(bundle_dir, expect=expect, signers=signers, allow_downgrade=allow_downgrade)
    if as_json:
        emit_json(done.to_json())
        return
    if done.unchanged:
        click.echo(done.unchanged)
        return
    click.echo(f"updated imgtool {done.previous} -> {done.version}: {done.pyz} (sha256 {done.sha256})")


M_ARENA_MAX = -8  # glibc's mallopt parameter


def _two_malloc_arenas() -> None:
    """glibc gives each thread that meets contention an arena of its own (up to 8 per core) and keeps what is
    freed in it: with a dozen download threads reading 256 KiB at a time, fetch's peak RSS rose with the
    connections. Two arenas: fetch of the scale-0.25 bench image 97-99 -> 82-86 MiB, the same speed
    (docs/benchmarks.md). Nothing on other C libraries (no mallopt) or when ctypes is missing."""
    try:
        import ctypes

        ctypes.CDLL(None).mallopt(M_ARENA_MAX, 2)
    except (ImportError, OSError, AttributeError):
        pass


def main(argv=None) -> None:
    """Console entry point: runs the CLI and maps every failure to one line and an exit code."""
    _two_malloc_arenas()  # before any thread: arenas are made as threads first allocate
    args = sys.argv[1:] if argv is None else list(argv)
    run = _Run()
    try:
        code = cli.main(args=args, prog_name="imgtool", standalone_mode=False, obj=run)
    except ImgtoolError as e:
        if run.debug:
            traceback.print_exc()
        _failed(run, e.message, e.hint, e.exit_code, getattr(e, "problems", ()))  # VerifyError: every finding
    except click.UsageError as e:  # click's own parsing (missing argument, bad choice...): our two lines
        text, hint = usage_lines(e, run.verb)
        run.json = run.json or "--json" in args  # a parse error comes before --json's callback
        _failed(run, text, hint, EXIT_USAGE)
    except click.exceptions.Abort as e:  # click turns Ctrl-C into Abort (after a new line on stderr)
        _failed(run, "interrupted" if isinstance(e.__context__, KeyboardInterrupt) else "aborted", None, 130)
    except click.ClickException as e:  # not a usage error (click.FileError...): still the one printer
        _failed(run, e.format_message(), None, e.exit_code if e.exit_code is not None else EXIT_USAGE)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        _failed(run, "interrupted", None, 130)
    except BrokenPipeError:
        sys.exit(EXIT_ERROR)
    except Exception as e:  # a bug: say so in one line unless --debug
        if run.debug:
            traceback.print_exc()
        _failed(run, f"internal error: {type(e).__name__}: {e}", "rerun with --debug for a traceback and report it",
                EXIT_ERROR)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":  # pragma: no cover
    main()
