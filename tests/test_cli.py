"""What every verb shares, through the real CLI: usage errors, Docker unreachable, sizes.

Each case asserts the exact lines a user sees on stderr and the exit code.
"""

import json
import os
import re
import subprocess
import sys

import pytest

from tests.support.bundles import imgtool
from tests.support.registry import push_image

# click's own errors, each as one `error:` line and one `hint:` line, exit 2
USAGE = [
    (["fetchh", "v1"], ["error: unknown command 'fetchh'",
                        "hint: did you mean fetch? imgtool -h lists the commands"]),
    (["lod", "dir"], ["error: unknown command 'lod'",
                      "hint: did you mean load? imgtool -h lists the commands"]),
    (["zzzz"], ["error: unknown command 'zzzz'", "hint: imgtool -h lists the commands"]),
    (["fetch", "v1", "--compress", "bz2"],
     ["error: invalid value for '--compress': 'bz2' is not one of 'none', 'gzip', 'zstd'",
      "hint: usage: imgtool fetch [OPTIONS] [REFS]...; imgtool fetch -h explains every option"]),
    (["verify"], ["error: missing argument 'DIR'",
                  "hint: usage: imgtool verify [OPTIONS] DIR; imgtool verify -h explains every option"]),
    (["run-flags"], ["error: missing argument 'PRESET'",
                     "hint: usage: imgtool run-flags [OPTIONS] PRESET [-- CMD...]; "
                     "imgtool run-flags -h explains every option"]),
    (["fetch", "v1", "--bogus"], ["error: no such option: --bogus",
                                  "hint: did you mean --base or --connections? imgtool fetch -h lists the options"]),
    (["tags", "--filter"], ["error: option '--filter' requires an argument",
                            "hint: imgtool tags -h explains every option"]),
    (["load", "a", "b"], ["error: got unexpected extra argument (b)",
                          "hint: usage: imgtool load [OPTIONS] DIR; imgtool load -h explains every option"]),
    (["verify", "d", "--threads", "0"],
     ["error: invalid value for '--threads': 0 is not in the range 1<=x<=64",
      "hint: usage: imgtool verify [OPTIONS] DIR; imgtool verify -h explains every option"]),
]


@pytest.mark.parametrize("args,lines", USAGE, ids=[" ".join(a) for a, _ in USAGE])
def test_usage_errors_are_an_error_and_a_hint_line(args, lines):
    r = imgtool(*args)
    assert (r.returncode, r.stderr.splitlines(), r.stdout) == (2, lines, "")


# One name, one meaning (issue 37): the options renamed for it, (verb and arguments, old spelling, new spelling).
# The old spelling still works for a release and --help does not show it.
RENAMED = [(["fetch", "v1"], "--jobs", "--connections"), (["export", "x:1"], "--jobs", "--threads"),
           (["verify", "{tmp}"], "--jobs", "--threads"), (["sign", "{tmp}", "--sign-key", "k"], "--jobs", "--threads"),
           (["sign", "{tmp}"], "--key", "--sign-key")]
RENAMED += [(verb, "--mirrors", "--mirrors-file") for verb in (["fetch", "v1"], ["inspect", "v1"], ["mirrors"], ["tags"],
                                                                ["lock", "-f", "{tmp}/bundle.toml"], ["run-flags", "a2"],
                                                                ["run", "a2"])]


def test_a_renamed_option_is_shown_by_its_new_name_only():
    from click.testing import CliRunner

    from imgtool.cli import cli

    for verb, old, new in RENAMED:
        shown = CliRunner().invoke(cli, [verb[0], "--help"]).output
        options = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", shown))
        assert new in options and old not in options, (verb[0], old, new)


