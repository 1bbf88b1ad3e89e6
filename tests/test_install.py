"""A trusted imgtool on the offline host (issue 24 item 1): `self-install`, `self-update`, and the
README's offline procedure against every edit of a bundle the issue tried.

The installed copy runs on Kylin's Python 3.7 (pyenv's, under `env -i`), as on a Kylin V10 host.
"""

import hashlib
import io
import json
import os
import re
import subprocess
import zipfile
from pathlib import Path

import pytest

from imgtool import __version__
from tests.support.bundles import fetch_from_registry, imgtool, parts_of
from tests.support.images import host_arch
from tests.test_selfbundle import old_python

HANG = 120


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def clean_env(home: Path, docker_host=None, **extra):
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": str(home), "LANG": "C.UTF-8",
           "IMGTOOL_CACHE": "/nonexistent/imgtool-cache"}
    if docker_host:
        env["DOCKER_HOST"] = docker_host
    env.update(extra)
    return env


def run(cmd, *, cwd, env):
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=HANG)


def err_lines(r):
    return [line for line in r.stderr.splitlines() if line.startswith(("error:", "hint:", "  - "))]


@pytest.fixture
def fetched(services, factory, mirrored, tmp_path):
    out, image, ref, r = fetch_from_registry(services, factory, mirrored, tmp_path)
    return out, image, ref, r


def install(pyz: Path, prefix: Path, home: Path):
    return run([*old_python("3.7"), str(pyz), "self-install", "--prefix", str(prefix)], cwd=pyz.parent,
               env=clean_env(home))


def test_self_install_puts_the_checked_pyz_and_a_launcher_in_place(fetched, tmp_path):
    out, _, _, fetch = fetched
    pyz = out / "imgtool.pyz"
    published = sha256(pyz)
    assert f"imgtool.pyz sha256: {published}   (publish both out of band: a host checks the tool with sha256sum " \
           "before it installs it)" in fetch.stdout.splitlines()
    # the first contact, as README.txt says it: the host's own sha256sum against the published value
    assert subprocess.run(["sha256sum", str(pyz)], capture_output=True, text=True,
                          check=True).stdout.split()[0] == published
    prefix, home = tmp_path / "prefix", tmp_path / "home"
    home.mkdir()
    python = old_python("3.7")[0]
    for _ in range(2):  # again: the same result, nothing else
        r = install(pyz, prefix, home)
        assert r.returncode == 0, r.stderr
        lines = r.stdout.splitlines()
        assert lines[0].startswith("installed imgtool ") and lines[0].endswith(
            f": {prefix}/bin/imgtool runs {prefix}/lib/imgtool/imgtool.pyz with {python}")
        assert lines[1] == f"imgtool.pyz sha256: {published}"
        assert f"warning: {prefix}/bin is not first on PATH here: run {prefix}/bin/imgtool" in r.stderr
    assert sorted(str(p.relative_to(prefix)) for p in prefix.rglob("*") if p.is_file()) == [
        "bin/imgtool", "lib/imgtool/imgtool.pyz"]
    assert sha256(prefix / "lib/imgtool/imgtool.pyz") == published
    assert os.access(prefix / "bin/imgtool", os.X_OK)
    launcher = (prefix / "bin/imgtool").read_text()
    assert launcher.splitlines()[-1] == f"exec {python} -I {prefix}/lib/imgtool/imgtool.pyz \"$@\""
    # the installed copy works with nothing but the host's python3
    ok = run([str(prefix / "bin/imgtool"), "verify", str(out)], cwd=tmp_path, env=clean_env(home))
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.startswith(f"ok: {out}: 1 image(s)")


