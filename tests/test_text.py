"""Strings from outside are data (issue 35): text.py's three functions, and every generated file and terminal
line that carries a value from a registry, a mirror, bundle.json or an inventory, held with hostile strings.

The generated load.sh is run for real (`sh`), with stand-ins for docker and ctr that record their arguments:
for any hostile value it must do exactly what it does for a benign one (the same commands, the same
arguments, the same messages with the value in place) and run nothing else. Hypothesis draws the values,
derandomized: the same examples on every machine.
"""

import hashlib
import os
import socket
import stat
import subprocess
import tempfile
from pathlib import Path
from typing import Dict, List, Tuple

import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from imgtool.bundle import loadsh, texts
from imgtool.bundle.format import Archive, BundleImage, BundleIndex, Layer, Part
from imgtool.delta import chain_ids
from imgtool.model import DOCKER_LAYER_GZIP, DOCKER_MANIFEST, OCI_LAYER_ZSTD, Digest, Platform
from imgtool.presets.k8s import to_yaml
from imgtool.text import for_terminal, is_printable, sh_quote

BENIGN = "zq9benign"
HOST_ARCHES = ("amd64", "arm64", "arm", "386", "loong64", "s390x", os.uname().machine)  # what load.sh's host may be
MARKER = "owned"  # what the hostile strings try to create, in the directory load.sh runs in
PROPS = settings(max_examples=40, deadline=None, derandomize=True,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

# What an attacker would put in a tag, a variant, a name or an error message: quotes, command substitutions,
# newlines and carriage returns, escape sequences, comment and command separators, option-looking words,
# printf's own directives, bidirectional overrides, line separators, any other text without NUL.
FRAGMENTS = ["'", '"', f"$(touch {MARKER})", f"`touch {MARKER}`", "\n", "\r", "\x1b[2J", "\x1b]0;title\x07", "#",
             ";", "--", "-e", "\\", "\\n", "%s", "%n", "&", "|", "*", "?", "~", "{a,b}", "$HOME", "${x:-y}", "\t",
             "\u202e", "\u2028", "\x85", "é", "中文", " ", "EOF", "'\\''", f"\ntouch {MARKER}\n#", "\x7f", "\x01"]
_ANY = st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",))
HOSTILE = st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(_ANY, min_size=1, max_size=4)),
                   min_size=1, max_size=6).map("".join)


def d(n: int) -> Digest:
    return Digest.of(str(n).encode())


# --- the three functions ----------------------------------------------------------------------------------


def test_for_terminal_escapes_what_moves_the_cursor_and_keeps_text():
    assert for_terminal("v0.9.1 中文 é") == "v0.9.1 中文 é"
    assert for_terminal("a\nerror: forged\x1b[2J\r\u202e\u2028\x85") == "a\\nerror: forged\\x1b[2J\\r\\u202e\\u2028\\x85"
    assert is_printable("quay (https://quay.io/ascend/vllm-ascend)") and not is_printable("x\ny")


@PROPS
@given(HOSTILE)
def test_for_terminal_is_one_printable_line(value):
    shown = for_terminal(value)
    assert is_printable(shown, limit=10 ** 6) and len(shown.splitlines()) <= 1


@PROPS
@given(HOSTILE)
def test_sh_quote_is_one_word_that_sh_reads_back_unchanged(value):
    r = subprocess.run(["sh", "-c", f"printf '%s' {sh_quote(value)}"], capture_output=True, timeout=30)
    assert r.returncode == 0 and r.stdout == value.encode()


# --- load.sh, run --------------------------------------------------------------------------------------------

FAKE = """#!/bin/sh
# a stand-in for docker or ctr: each call's arguments, NUL-separated, in a file of its own
n=$(ls "$FAKE_LOG" | wc -l)
printf '%s\\0' "$@" > "$FAKE_LOG/$n"
case "$1" in -a) shift 4 ;; esac  # ctr -a ADDRESS -n NAMESPACE COMMAND ...
case "$1" in
    version) case "$*" in *Server.Version*) echo 20.10.7 ;; *Server.Arch*) echo amd64 ;; esac; exit 0 ;;
    image|snapshots) exit 1 ;;
    load) cat >/dev/null; exit 0 ;;
esac
exit 0
"""


def _image(ref: str, platform: Platform, layers: Tuple[Layer, ...], n: int) -> BundleImage:
    return BundleImage(ref=ref, source="test", platform=platform, index_digest=None, manifest_digest=d(100 + n),
                       manifest_media_type=DOCKER_MANIFEST, manifest_size=500, image_id=d(200 + n), config_size=300,
                       layers=layers)