@pytest.mark.parametrize("verb,old,new", RENAMED, ids=[f"{v[0]} {o}" for v, o, _ in RENAMED])
def test_a_renamed_option_still_answers_to_its_old_spelling(verb, old, new, tmp_path):
    # a value each verb refuses, with words that show where it went: the old spelling reaches the same check
    value = {"--jobs": "0", "--key": str(tmp_path / "nokey"), "--mirrors": str(tmp_path / "mirrors.toml")}[old]
    (tmp_path / "mirrors.toml").write_text("default_image = \n")
    (tmp_path / "bundle.toml").write_text('images = ["v1"]\narch = ["arm64"]\n')
    args = [a.format(tmp=tmp_path) for a in verb]
    by_old, by_new = imgtool(*args, old, value), imgtool(*args, new, value)
    assert (by_old.returncode, by_old.stderr, by_old.stdout) == (by_new.returncode, by_new.stderr, by_new.stdout)
    assert by_old.returncode == 2
    what = {"--connections": "error: invalid --connections 0: use 1 to 64",
            "--threads": "error: invalid value for '--threads': 0 is not in the range 1<=x<=64",
            "--sign-key": f"error: signing key {value} does not exist or is not a file",
            "--mirrors-file": f"error: {value}: invalid TOML"}[new]
    assert by_old.stderr.startswith(what), by_old.stderr


@pytest.mark.parametrize("verb", [["fetch", "v1"], ["export", "x:1"]])
def test_chunk_size_below_1_mib_is_refused_with_the_reason(verb):
    # the floor is a parameter of the code, not a knob of the environment: the old test-only variable is inert
    r = imgtool(*verb, "--chunk-size", "100", env={"IMGTOOL_TEST_MIN_CHUNK_SIZE": "1"})
    assert r.returncode == 2
    assert r.stderr.splitlines() == [
        "error: invalid --chunk-size '100': parts must be at least 1 MiB "
        "(100 B parts would cut a 15 GiB image into 161,061,274 files)",
        "hint: use the largest file your medium takes: fat32, dvd, dvd-dl, bd25, bd50, or e.g. 700M",
    ]


def test_chunk_size_below_1_mib_in_a_spec_names_file_and_line(tmp_path):
    spec = tmp_path / "bundle.toml"
    spec.write_text('images = ["v1"]\narch = ["arm64"]\nchunk_size = "512K"\n')
    r = imgtool("fetch", "-f", str(spec))
    assert r.returncode == 2
    assert r.stderr.splitlines()[0] == (
        f"error: {spec}:3: invalid chunk_size '512K': parts must be at least 1 MiB "
        "(512 KiB parts would cut a 15 GiB image into 30,720 files)")


# --- Docker unreachable: said in words, and only after the paths given were checked ----------


def test_docker_unreachable_is_said_in_words(tmp_path):
    sock = f"unix://{tmp_path}/docker.sock"
    r = imgtool("inventory", "--runtime", "docker", docker_host=sock)
    assert (r.returncode, r.stderr.splitlines()) == (5, [
        f"error: cannot reach the Docker daemon at {sock}: the socket does not exist (dockerd is not running)",
        "hint: start it (systemctl start docker), or point DOCKER_HOST at the daemon's socket"])
    r = imgtool("inventory", "--runtime", "docker", docker_host="tcp://127.0.0.1:1")
    assert (r.returncode, r.stderr.splitlines()) == (5, [
        "error: cannot reach the Docker daemon at tcp://127.0.0.1:1: connection refused "
        "(dockerd is not running or not listening there)",
        "hint: start it (systemctl start docker), or point DOCKER_HOST at where it listens"])
    r = imgtool("doctor", "--runtime", "docker", docker_host=sock)
    docker = [line for line in r.stdout.splitlines() if line.startswith("FAIL  docker")]
    assert docker == [f"FAIL  docker       cannot reach the Docker daemon at {sock}: the socket does not exist "
                      "(dockerd is not running)"]