def test_self_install_runs_only_from_a_pyz(tmp_path):
    r = imgtool("self-install", "--prefix", str(tmp_path / "p"))
    assert r.returncode == 2
    assert err_lines(r) == [
        "error: self-install installs imgtool.pyz, and this imgtool does not run from one",
        "hint: run it from the bundle, after checking the file with sha256sum: python3 DIR/imgtool.pyz self-install"]
    assert not (tmp_path / "p").exists()
    r = imgtool("self-update", str(tmp_path))
    assert r.returncode == 2
    assert err_lines(r)[0].startswith("error: self-update updates an installed imgtool, and this one runs from ")


def test_self_install_refuses_a_python_older_than_3_7(tmp_path):
    pyz = tmp_path / "imgtool.pyz"
    assert imgtool("self-bundle", "-o", str(pyz)).returncode == 0
    prefix, home = tmp_path / "prefix", tmp_path / "home"
    home.mkdir()
    r = run([*old_python("3.6"), str(pyz), "self-install", "--prefix", str(prefix)], cwd=tmp_path,
            env=clean_env(home))
    assert r.returncode == 1
    assert err_lines(r)[0] == "error: imgtool.pyz needs Python 3.7 or newer; this is Python 3.6"
    assert not prefix.exists()


def test_self_update_only_from_a_bundle_the_installed_copy_verified(services, factory, mirrored, tmp_path):
    (tmp_path / "a").mkdir()
    first, _, _, _ = fetch_from_registry(services, factory, mirrored, tmp_path / "a")
    prefix, home = tmp_path / "prefix", tmp_path / "home"
    home.mkdir()
    assert install(first / "imgtool.pyz", prefix, home).returncode == 0
    (tmp_path / "b").mkdir()
    nxt, _, _, _ = fetch_from_registry(services, factory, mirrored, tmp_path / "b")
    installed = prefix / "lib/imgtool/imgtool.pyz"
    before = installed.read_bytes()
    tool = [str(prefix / "bin/imgtool")]
    expect = sha256(nxt / "bundle.json")

    def update(*args):
        return run([*tool, "self-update", str(nxt), *args], cwd=tmp_path, env=clean_env(home))

    # unsigned, no policy, no --expect: nothing vouches for it
    r = update()
    assert r.returncode == 3, r.stderr
    assert err_lines(r)[0] == (f"error: refusing to update imgtool from {nxt}: nothing vouches for its bundle.json "
                               "(not signed); nothing was updated")
    r = update("--expect", "0" * 64)
    assert r.returncode == 3
    assert err_lines(r)[0] == (f"error: refusing to update imgtool from {nxt}: bundle.json does not match --expect "
                               f"(its sha256 is {expect}); nothing was updated")
    # the pyz edited after the bundle was made: the verified bundle.json says otherwise
    pristine = (nxt / "imgtool.pyz").read_bytes()
    (nxt / "imgtool.pyz").write_bytes(pristine + b"\0")
    r = update("--expect", expect)
    assert r.returncode == 3
    assert err_lines(r)[0] == (f"error: refusing to update imgtool from {nxt}: imgtool.pyz does not match the "
                               "verified bundle.json (it was changed after the bundle was made); nothing was updated")
    assert installed.read_bytes() == before
    (nxt / "imgtool.pyz").write_bytes(pristine)
    r = update("--expect", expect)
    assert r.returncode == 0, r.stderr
    assert pristine == before  # the same imgtool: said, nothing replaced (test_self_update_refuses_an_older_imgtool...)
    assert r.stdout.rstrip() == f"imgtool is already {__version__} ({installed}); nothing was updated"
    assert installed.read_bytes() == pristine

    # signed by a key the user's policy lists: no --expect needed
    key = tmp_path / "release"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "release", "-f", str(key)], check=True,
                   timeout=60)
    assert imgtool("sign", str(nxt), "--sign-key", str(key), env={"HOME": str(home), "IMGTOOL_SIGNERS": ""}).returncode == 0
    policy = home / ".config/imgtool/allowed_signers"
    policy.parent.mkdir(parents=True)
    pub = (tmp_path / "release.pub").read_text().split()
    policy.write_text(f"release@example.com {pub[0]} {pub[1]}\n")
    r = update()
    assert r.returncode == 0, r.stderr


