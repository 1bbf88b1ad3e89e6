"""The options several verbs share, declared once, and what turns them into values (the registries'
configuration, the blob cache, the runtime choice): one meaning per option name across verbs.

An option renamed for that keeps its old spelling for a release (`renamed`): still accepted, left out
of --help and docs/cli.md, which lists the old spellings in a table of its own.
"""

import copy

import click

from ..config import carriers_help
from ..runtimes.choice import CHOICES
from .output import progress, set_flag


class Renamed(click.Option):
    """An option that still answers to its old spelling (`old`), which --help does not show."""

    def __init__(self, *args, old=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.old = tuple(old)

    def _shown(self):
        shown = copy.copy(self)
        shown.opts = [o for o in self.opts if o not in self.old]
        return shown

    def get_help_record(self, ctx):
        return click.Option.get_help_record(self._shown(), ctx)

    def get_error_hint(self, ctx):  # "invalid value for '--threads'", whichever spelling was given
        return click.Option.get_error_hint(self._shown(), ctx)


def renamed(*decls, old, **attrs):
    """click.option for an option whose old spelling(s) `old` are kept for a release, hidden from --help."""
    return click.option(*decls, *old, cls=Renamed, old=old, **attrs)


def old_spellings(command: click.Command):
    """{old spelling: new spelling} of a verb's renamed options."""
    return {o: p.opts[0] for p in command.params if isinstance(p, Renamed) for o in p.old}


def common(f):
    """--debug and -q/--quiet, accepted after the verb as well as before it."""
    f = click.option("--debug", is_flag=True, expose_value=False, is_eager=True, callback=set_flag("debug"),
                     help="Show tracebacks on errors.")(f)
    f = click.option("-q", "--quiet", is_flag=True, expose_value=False, is_eager=True, callback=set_flag("quiet"),
                     help="No progress output.")(f)
    return f


def json_option(what: str = "result"):
    """--json, one declaration for every verb that has it: the result as JSON, and on failure a JSON
    document too (output.invoke() prints {"ok": false, "error": ...} when the verb printed none)."""
    return click.option("--json", "as_json", is_flag=True, is_eager=True, callback=set_flag("json"),
                        help=f"Print the {what} as JSON (on failure: the error as JSON).")


CHUNK_SIZE_HELP = ("Cut the archive into parts of SIZE, named for the carrier they fit (" + carriers_help() + ")."
                   " Discs need UDF for parts over 4 GiB.")
mirrors_option = renamed("--mirrors-file", "mirrors_file", old=("--mirrors",), metavar="FILE",
                         help="mirrors.toml to use (default: $IMGTOOL_MIRRORS, ~/.config/imgtool/mirrors.toml, built-in).")
tool_option = click.option("--tool/--no-tool", default=True, show_default=True,
                           help="Put imgtool.pyz (imgtool for any python3 3.7+, no install) into the bundle.")
sign_key_option = click.option("--sign-key", metavar="KEY",
                               help="Sign bundle.json once the bundle is complete (bundle.json.sig): an SSH private key, "
                                    "or the .pub of a key in ssh-agent.")
gzip_level_option = click.option(
    "--gzip-level", type=int, default=1, show_default=True, metavar="N",
    help="gzip level for the layers imgtool compresses, 1 (fast: ISA-L when installed) to 9 (small); 2-9 are zlib's.")
gzip_library_option = click.option(
    "--gzip-library", type=click.Choice(["auto", "isal", "zlib"]), default="auto", show_default=True,
    help="What gzips the layers imgtool compresses and a gzip archive: ISA-L (the isal package, several times faster) "
         "when installed, else zlib; bundle.json records it. zlib rebuilds a bundle made without isal byte for byte.")
mirror_option = click.option("--mirror", default="auto", show_default=True, metavar="NAME|auto",
                             help="Force one source from mirrors.toml, or probe all and use the healthy ones.")


def size_value(value):
    from ..config import parse_chunk_size

    return None if value is None else parse_chunk_size(value, "--chunk-size")


def warn_chunk_size(size) -> None:
    from ..config import chunk_size_warning

    warning = chunk_size_warning(size)
    if warning:
        progress().warn(warning)


def on_command_line(name) -> bool:
    """True when the option was on the command line (not its default)."""
    from click.core import ParameterSource

    return click.get_current_context().get_parameter_source(name) == ParameterSource.COMMANDLINE


def registries(mirrors_file):
    """The registry verbs' MirrorConfig, with $IMGTOOL_READ_TIMEOUT, $IMGTOOL_RESPONSE_TIMEOUT, $IMGTOOL_MIN_RATE
    and $IMGTOOL_CREDENTIAL_HELPER_TIMEOUT read once, here."""
    from ..config import load_mirrors, network_waits

    return load_mirrors(mirrors_file, waits=network_waits())


def blob_store():
    """The blob cache at $IMGTOOL_CACHE, built once here; the verb makes its directories once its input is
    checked (bad input is exit 2 with nothing written)."""
    from ..config import cache_dir
    from ..store import Store

    return Store(cache_dir(), create=False)

presets_option = click.option("--presets", "presets_file", metavar="FILE",
                              help="Presets file merged over the built-in ones (default: $IMGTOOL_PRESETS, "
                                   "~/.config/imgtool/presets.toml).")

def expect_option(help_text: str = "The sha256 of bundle.json that `fetch` printed."):
    """--expect SHA256: one declaration for the verbs that read a bundle (load, verify, copy, push)."""
    return click.option("--expect", metavar="SHA256", help=help_text)


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


def runtime_choice(runtime, address, namespace):
    """The runtime options, the runtimes' variables and this node's kubelet (read-only), as a Choice; the
    kubelet's files that cannot be read are said on stderr."""
    from ..config import runtime_environment
    from ..runtimes import kubelet
    from ..runtimes.choice import Choice

    warnings: list = []
    found = kubelet.find(warnings)
    for w in dict.fromkeys(warnings):
        progress().warn(w)
    return Choice.from_options(runtime, address, namespace, runtime_environment(), kubelet=found)


def say_choice(choice) -> None:
    """Why auto chose the kubelet's runtime, or that the choice sends images where the kubelet does not look."""
    p = progress()
    if choice.reason():
        p.note(choice.reason())
    if choice.elsewhere():
        p.warn(choice.elsewhere() + ": Pods on this node will not find the images there")


def bundle_usage(bundle_dir, expect) -> None:
    """Bad input is exit 2 before any reading or Docker: --expect's form, DIR's existence."""
    from ..bundle.format import parse_expect
    from ..bundle.reader import bundle_directory

    if expect is not None:
        parse_expect(expect)
    bundle_directory(bundle_dir)