def test_paths_are_checked_before_docker(tmp_path):
    sock = f"unix://{tmp_path}/docker.sock"  # no daemon: a Docker error here would mean it was asked first
    empty = tmp_path / "notabundle"
    empty.mkdir()
    r = imgtool("load", f"{empty}/", docker_host=sock)
    assert (r.returncode, r.stderr.splitlines()) == (3, [
        f"error: incomplete bundle: {empty} has no bundle.json (what made it did not finish, or bundle.json was not "
        "copied)",
        "hint: copy bundle.json from the source medium, or make the bundle again as it was made (imgtool fetch, export "
        "or copy)"])
    r = imgtool("load", str(tmp_path / "nowhere"), docker_host=sock)
    assert (r.returncode, r.stderr.splitlines()[0]) == (2, f"error: no such bundle directory: {tmp_path / 'nowhere'}")
    r = imgtool("inventory", "-o", str(tmp_path / "no" / "inv.json"), docker_host=sock)
    assert (r.returncode, r.stderr.splitlines()) == (2, [
        f"error: cannot write the inventory {tmp_path / 'no' / 'inv.json'}: no such directory {tmp_path / 'no'}"])
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "x").write_text("x")
    r = imgtool("export", "x:1", "-o", str(taken), docker_host=sock)  # cli opens Docker after check_options
    assert (r.returncode, r.stderr.splitlines()[0]) == (2, f"error: output directory {taken} already exists and is not empty")
    r = imgtool("export", "x:1", "-o", str(tmp_path / "out"), docker_host=sock)
    assert (r.returncode, r.stderr.splitlines()[0]) == (
        5, f"error: cannot reach the Docker daemon at {sock}: the socket does not exist (dockerd is not running)")
    assert not (tmp_path / "out").exists()


# --- the connected side without a network ------------------------------------------------

def _dead_mirrors(tmp_path):
    """mirrors.toml whose three sources are closed loopback ports (no network at all)."""
    cfg = tmp_path / "mirrors.toml"
    cfg.write_text('default_image = "quay.io/ascend/vllm-ascend"\n' + "".join(
        f'[[mirrors]]\nname = "{name}"\nregistry = "quay.io"\nurl = "http://127.0.0.1:{port}"\ninsecure = true\n'
        + ("upstream = true\n" if name == "quay" else "")
        for name, port in (("quay", 1), ("daocloud", 2), ("nju", 3))))
    return cfg


# imgtool run with every socket connection it attempts written to a file (an audit hook: Python 3.8+)
COUNT_CONNECTS = """
import sys
log = open(sys.argv[1], "w")
def hook(event, args):
    if event == "socket.connect" and isinstance(args[1], tuple):
        log.write("%s:%s\\n" % args[1][:2])
        log.flush()
sys.addaudithook(hook)
from imgtool.cli import main
main(sys.argv[2:])
"""