def with_version(data: bytes, version: str) -> bytes:
    """imgtool.pyz `data` rebuilt to say (and, run, to be) imgtool `version`: its imgtool-pyz.json and __version__."""
    out = io.BytesIO()
    out.write(data[:data.index(b"\n") + 1])  # the #! line
    with zipfile.ZipFile(io.BytesIO(data)) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for info in src.infolist():
            body = src.read(info)
            if info.filename == "imgtool-pyz.json":
                body = json.dumps(dict(json.loads(body), imgtool_version=version)).encode()
            elif info.filename == "imgtool/__init__.py":
                body = re.sub(rb'__version__ = "[^"]*"', f'__version__ = "{version}"'.encode(), body)
            z.writestr(info, body)
    return out.getvalue()


def test_self_update_refuses_an_older_imgtool_unless_asked(services, factory, mirrored, tmp_path):
    """Issue 35 case 8: a signed (here: --expect'ed) older release was installed ("updated imgtool 0.1.0 -> 0.0.1",
    exit 0). Now: refused, exit 3, unless --allow-downgrade; newer goes in; the same version is said, not replaced."""
    (tmp_path / "a").mkdir()
    current, _, _, _ = fetch_from_registry(services, factory, mirrored, tmp_path / "a")
    cache = tmp_path / "a" / "cache"
    (tool,) = (cache / "tool").glob("*.pyz")  # the pyz fetch puts in bundles: made to say 0.0.1 for the next fetch
    tool.write_bytes(with_version(tool.read_bytes(), "0.0.1"))
    old = tmp_path / "old"
    r = imgtool("fetch", "v0.22.1rc1", "--arch", host_arch(), "--mirrors", str(tmp_path / "a" / "mirrors.toml"),
                "-o", str(old), "--chunk-size", "1M", env={"IMGTOOL_CACHE": str(cache)})
    assert r.returncode == 0, r.stderr
    prefix, home = tmp_path / "prefix", tmp_path / "home"
    home.mkdir()
    assert install(current / "imgtool.pyz", prefix, home).returncode == 0
    installed = prefix / "lib/imgtool/imgtool.pyz"

    def update(bundle, *args):
        return run([str(prefix / "bin/imgtool"), "self-update", str(bundle), "--expect", sha256(bundle / "bundle.json"),
                    *args], cwd=tmp_path, env=clean_env(home))

    r = update(old)
    assert r.returncode == 3, r.stdout + r.stderr
    assert err_lines(r) == [f"error: refusing to update imgtool from {old}: its imgtool.pyz is imgtool 0.0.1, older "
                            f"than this {__version__}; nothing was updated",
                            "hint: an older release may lack a fix; to go back on purpose pass --allow-downgrade"]
    assert installed.read_bytes() == (current / "imgtool.pyz").read_bytes()
    r = update(old, "--allow-downgrade")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"updated imgtool {__version__} -> 0.0.1: {installed} ")
    assert installed.read_bytes() == (old / "imgtool.pyz").read_bytes()
    r = update(current)  # the installed 0.0.1 takes the newer one
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"updated imgtool 0.0.1 -> {__version__}: {installed} ")
    r = update(current)
    assert (r.returncode, r.stdout.rstrip()) == (0, f"imgtool is already {__version__} ({installed}); nothing was updated")


# --- the README's offline procedure, followed literally, against every edit the issue tried ------------


def _replace_a_part_with_another_images(out, other):
    mine, theirs = parts_of(out)[0], parts_of(other)[0]
    mine.write_bytes(theirs.read_bytes())
    _remake_sums(out)


def _remake_sums(out):
    lines = []
    for line in (out / "SHA256SUMS").read_text().splitlines():
        _, name = line.split("  ", 1)
        lines.append(f"{sha256(out / name)}  {name}")
    (out / "SHA256SUMS").write_text("\n".join(lines) + "\n")