def _index(images: List[BundleImage], created: str = "2025-01-01T00:00:00Z") -> BundleIndex:
    parts = (Part("b.tar.part001", 1024, "0" * 64), Part("b.tar.part002", 10, "1" * 64))
    return BundleIndex(created=created, imgtool_version="0.1.0", images=tuple(images),
                       archive=Archive("b.tar", "none", 1034, "2" * 64, 1034), parts=parts,
                       files=(Part("imgtool.pyz", 100, "3" * 64),))


def delta_index(value: str) -> BundleIndex:
    """A delta whose left-out layers an inventory's image `value` provides (load.sh's base check)."""
    diffs = [d(1), d(2)]
    chains = chain_ids(diffs)
    layers = (Layer(d(11), 100, diffs[0], DOCKER_LAYER_GZIP, True, chains[0], (value, "base:v0")),
              Layer(d(12), 100, diffs[1], DOCKER_LAYER_GZIP))
    return _index([_image("quay.io/a/b:v2", Platform("linux", "amd64"), layers, 1)])


def zstd_index(value: str) -> BundleIndex:
    """One image named `value` with a zstd layer (load.sh names it refusing Docker 20.10)."""
    layers = (Layer(d(11), 100, d(1), OCI_LAYER_ZSTD),)
    return _index([_image(value, Platform("linux", "amd64", None), layers, 1)], created=value)


def platform_index(value: str) -> BundleIndex:
    """A tag held for architecture `value` and amd64 (load.sh names the runtime's one after the load, or refuses
    the multi-arch tag in containerd), and an image whose variant is `value`."""
    layer = (Layer(d(11), 100, d(1), DOCKER_LAYER_GZIP),)
    return _index([_image("quay.io/a/b:v1", Platform("linux", value, value), layer, 1),
                   _image("quay.io/a/b:v1", Platform("linux", "amd64"), layer, 2),
                   _image("quay.io/a/c:v1", Platform("linux", "s390x", value), layer, 3)])


def foreign_index(value: str) -> BundleIndex:
    """Only an image for architecture `value`: containerd's platform check refuses it, naming the platform."""
    layer = (Layer(d(11), 100, d(1), DOCKER_LAYER_GZIP),)
    return _index([_image("quay.io/a/b:v1", Platform("linux", value, "v8"), layer, 1)])


Run = Tuple[int, bytes, bytes, List[List[bytes]], bool]


def run_load_sh(script: bytes, runtime: str, args: Tuple[str, ...] = ()) -> Run:
    """load.sh run in a directory of its own against the stand-ins: (exit, stdout, stderr, each call's
    arguments, whether anything else appeared in the directory)."""
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        bundle, log = work / "bundle", work / "log"
        bundle.mkdir()
        log.mkdir()
        fake = work / "fake"
        fake.write_text(FAKE)
        fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
        (bundle / "load.sh").write_bytes(script)
        # the parts _index names, at their sizes, and their sums: load.sh refuses what it cannot check
        sums = []
        for name, size in (("b.tar.part001", 1024), ("b.tar.part002", 10)):
            (bundle / name).write_bytes(b"x" * size)
            sums.append(f"{hashlib.sha256(b'x' * size).hexdigest()}  {name}\n")
        (bundle / "SHA256SUMS").write_text("".join(sums))
        files = sorted(p.name for p in bundle.iterdir())
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(work / "containerd.sock"))
        sock.close()
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(work), "IMGTOOL_SIGNERS": "",
               "FAKE_LOG": str(log), "CONTAINERD_ADDRESS": str(work / "containerd.sock"),
               "DOCKER": str(fake) if runtime == "docker" else str(work / "none"), "CTR": str(fake)}
        r = subprocess.run(["sh", "load.sh", "--runtime", runtime, *args], cwd=bundle, env=env, capture_output=True,
                           timeout=60)
        here = str(work).encode()  # a new directory per run: said as TMP, so runs compare
        calls = [[a.replace(here, b"TMP") for a in (log / str(i)).read_bytes().split(b"\0")[:-1]]
                 for i in range(len(list(log.iterdir())))]
        extra = sorted(p.name for p in bundle.iterdir()) != files or (work / MARKER).exists()
        return r.returncode, r.stdout.replace(here, b"TMP"), r.stderr.replace(here, b"TMP"), calls, extra


def _with(value: str, benign: Run) -> Run:
    code, out, err, calls, extra = benign
    v, b = value.encode(), BENIGN.encode()
    return code, out.replace(b, v), err.replace(b, v), [[a.replace(b, v) for a in call] for call in calls], extra