def test_tags_without_network_fails_as_fast_as_fetch_with_a_hint(tmp_path):
    cfg = _dead_mirrors(tmp_path)
    connects = tmp_path / "connects"
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    r = subprocess.run([sys.executable, "-c", COUNT_CONNECTS, str(connects), "tags", "--mirrors-file", str(cfg), "-q"],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 4
    assert r.stderr.splitlines() == [
        "error: no source lists the tags of quay.io/ascend/vllm-ascend: "
        "quay (127.0.0.1:1/ascend/vllm-ascend): 127.0.0.1:1: connection refused; "
        "daocloud (127.0.0.1:2/ascend/vllm-ascend): 127.0.0.1:2: connection refused; "
        "nju (127.0.0.1:3/ascend/vllm-ascend): 127.0.0.1:3: connection refused",
        "hint: check the network or proxy (HTTPS_PROXY), or the URLs in mirrors.toml (imgtool mirrors)",
    ]
    # one connection attempt per source; before, each source was retried with backoff in turn
    # (at least 3 x 1.75 s of sleeping alone): counted, not timed
    assert sorted(connects.read_text().splitlines()) == ["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"]


@pytest.mark.parametrize("verb", [["fetch", "v1", "--mirror", "nowhere"], ["inspect", "v1", "--mirror", "nowhere"],
                                  ["lock", "-f", "{tmp}/absent.toml"]])
def test_bad_input_leaves_no_cache_behind(tmp_path, verb):
    # the store is built by cli.py up front; its directories are made only once the input is checked
    cache = tmp_path / "cache"
    r = imgtool(*[a.format(tmp=tmp_path) for a in verb], "--mirrors-file", str(_dead_mirrors(tmp_path)),
                env={"IMGTOOL_CACHE": str(cache)})
    assert r.returncode == 2, r.stderr
    assert not cache.exists()


def test_mirrors_with_every_source_unreachable_is_exit_4(tmp_path):
    cfg = _dead_mirrors(tmp_path)
    r = imgtool("mirrors", "--mirrors-file", str(cfg))
    assert r.returncode == 4
    assert r.stdout.splitlines()[1] == "probed: /v2/ only (no source lists the tags)"
    assert [line.split()[2] for line in r.stdout.splitlines()[3:]] == ["unreachable"] * 3
    assert r.stderr.splitlines() == [
        "error: no source is reachable: quay: 127.0.0.1:1: connection refused; "
        "daocloud: 127.0.0.1:2: connection refused; nju: 127.0.0.1:3: connection refused",
        f"hint: check the network or proxy (HTTPS_PROXY), or the URLs in {cfg}",
    ]
    r = imgtool("mirrors", "v0.22.1rc1", "--mirrors-file", str(cfg), "--json")
    assert r.returncode == 4 and [s["reachable"] for s in json.loads(r.stdout)["sources"]] == [False] * 3


def test_mirrors_without_ref_probes_the_newest_release(services, factory, mirrored, tmp_path):
    """vllm-ascend publishes no `latest`: probing it made every healthy mirror look broken."""
    idx = factory.multiarch(layers=1)
    ms = mirrored(idx, tag="v0.22.1rc1", targets=("upstream", "nju"))
    for tag in ("v0.9.1", "v0.22.1rc1-a3", "main"):
        push_image(services.plain, ms.repo, tag, idx)
    cfg = tmp_path / "mirrors.toml"
    cfg.write_text(f'default_image = "quay.io/{ms.repo}"\n'
                   f'[[mirrors]]\nname = "quay"\nregistry = "quay.io"\nurl = "http://{services.plain}"\n'
                   'insecure = true\nupstream = true\n'
                   f'[[mirrors]]\nname = "nju"\nregistry = "quay.io"\nurl = "http://{services.mirror}"\ninsecure = true\n')
    r = imgtool("mirrors", "--mirrors-file", str(cfg))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[1] == f"probed: quay.io/{ms.repo}:v0.22.1rc1 (the newest release quay lists)"
    assert [(line.split()[0], line.split()[2]) for line in lines[3:]] == [("quay", "ok"), ("nju", "ok")]
    # a tag nobody serves: the table says so per source, and the exit code too
    r = imgtool("mirrors", "v9.9.9", "--mirrors-file", str(cfg))
    assert r.returncode == 4
    assert r.stderr.splitlines() == [
        f"error: no source serves quay.io/{ms.repo}:v9.9.9: quay: v9.9.9 not found; nju: v9.9.9 not found",
        "hint: check the tag: imgtool tags lists them"]


# --- parts that fit the carrier ------------------------------------------------------------------


@pytest.mark.parametrize("text, size, warns", [
    ("fat32", 4 * 1024 ** 3 - 1, False), ("FAT32", 4 * 1024 ** 3 - 1, False),
    ("dvd", 4_691_984_384, False), ("dvd-dl", 8_535_277_568, False),
    ("bd25", 25_016_926_208, False), ("bd50", 50_042_241_024, False),
    # units are binary whatever their spelling: documented in README and --help
    ("4G", 4 * 1024 ** 3, True), ("4GB", 4 * 1024 ** 3, True), ("4GiB", 4 * 1024 ** 3, True),
    ("4095M", 4095 * 1024 ** 2, False), ("700MB", 700 * 1024 ** 2, False),
])
def test_chunk_size_takes_carrier_names_and_binary_units(text, size, warns):
    from imgtool.config import chunk_size_warning, parse_chunk_size

    assert parse_chunk_size(text) == size
    assert (chunk_size_warning(size) is not None) == warns


def test_the_part_size_floor_is_a_parameter_not_an_environment_variable():
    from imgtool.config import MIN_CHUNK_SIZE, parse_chunk_size
    from imgtool.errors import UsageError

    assert parse_chunk_size("64K", floor=64 * 1024) == 64 * 1024
    with pytest.raises(UsageError) as e:
        parse_chunk_size("63K", floor=64 * 1024)
    assert e.value.message == ("invalid --chunk-size '63K': parts must be at least 64 KiB "
                               "(63 KiB parts would cut a 15 GiB image into 249,661 files)")
    assert MIN_CHUNK_SIZE == 1024 ** 2  # what every verb and spec file gets


def test_fetch_help_says_each_carrier_in_bytes():
    r = imgtool("fetch", "--help")
    text = " ".join(r.stdout.split())
    for words in ("fat32 = 4,294,967,295 bytes", "dvd = 4,691,984,384 bytes", "dvd-dl = 8,535,277,568 bytes",
                  "bd25 = 25,016,926,208 bytes", "bd50 = 50,042,241,024 bytes", "4G = 4 GiB, 700MB = 700 MiB"):
        assert words in text, text


def test_fetch_help_says_a_model_hub_endpoint_gets_more_connections_than_a_registry():
    # a hub's CDN serves a model's few big files to many ranged readers: 24 each; a registry keeps 12, so image pulls
    # do not change (docs/benchmarks.md "Models (issue 48)")
    r = imgtool("fetch", "--help")
    text = " ".join(r.stdout.split())
    assert ("--connections N Connections to each source (a registry and its mirrors are each a source, as is each "
            "model hub endpoint). [default: 12 to a registry, 24 to a model hub endpoint]") in text, text
    # and two endpoints' 24 at once: at 32 the download alone was 8.4 s of the 9.1 s that 6x the client allows
    # (docs/benchmarks.md "Two sources, measured")
    assert ("--max-connections N Connections at once over every source. [default: 32 over the registries, 48 over a "
            "model's hub endpoints]") in text, text


def test_4g_parts_are_one_byte_too_many_for_fat32_and_fetch_says_so(services, factory, mirrored, tmp_path):
    from tests.support.bundles import fetch_from_registry

    out, _, _, r = fetch_from_registry(services, factory, mirrored, tmp_path, "--chunk-size", "4G")
    assert ("warning: parts of 4,294,967,296 bytes (4 GiB) do not fit on FAT32, which holds files up to "
            "4,294,967,295 bytes: for FAT32 USB sticks use --chunk-size fat32") in r.stderr.splitlines()
    assert (out / "bundle.json").exists()


def test_fat32_parts_fit_and_readme_says_so(services, factory, mirrored, tmp_path):
    from tests.support.bundles import fetch_from_registry

    out, _, _, r = fetch_from_registry(services, factory, mirrored, tmp_path, "--chunk-size", "fat32")
    assert "warning" not in r.stderr
    doc = json.loads((out / "bundle.json").read_text())
    largest = max(p["size"] for p in doc["parts"])
    readme = (out / "README.txt").read_text()
    assert f"The largest part is {largest:,} bytes: it fits a USB stick formatted\n  FAT32" in readme
    assert f"最大的分卷为 {largest:,} 字节，可以放进 FAT32 格式的 U 盘" in readme


def test_one_run_of_the_cli_leaves_nothing_to_the_next(tmp_path, capsys):
    # what a run learns while parsing (--json, --debug, -q, the verb) belongs to that run: main() called
    # again in the same process (a test, an embedding tool) starts afresh
    from imgtool.cli import main

    nowhere = str(tmp_path / "nowhere")
    with pytest.raises(SystemExit) as e:
        main(["presets", "--json"])
    assert e.value.code == 0 and json.loads(capsys.readouterr().out)
    with pytest.raises(SystemExit) as e:
        main(["verify", nowhere, "--json", "--debug"])
    out, err = capsys.readouterr()
    assert e.value.code == 2 and json.loads(out)["error"] == f"no such bundle directory: {nowhere}"  # its own document
    assert "Traceback" in err
    with pytest.raises(SystemExit) as e:
        main(["verify", nowhere])
    out, err = capsys.readouterr()
    assert (e.value.code, out, err) == (2, "", f"error: no such bundle directory: {nowhere}\n")


# --- issue 35, case 6: a registry's strings reach the terminal as one escaped line each ---------------------

FORGED = "\x1b[2J\x1b]0;owned\x07\nerror: forged line\r"


@pytest.fixture
def lying_registry(services, factory, mirrored, tmp_path):
    """A quay.io whose answers a FaultProxy rewrites, and a mirrors.toml naming only it."""
    from tests.support.proxy import FaultProxy

    ms = mirrored(factory.image("amd64", layers=1), tag="v0.9.1", targets=("upstream",))
    proxy = FaultProxy(services.plain)
    cfg = tmp_path / "mirrors.toml"
    cfg.write_text(f'default_image = "quay.io/{ms.repo}"\n[[mirrors]]\nname = "quay"\nregistry = "quay.io"\n'
                   f'url = "{proxy.url}"\nupstream = true\ninsecure = true\n')
    yield proxy, cfg, ms
    proxy.close()


def test_tags_a_registry_lists_that_are_not_tags_are_left_out(lying_registry):
    from tests.support.proxy import Fault

    proxy, cfg, ms = lying_registry
    listed = ["v0.9.1", f"v0.9.2{FORGED}", "\x1b]0;owned\x07", "v0.9.0"]
    proxy.add(Fault("status", lambda m, p: "/tags/list" in p, status=200, times=10,
                    body=json.dumps({"name": ms.repo, "tags": listed}).encode()))
    r = imgtool("tags", "--mirrors-file", str(cfg))
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["TAG     RELEASE  HARDWARE  OS", "v0.9.1  v0.9.1   a2        ubuntu",
                                     "v0.9.0  v0.9.0   a2        ubuntu"]
    assert r.stderr.splitlines() == ["quay: 2 listed name(s) are not tags (the distribution spec's grammar); left out"]


def test_a_registry_error_message_is_one_escaped_line(lying_registry):
    from tests.support.proxy import Fault

    proxy, cfg, ms = lying_registry
    body = json.dumps({"errors": [{"code": "DENIED", "message": FORGED}]}).encode()
    proxy.add(Fault("status", lambda m, p: "/tags/list" in p, status=400, times=10, body=body))
    r = imgtool("tags", "--mirrors-file", str(cfg), "-q")
    assert r.returncode == 4
    said = f"{proxy.hostport}/{ms.repo}: tag list: DENIED: \\x1b[2J\\x1b]0;owned\\x07\\nerror: forged line\\r"
    assert r.stderr.splitlines() == [
        f"error: no source lists the tags of quay.io/{ms.repo}: quay ({proxy.hostport}/{ms.repo}): {said}",
        "hint: force a source that lists tags with --mirror NAME"]


def test_inspect_refuses_an_index_whose_variant_is_an_escape_sequence(services, factory, mirrored, tmp_path):
    arm = factory.image("arm64", layers=1, variant="v8\x1b[2J\nlinux/amd64  1 MiB  1  sha256:forged")
    ms = mirrored(factory.index([arm, factory.image("amd64", layers=1)]), tag="v1", targets=("upstream",))
    r = imgtool("inspect", "v1", "--mirrors-file", str(_plain_mirrors(tmp_path, services, ms)))
    assert r.returncode == 1, r.stderr  # inspect's one error for "no source could be inspected"
    assert r.stdout == ""
    assert [line for line in r.stderr.splitlines() if line.startswith(("error:", "hint:"))] == [
        f"error: cannot inspect: quay ({services.plain}/{ms.repo}): malformed index entry's platform: `variant` is "
        "not a platform token: 'v8\\x1b[2J\\nlinux/amd64  1 MiB  1  sha256:forged'"]


def _plain_mirrors(tmp_path, services, ms):
    cfg = tmp_path / "mirrors.toml"
    cfg.write_text(f'default_image = "quay.io/{ms.repo}"\n[[mirrors]]\nname = "quay"\nregistry = "quay.io"\n'
                   f'url = "http://{services.plain}"\nupstream = true\ninsecure = true\n')
    return cfg


def test_inventory_json_says_where_the_inventory_went(services, tmp_path):
    inv = tmp_path / "inv.json"
    r = imgtool("inventory", "--runtime", "docker", "-o", str(inv), "--json", docker_host=services.docker_host)
    assert (r.returncode, r.stderr) == (0, "")
    written = json.loads(inv.read_text())
    doc = json.loads(r.stdout)
    assert doc == {"path": str(inv), "images": len(written["images"]),
                   "layers": len({d for im in written["images"] for d in im["diff_ids"]}),
                   "models": len(written["models"])}
    r = imgtool("inventory", "--runtime", "docker", "--json", docker_host=services.docker_host)  # to stdout: the inventory
    assert r.returncode == 0 and json.loads(r.stdout)["images"] == written["images"]