def _edit_load_sh(out, other):
    text = (out / "load.sh").read_text()
    assert "signers=${IMGTOOL_SIGNERS:-}" in text
    (out / "load.sh").write_text(text.replace("signers=${IMGTOOL_SIGNERS:-}", "signers="))
    _replace_a_part_with_another_images(out, other)


def _edit_the_pyz(out, other):
    (out / "imgtool.pyz").write_bytes((other / "imgtool.pyz").read_bytes() + b"# edited\n")
    _replace_a_part_with_another_images(out, other)


def _sign_with_a_strangers_key(out, other, stranger=None):
    (out / "bundle.json.sig").unlink()
    subprocess.run(["ssh-keygen", "-Y", "sign", "-q", "-f", str(stranger), "-n", "imgtool-bundle",
                    str(out / "bundle.json")], check=True, timeout=60, capture_output=True)


def _add_a_newline_to_bundle_json(out, other):
    (out / "bundle.json").write_bytes((out / "bundle.json").read_bytes() + b"\n")
    _remake_sums(out)


def _bundle_json_a_fifo(out, other):
    (out / "bundle.json").unlink()
    os.mkfifo(out / "bundle.json")


ATTACKS = {
    "a part replaced with another image's, SHA256SUMS remade": _replace_a_part_with_another_images,
    "load.sh edited (signers=) and a part replaced": _edit_load_sh,
    "imgtool.pyz edited and a part replaced": _edit_the_pyz,
    "a stranger's signature": _sign_with_a_strangers_key,
    "bundle.json with one added newline": _add_a_newline_to_bundle_json,
    "bundle.json a FIFO": _bundle_json_a_fifo,
}


