"""Inputs that used to hang or crash a command (issue 24): each one is refused with one line and
exit 3, by imgtool and by imgtool.pyz on Kylin's Python 3.7, within a timeout that fails the test.

A hang here shows up as subprocess.TimeoutExpired: the test fails, it never waits forever.
"""

import json
import os
from pathlib import Path

import pytest

from tests.support.bundles import BlobDir, fetch_from_registry, imgtool, write
from tests.support.images import host_arch

REPO = "quay.io/ascend/vllm-ascend"
HANG = 60  # seconds: a command that needs longer on these inputs is hanging


@pytest.fixture
def bundle(factory, tmp_path):
    """A bundle in several parts of a host-arch image (no imgtool.pyz: imgtool's own checks)."""
    store = BlobDir(tmp_path / "blobs")
    image = factory.image(host_arch(), layers=2)
    out = tmp_path / "bundle"
    write(out, [store.pulled(image, f"{REPO}:hostile")], store, chunk_size=512 * 1024)
    return out


def fifo_in_place_of(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


def run(*args, docker_host=None):
    return imgtool(*args, env={"HOME": "/nonexistent", "IMGTOOL_SIGNERS": ""}, docker_host=docker_host,
                   timeout=HANG)


def errors(r):
    return [line for line in r.stderr.splitlines() if line.startswith(("error:", "hint:", "  - "))]


@pytest.mark.parametrize("verb", ["verify", "load", "diff", "sign"])
def test_a_fifo_as_bundle_json_is_refused_without_waiting(verb, bundle, services, tmp_path):
    fifo_in_place_of(bundle / "bundle.json")
    args = {"verify": ("verify", str(bundle)), "load": ("load", str(bundle)),
            "diff": ("diff", str(bundle), str(bundle)),
            "sign": ("sign", str(bundle), "--key", str(tmp_path / "no-key"))}[verb]
    r = run(*args, docker_host=services.docker_host)
    assert r.returncode == 3, r.stderr
    assert errors(r) == ["error: bundle.json is not a regular file (a FIFO)",
                         "hint: copy bundle.json from the source medium"]


def test_a_fifo_as_the_signature_is_refused_without_waiting(bundle, services):
    os.mkfifo(bundle / "bundle.json.sig")
    for verb in ("verify", "load"):
        r = run(verb, str(bundle), docker_host=services.docker_host)
        assert r.returncode == 3, r.stderr
        head = f"refusing to load {bundle}" if verb == "load" else f"bundle failed verification: {bundle}"
        tail = "; nothing was loaded" if verb == "load" else ""
        assert errors(r)[0] == (f"error: {head}: bundle.json.sig is not an SSH signature "
                                f"(it is a FIFO, not a regular file){tail}")


@pytest.mark.parametrize("kind", ["a FIFO", "a directory", "a device"])
def test_a_part_that_is_not_a_regular_file_is_named_as_such(kind, bundle, services, docker_cli):
    part = json.loads((bundle / "bundle.json").read_text())["parts"][1]["name"]
    (bundle / part).unlink()
    if kind == "a FIFO":
        os.mkfifo(bundle / part)
    elif kind == "a directory":
        (bundle / part).mkdir()
    else:
        os.symlink("/dev/zero", bundle / part)  # what `sha256sum` would read forever
    before = docker_cli.image_ids()
    for verb in ("verify", "load"):
        r = run(verb, str(bundle), docker_host=services.docker_host)
        assert r.returncode == 3, r.stderr
        assert f"  - part 002 ({part}) is not a regular file ({kind}); re-copy part 002 from the source " \
               "medium" in r.stderr.splitlines(), r.stderr
        assert "truncated" not in r.stderr
    assert docker_cli.image_ids() == before


def test_the_pyz_on_kylins_python_refuses_fifos_too(services, factory, mirrored, tmp_path):
    from tests.test_selfbundle import old_python, run_clean

    python = old_python("3.7")
    out, _, _, _ = fetch_from_registry(services, factory, mirrored, tmp_path)
    raw = (out / "bundle.json").read_bytes()
    fifo_in_place_of(out / "bundle.json")
    for verb in ("verify", "load"):
        r = run_clean(python, "imgtool.pyz", verb, ".", cwd=out, docker_host=services.docker_host)
        assert r.returncode == 3, r.stderr
        assert errors(r)[0] == "error: bundle.json is not a regular file (a FIFO)"
    (out / "bundle.json").unlink()
    (out / "bundle.json").write_bytes(raw)
    os.mkfifo(out / "bundle.json.sig")
    r = run_clean(python, "imgtool.pyz", "verify", ".", cwd=out)
    assert r.returncode == 3, r.stderr
    assert errors(r)[0] == "error: bundle failed verification: .: bundle.json.sig is not an SSH signature " \
                           "(it is a FIFO, not a regular file)"


NESTED = b"[" * 200_000


@pytest.mark.parametrize("verb", ["verify", "load", "diff"])
def test_deeply_nested_bundle_json_is_malformed_not_an_internal_error(verb, bundle, services):
    (bundle / "bundle.json").write_bytes(NESTED)
    args = (verb, str(bundle)) + ((str(bundle),) if verb == "diff" else ())
    r = run(*args, docker_host=services.docker_host)
    assert r.returncode == 3, r.stderr
    assert errors(r) == ["error: bundle.json is malformed: not valid JSON (nested too deeply)",
                         "hint: copy bundle.json again from the source medium, or fetch the bundle again"]
    if verb != "diff":
        r = run(*args, "--json", docker_host=services.docker_host)
        assert r.returncode == 3
        assert json.loads(r.stdout) == {
            "ok": False, "exit_code": 3, "error": "bundle.json is malformed: not valid JSON (nested too deeply)",
            "hint": "copy bundle.json again from the source medium, or fetch the bundle again", "problems": []}


def test_a_deeply_nested_inventory_is_not_an_inventory(tmp_path):
    inv = tmp_path / "inv.json"
    inv.write_bytes(b'{"a":' * 100_000)
    r = run("fetch", "v1", "--have", str(inv), "-o", str(tmp_path / "out"))
    assert r.returncode == 2, r.stderr
    assert errors(r)[0] == f"error: {inv} is not an imgtool inventory: not valid JSON (nested too deeply)"


def test_every_verb_with_json_prints_json_on_failure_too(bundle):
    from imgtool.cli import cli

    verbs = sorted(name for name, cmd in cli.commands.items() if any(p.name == "as_json" for p in cmd.params))
    assert len(verbs) >= 15, verbs
    for verb in verbs:
        r = run(verb, "--json", "--no-such-option")
        assert r.returncode == 2, (verb, r.stderr)
        doc = json.loads(r.stdout)
        assert doc["ok"] is False and doc["exit_code"] == 2, (verb, doc)
        assert doc["error"] == "no such option: --no-such-option", (verb, doc)
    # a verb's own failed report is the one document (verify prints its report, ok false)
    part = json.loads((bundle / "bundle.json").read_text())["parts"][0]["name"]
    (bundle / part).write_bytes(b"damaged")
    r = run("verify", str(bundle), "--json")
    assert r.returncode == 3
    assert json.loads(r.stdout)["ok"] is False


def test_the_pyz_on_kylins_python_says_malformed_too(services, factory, mirrored, tmp_path):
    from tests.test_selfbundle import old_python, run_clean

    out, _, _, _ = fetch_from_registry(services, factory, mirrored, tmp_path)
    (out / "bundle.json").write_bytes(NESTED)
    r = run_clean(old_python("3.7"), "imgtool.pyz", "verify", ".", "--json", cwd=out)
    assert r.returncode == 3, r.stderr
    assert json.loads(r.stdout)["error"] == "bundle.json is malformed: not valid JSON (nested too deeply)"


def test_the_pyz_loading_a_zstd_bundle_without_zstandard_ends(services, factory, mirrored, tmp_path, docker_cli):
    """The set-up path: the parts stream and its hashing workers are started, then the decompressor
    cannot be made (the pyz never carries zstandard). The error, then the process ends."""
    import subprocess

    from tests.test_selfbundle import old_python

    out, _, _, _ = fetch_from_registry(services, factory, mirrored, tmp_path, "--compress", "zstd")
    before = docker_cli.image_ids()
    env = ["env", "-i", "PATH=/usr/sbin:/usr/bin:/sbin:/bin", f"HOME={out}", "LANG=C.UTF-8",
           "IMGTOOL_CACHE=/nonexistent/imgtool-cache", f"DOCKER_HOST={services.docker_host}"]
    r = subprocess.run([*env, *old_python("3.7"), "imgtool.pyz", "load", "."], cwd=out, capture_output=True,
                       text=True, timeout=HANG)
    assert r.returncode == 3, r.stderr
    assert errors(r) == [
        "error: this bundle is zstd-compressed and the zstandard Python package is missing",
        "hint: install it (pip install zstandard, or the system's python3-zstandard package), "
        "or run `sh load.sh` on a host with the zstd command"]
    assert docker_cli.image_ids() == before
