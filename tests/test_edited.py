"""Every verb that reads a bundle refuses one whose bundle.json was edited (issue 46): the image's ref changed to
nginx:latest, SHA256SUMS left as the fetch wrote it. `verify` refuses it (exit 3); so must verify's every sibling:
load, copy, push, serve, self-update, diff and a delta's base (fetch --base), each with exit 3, its own words and
nothing written, loaded, pushed or served. Where bundle.json and SHA256SUMS were both edited, only `--expect` or a
signature can tell: copy and push honour both, as load does.

Bundles are written from seeded images (tests/support/bundles.py); keys are made by the real ssh-keygen; push goes
to the real plain registry through a FaultProxy that counts every request; load goes to the first test dockerd;
self-update runs from an imgtool installed from imgtool.pyz on Kylin's Python 3.7.
"""

import hashlib
import subprocess
from pathlib import Path

import pytest

from tests.support.bundles import BlobDir, imgtool, write
from tests.support.images import host_arch
from tests.support.proxy import FaultProxy

REPO = "quay.io/ascend/vllm-ascend"
EDITED_SUMS = ("  - bundle.json does not match SHA256SUMS: it was changed after the fetch; copy bundle.json and "
               "SHA256SUMS again from the source medium")


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def errors(r) -> list:
    return [line for line in r.stderr.splitlines() if line.startswith(("error:", "hint:", "  - "))]


def edit_ref(bundle: Path, sums_too: bool = False) -> None:
    """bundle.json's image renamed nginx:latest, as an attacker with write access to the medium would; with
    `sums_too`, SHA256SUMS made to match it (then only --expect or a signature tells)."""
    path = bundle / "bundle.json"
    text = path.read_text()
    assert text.count(f'"ref": "{REPO}:v1"') == 1
    path.write_text(text.replace(f'"ref": "{REPO}:v1"', '"ref": "docker.io/library/nginx:latest"'))
    if sums_too:
        lines = (bundle / "SHA256SUMS").read_text().splitlines()
        lines = [f"{sha256(path)}  bundle.json" if line.endswith("  bundle.json") else line for line in lines]
        (bundle / "SHA256SUMS").write_text("\n".join(lines) + "\n")


@pytest.fixture
def env(tmp_path):
    """No site policy but what a test names: HOME is the test's, $IMGTOOL_SIGNERS empty."""
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    return {"HOME": str(home), "IMGTOOL_SIGNERS": ""}


@pytest.fixture
def made(factory, tmp_path):
    """A 3-part bundle of a host-arch REPO:v1 as the fetch wrote it; returns (dir, the image, bundle.json's sha256)."""
    store = BlobDir(tmp_path / "blobs")
    image = factory.image(host_arch(), layers=2)
    out = tmp_path / "bundle"
    write(out, [store.pulled(image, f"{REPO}:v1")], store, chunk_size=700 * 1024)
    return out, image, sha256(out / "bundle.json")


@pytest.fixture
def edited(made):
    out, image, original = made
    edit_ref(out)
    return out, image, original


def refused_whole(r, head: str) -> None:
    """A verb that reads the parts: exit 3, its refusal, bundle.json named first; the full check that follows a
    refusal (as load's) also names the archive's manifest.json and index.json, which bundle.json no longer implies."""
    assert r.returncode == 3, r.stderr
    said = errors(r)
    assert said[:2] == [head, EDITED_SUMS], said
    assert [line.split(" is ")[0] for line in said[2:]] == ["  - archive member 'index.json'",
                                                            "  - archive member 'manifest.json'"], said


def test_verify_refuses_it(edited, env):
    out, _, _ = edited
    refused_whole(imgtool("verify", str(out), env=env), f"error: bundle failed verification: {out}: 3 problems")


def test_load_refuses_it_and_docker_gains_no_image(edited, env, services, docker_cli):
    out, _, _ = edited
    before = docker_cli.image_ids()
    r = imgtool("load", str(out), docker_host=services.docker_host, env=env)
    refused_whole(r, f"error: refusing to load: {out}: 3 problems; nothing was loaded")
    assert docker_cli.image_ids() == before


def test_copy_refuses_it_and_writes_nothing(edited, env, tmp_path):
    out, _, _ = edited
    dst = tmp_path / "copied"
    r = imgtool("copy", f"bundle:{out}", f"bundle:{dst}", "--chunk-size", "100M", env=env)
    refused_whole(r, f"error: refusing to copy: {out}: 3 problems; nothing was written")
    assert not dst.exists()


def test_push_refuses_it_and_the_registry_is_not_asked(edited, env, services, uniq):
    out, _, _ = edited
    proxy = FaultProxy(services.plain)
    try:
        r = imgtool("push", str(out), "--to", f"{proxy.hostport}/{uniq}", "--insecure", env=env)
        refused_whole(r, f"error: refusing to push: {out}: 3 problems; nothing was pushed")
        assert proxy.records == []  # not even a ping
    finally:
        proxy.close()


def test_serve_refuses_to_start(edited, env):
    out, _, _ = edited
    r = imgtool("serve", str(out), "--listen", "127.0.0.1:0", env=env, timeout=120)
    assert r.returncode == 3, r.stderr
    assert errors(r) == [f"error: refusing to serve: {out}: 1 problem; nothing is served", EDITED_SUMS]
    assert r.stdout == ""