def test_the_readme_procedure_refuses_every_edit(services, factory, mirrored, tmp_path, docker_cli, docker_cleanup):
    """README.txt's steps: sha256sum the pyz against the published value, self-install, then the
    installed copy loads every bundle under the site's policy. Each attack leaves Docker as it was."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    out, image, ref, fetch = fetch_from_registry(services, factory, mirrored, tmp_path / "a")
    other, _, _, _ = fetch_from_registry(services, factory, mirrored, tmp_path / "b")
    docker_cleanup.image(ref, *docker_cli.ids_of(image))
    home = tmp_path / "home"
    keys = {}
    for who in ("release", "stranger"):
        keys[who] = tmp_path / who
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", who, "-f", str(keys[who])],
                       check=True, timeout=60)
    assert imgtool("sign", str(out), "--sign-key", str(keys["release"]),
                   env={"HOME": "/nonexistent", "IMGTOOL_SIGNERS": ""}).returncode == 0
    policy = home / ".config/imgtool/allowed_signers"
    policy.parent.mkdir(parents=True)
    pub = (tmp_path / "release.pub").read_text().split()
    policy.write_text(f"release@example.com {pub[0]} {pub[1]}\n")
    pristine = {p.name: p.read_bytes() for p in out.iterdir()}

    # steps 1 and 2, once per host
    published = next(line.split()[2] for line in fetch.stdout.splitlines() if line.startswith("imgtool.pyz sha256: "))
    assert subprocess.run(["sha256sum", "imgtool.pyz"], cwd=out, capture_output=True, text=True,
                          check=True).stdout.split()[0] == published
    prefix = tmp_path / "prefix"
    assert install(out / "imgtool.pyz", prefix, home).returncode == 0
    tool = str(prefix / "bin/imgtool")
    env = clean_env(home, services.docker_host)

    results = {}
    for attack, spoil in ATTACKS.items():
        for p in list(out.iterdir()):
            p.unlink()
        for name, data in pristine.items():
            (out / name).write_bytes(data)
        if spoil is _sign_with_a_strangers_key:
            spoil(out, other, keys["stranger"])
        else:
            spoil(out, other)
        before = docker_cli.image_ids()
        for verb in ("verify", "load"):
            r = run([tool, verb, str(out)], cwd=tmp_path, env=env)
            assert r.returncode == 3, (attack, verb, r.stdout, r.stderr)
            results[(attack, verb)] = err_lines(r)
        assert docker_cli.image_ids() == before, attack
        assert docker_cli.find(image) is None, attack
    # what each refusal said, for docs/reliability.md ("Attacks on the offline side")
    def fingerprint(who):
        return subprocess.run(["ssh-keygen", "-lf", f"{keys[who]}.pub"], capture_output=True, text=True,
                              check=True).stdout.split()[1]

    said = {what: lines[0] for what, lines in results.items()}
    # the part replaced damages as many blobs as it holds (where they lie moves with the generated layers): every
    # problem is listed under the count, and an edited checker is one problem more
    replaced = len([line for line in results[("a part replaced with another image's, SHA256SUMS remade", "verify")]
                    if line.startswith("  - ")])
    assert replaced >= 3  # the part itself and the blobs it held
    for attack, problems, extra in (("a part replaced with another image's, SHA256SUMS remade", replaced, None),
                                    ("load.sh edited (signers=) and a part replaced", replaced + 1, "load.sh"),
                                    ("imgtool.pyz edited and a part replaced", replaced + 1, "imgtool.pyz")):
        assert len([line for line in results[(attack, "verify")] if line.startswith("  - ")]) == problems
        assert said[(attack, "verify")] == f"error: bundle failed verification: {out}: {problems} problems"
        assert said[(attack, "load")] == f"error: refusing to load: {out}: {problems} problems; nothing was loaded"
        if extra:  # the edited checker is named: the installed copy compares it with the signed bundle.json
            assert any(line.startswith(f"  - {extra}") and "does not match bundle.json" in line
                       for line in results[(attack, "load")]), results[(attack, "load")]
    stranger = (f"signed by a key not in {policy} (the user's policy): ED25519 key {fingerprint('stranger')}")
    assert said[("a stranger's signature", "verify")] == f"error: bundle failed verification: {out}: {stranger}"
    assert said[("a stranger's signature", "load")] == f"error: refusing to load {out}: {stranger}; nothing was loaded"
    bad = (f"bad signature: bundle.json.sig (by ED25519 key {fingerprint('release')}) does not match bundle.json: "
           "bundle.json was changed after it was signed, or the signature is another bundle's")
    assert said[("bundle.json with one added newline", "verify")] == f"error: bundle failed verification: {out}: {bad}"
    assert said[("bundle.json with one added newline", "load")] == \
        f"error: refusing to load {out}: {bad}; nothing was loaded"
    for verb in ("verify", "load"):
        assert said[("bundle.json a FIFO", verb)] == "error: bundle.json is not a regular file (a FIFO)"

    # and the pristine bundle loads
    for p in list(out.iterdir()):
        p.unlink()
    for name, data in pristine.items():
        (out / name).write_bytes(data)
    r = run([tool, "load", str(out)], cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    assert docker_cli.holds(ref, image)


def test_self_update_never_overwrites_a_pyz_that_is_not_the_installed_one(fetched, tmp_path):
    """A bundle directory that happens to be called `imgtool`: its pyz is not an installed copy, so
    self-update run from it refuses instead of replacing it."""
    out, _, _, _ = fetched
    odd = tmp_path / "media" / "imgtool"
    odd.mkdir(parents=True)
    pyz = odd / "imgtool.pyz"
    pyz.write_bytes((out / "imgtool.pyz").read_bytes())
    home = tmp_path / "home"
    home.mkdir()
    r = run([*old_python("3.7"), str(pyz), "self-update", str(out), "--expect", sha256(out / "bundle.json")],
            cwd=tmp_path, env=clean_env(home))
    assert r.returncode == 2, r.stderr
    assert err_lines(r)[0] == f"error: self-update updates an installed imgtool, and this one runs from {pyz}"