_BENIGN_RUNS: Dict[Tuple[str, str, Tuple[str, ...]], Run] = {}


def same_as_benign(make, value: str, runtime: str, args: Tuple[str, ...] = ()) -> None:
    script = loadsh.load_sh(make(value))
    assert subprocess.run(["sh", "-n"], input=script, capture_output=True, timeout=30).returncode == 0
    key = (make.__name__, runtime, args)
    if key not in _BENIGN_RUNS:
        _BENIGN_RUNS[key] = run_load_sh(loadsh.load_sh(make(BENIGN)), runtime, args)
    hostile = run_load_sh(script, runtime, args)
    assert hostile == _with(value, _BENIGN_RUNS[key])
    assert not hostile[4], "load.sh created a file"


def test_the_benign_runs_reach_the_values():
    """The scenarios below exercise the lines that carry the values: the base check asks for the image by its
    name, the zstd refusal, the platform check and the multi-arch refusal name them."""
    code, _, err, calls, _ = run_load_sh(loadsh.load_sh(delta_index(BENIGN)), "docker")
    assert code == 1 and [b"image", b"inspect", BENIGN.encode()] in calls, err
    assert f"Docker lacks one of {BENIGN}, base:v0; load that image".encode() in err
    code, _, err, _, _ = run_load_sh(loadsh.load_sh(delta_index(BENIGN)), "containerd")
    assert code == 1 and f"containerd (namespace k8s.io) lacks one of {BENIGN}, base:v0;".encode() in err, err
    code, _, err, _, _ = run_load_sh(loadsh.load_sh(zstd_index(BENIGN)), "docker")
    assert code == 5 and f"zstd-compressed layers ({BENIGN}), which Docker 20.10.7 cannot read".encode() in err, err
    code, _, err, calls, _ = run_load_sh(loadsh.load_sh(platform_index(BENIGN)), "docker")
    assert code == 0 and [b"tag", str(d(202)).encode(), b"quay.io/a/b:v1"] in calls, err
    code, _, err, _, _ = run_load_sh(loadsh.load_sh(platform_index(BENIGN)), "containerd")
    assert code == 5 and b"holds quay.io/a/b:v1 for several architectures" in err, err
    code, _, err, _, _ = run_load_sh(loadsh.load_sh(foreign_index(BENIGN)), "containerd")
    assert code == 1 and f"(it holds linux/{BENIGN}/v8), and containerd".encode() in err, err


@PROPS
@given(HOSTILE)
def test_load_sh_does_the_same_with_a_hostile_inventory_name(value):
    assume(BENIGN not in value)
    same_as_benign(delta_index, value, "docker")
    same_as_benign(delta_index, value, "containerd")


@PROPS
@given(HOSTILE)
def test_load_sh_does_the_same_with_a_hostile_image_name(value):
    assume(BENIGN not in value)
    same_as_benign(zstd_index, value, "docker")
    same_as_benign(zstd_index, value, "docker", ("--help",))


@PROPS
@given(HOSTILE)
def test_load_sh_does_the_same_with_a_hostile_architecture_and_variant(value):
    assume(BENIGN not in value and value not in HOST_ARCHES)
    same_as_benign(platform_index, value, "docker")
    same_as_benign(platform_index, value, "containerd")
    same_as_benign(foreign_index, value, "containerd")


# --- README.txt, the Kubernetes YAML ------------------------------------------------------------------------


@PROPS
@given(HOSTILE)
def test_readme_shows_a_hostile_value_on_its_own_line_escaped(value):
    assume(BENIGN not in value)
    for make in (zstd_index, platform_index, foreign_index):
        benign, hostile = texts.readme(make(BENIGN)).decode(), texts.readme(make(value)).decode()
        assert len(hostile.splitlines()) == len(benign.splitlines())
        assert for_terminal(value) in hostile
        assert all(is_printable(line) for line in hostile.splitlines())


@PROPS
@given(HOSTILE, HOSTILE)
def test_the_yaml_parses_to_the_same_values(value, other):
    document = {"apiVersion": "v1", "metadata": {"name": value, "labels": {value: other}},
                "spec": {"containers": [{"name": other, "args": [value, other, "--", value],
                                         "env": [{"name": "X", "value": value}], "ports": [{"containerPort": 8000}]}],
                         "volumes": [{"hostPath": {"path": value}}, {}], "hostNetwork": True}}
    assert yaml.safe_load(to_yaml(document)) == document