@pytest.mark.parametrize("given", ["DIR", "DIR/bundle.json"])
def test_diff_refuses_it(given, made, env, tmp_path):
    out, _, _ = made
    other = tmp_path / "other"
    subprocess.run(["cp", "-a", str(out), str(other)], check=True, timeout=60)
    edit_ref(out)
    path = str(out) if given == "DIR" else str(out / "bundle.json")
    for args in ((path, str(other)), (str(other), path)):
        r = imgtool("diff", *args, env=env)
        assert r.returncode == 3, r.stderr
        assert errors(r) == [f"error: refusing to compare: {out}: 1 problem", EDITED_SUMS]
        assert r.stdout == ""
    assert imgtool("diff", str(other), str(other), env=env).returncode == 0


def test_a_delta_base_is_refused_before_anything_is_written(edited, env, tmp_path):
    out, _, _ = edited
    new = tmp_path / "delta"
    cache = tmp_path / "cache"
    r = imgtool("fetch", "v2", "--base", str(out), "-o", str(new), env=dict(env, IMGTOOL_CACHE=str(cache)))
    assert r.returncode == 3, r.stderr
    assert errors(r) == [f"error: refusing to use the base bundle: {out}: 1 problem; nothing was written",
                         EDITED_SUMS]
    assert not new.exists() and not cache.exists()


def test_self_update_refuses_it(factory, tmp_path, env):
    from imgtool.bundle.writer import write_bundle
    from imgtool.progress import Progress
    from imgtool.store import FileBlobs
    from tests.test_install import clean_env, install, run

    pyz = tmp_path / "imgtool.pyz"
    assert imgtool("self-bundle", "-o", str(pyz), "-q").returncode == 0
    prefix, home = tmp_path / "prefix", tmp_path / "installed-home"
    home.mkdir()
    assert install(pyz, prefix, home).returncode == 0
    installed = prefix / "lib/imgtool/imgtool.pyz"
    before = installed.read_bytes()
    store = BlobDir(tmp_path / "blobs")
    out = tmp_path / "bundle"
    write_bundle(out, [store.pulled(factory.image(host_arch(), layers=1), f"{REPO}:v1")], FileBlobs(store.path),
                 chunk_size=None, compress="none", force=False, progress=Progress(), extra_files={"imgtool.pyz": pyz})
    original = sha256(out / "bundle.json")
    edit_ref(out)
    edited_sha = sha256(out / "bundle.json")
    for args, line in (
            (("--expect", original), f"error: refusing to update imgtool from {out}: bundle.json does not match "
                                     f"--expect (its sha256 is {edited_sha}); nothing was updated"),
            ((), f"error: refusing to update imgtool from {out}: nothing vouches for its bundle.json (not signed); "
                 "nothing was updated")):
        r = run([str(prefix / "bin/imgtool"), "self-update", str(out), *args], cwd=tmp_path, env=clean_env(home))
        assert r.returncode == 3, r.stderr
        assert errors(r)[0] == line
    assert installed.read_bytes() == before


# --- bundle.json and SHA256SUMS both edited: only --expect or a signature tells ----------------------------------

class Keys:
    def __init__(self, root: Path):
        root.mkdir(parents=True, exist_ok=True)
        self.key = root / "release"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "release", "-f", str(self.key)],
                       check=True, timeout=60)
        self.policy = root / "allowed_signers"
        pub = (root / "release.pub").read_text().split()
        self.policy.write_text(f"release@example.com {pub[0]} {pub[1]}\n")


def test_copy_and_push_honour_expect_and_the_signature_policy(made, env, tmp_path, services, uniq):
    out, _, original = made
    keys = Keys(tmp_path / "keys")
    unsigned = tmp_path / "unsigned"
    subprocess.run(["cp", "-a", str(out), str(unsigned)], check=True, timeout=60)
    r = imgtool("sign", str(out), "--sign-key", str(keys.key), env=env)
    assert r.returncode == 0, r.stderr
    for bundle in (out, unsigned):
        edit_ref(bundle, sums_too=True)
        assert imgtool("verify", str(bundle), "--quick", env=env).returncode == (3 if bundle == out else 0)
    dst = tmp_path / "copied"
    proxy = FaultProxy(services.plain)
    try:
        for verb, args, tail in (("copy", ("copy", f"bundle:{unsigned}", f"bundle:{dst}"), "nothing was written"),
                                 ("push", ("push", str(unsigned), "--to", f"{proxy.hostport}/{uniq}", "--insecure"),
                                  "nothing was pushed")):
            r = imgtool(*args, "--expect", original, env=env)
            assert r.returncode == 3, r.stderr
            assert errors(r)[:2] == [
                f"error: refusing to {verb}: {unsigned}: 3 problems; {tail}",
                f"  - bundle.json does not match --expect: its sha256 is {sha256(unsigned / 'bundle.json')[:16]}..., "
                f"expected {original[:16]}...; this is not the published bundle, or bundle.json was changed"]
            r = imgtool(*args, "--signers", str(keys.policy), env=env)
            assert r.returncode == 3, r.stderr
            assert errors(r)[0] == (f"error: refusing to {verb} {unsigned}: not signed (no bundle.json.sig), and "
                                    f"{keys.policy} requires a signature by a key it lists; {tail}")
            # the site's policy, where it is set: /etc/imgtool/allowed_signers or, as here, $IMGTOOL_SIGNERS
            r = imgtool(*(a.replace(str(unsigned), str(out)) for a in args), env=dict(env, IMGTOOL_SIGNERS=str(keys.policy)))
            assert r.returncode == 3, r.stderr
            assert errors(r)[0].startswith(f"error: refusing to {verb} {out}: bad signature: bundle.json.sig (by "), \
                errors(r)
            assert errors(r)[0].endswith(": bundle.json was changed after it was signed, or the signature is another "
                                         f"bundle's; {tail}")
        assert proxy.records == []
    finally:
        proxy.close()
    assert not dst.exists()
