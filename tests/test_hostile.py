"""Inputs that used to hang or crash a command (issue 24): each one is refused with one line and
exit 3, by imgtool and by imgtool.pyz on Kylin's Python 3.7, within a timeout that fails the test.

A hang here shows up as subprocess.TimeoutExpired: the test fails, it never waits forever.
"""

import json
import os
from pathlib import Path

import pytest

from tests.support.bundles import BlobDir, damage_member, fetch_from_registry, imgtool, parts_of, write
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
    if verb == "sign":
        import subprocess

        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "key")], check=True,
                       timeout=60)
    args = {"verify": ("verify", str(bundle)), "load": ("load", str(bundle)),
            "diff": ("diff", str(bundle), str(bundle)),
            "sign": ("sign", str(bundle), "--sign-key", str(tmp_path / "key"))}[verb]
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


# --- one exit code per refusal, imgtool and load.sh alike (docs/reliability.md, "Exit codes") ----------------

def _exit_table():
    text = (Path(__file__).resolve().parent.parent / "docs" / "reliability.md").read_text()
    section = text.split("## Exit codes: imgtool and load.sh agree", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[1].isdigit():
            rows[cells[0]] = (int(cells[1]), int(cells[2]))
    return rows


def _load_sh(out, docker_host, env=None):
    import subprocess

    e = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": str(out.parent / "home"), "LANG": "C.UTF-8",
         "DOCKER": f"docker -H {docker_host}", **(env or {})}
    return subprocess.run(["sh", "load.sh"], cwd=out, capture_output=True, text=True, env=e, timeout=HANG)


def test_imgtool_and_load_sh_exit_as_this_table_says(services, factory, mirrored, tmp_path, docker_cli, docker_cleanup):
    import hashlib
    import shutil
    import subprocess

    from tests.support.bundles import parts_of
    from tests.test_delta import _mirrors

    table = _exit_table()
    assert len(table) == 9, table
    arch = host_arch()
    out, image, ref, _ = fetch_from_registry(services, factory, mirrored, tmp_path)
    docker_cleanup.image(ref, *docker_cli.ids_of(image))
    pristine = {p.name: p.read_bytes() for p in out.iterdir()}
    home = tmp_path / "home"
    keys = tmp_path / "keys"
    keys.mkdir()
    for who in ("release", "stranger"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", who, "-f", str(keys / who)],
                       check=True, timeout=60)

    def restore():
        for p in list(out.iterdir()):
            if p.is_dir() and not p.is_symlink():
                p.rmdir()
            else:
                p.unlink()
        for name, data in pristine.items():
            (out / name).write_bytes(data)
        shutil.rmtree(home, ignore_errors=True)
        home.mkdir()

    def sign(key):
        r = imgtool("sign", str(out), "--sign-key", str(keys / key), env={"HOME": str(home), "IMGTOOL_SIGNERS": ""})
        assert r.returncode == 0, r.stderr

    def damaged():
        part = parts_of(out)[0]
        data = bytearray(part.read_bytes())
        data[len(data) // 2] ^= 1
        part.write_bytes(bytes(data))

    def fifo_part():
        part = parts_of(out)[-1]
        part.unlink()
        os.mkfifo(part)

    def short_part():
        part = parts_of(out)[-1]
        part.write_bytes(part.read_bytes()[:-1])

    def edited_after_signing():
        sign("release")
        (out / "bundle.json").write_bytes((out / "bundle.json").read_bytes() + b"\n")
        sums = (out / "SHA256SUMS").read_text().splitlines()
        new = hashlib.sha256((out / "bundle.json").read_bytes()).hexdigest()
        (out / "SHA256SUMS").write_text("\n".join(f"{new}  bundle.json" if s.endswith("  bundle.json") else s
                                                  for s in sums) + "\n")

    def stranger():
        sign("stranger")
        policy = home / ".config" / "imgtool" / "allowed_signers"
        policy.parent.mkdir(parents=True)
        policy.write_text(f"release {(keys / 'release.pub').read_text().split(' ')[0]} "
                          f"{(keys / 'release.pub').read_text().split(' ')[1]}\n")

    cases = {
        "a part damaged (sha256 differs)": (damaged, {}),
        "a part that is not a regular file (FIFO, `/dev/zero` link)": (fifo_part, {}),
        "a part of the wrong size": (short_part, {}),
        "bundle.json edited after signing (no policy)": (edited_after_signing, {}),
        "a stranger's signature under `~/.config/imgtool/allowed_signers`": (stranger, {}),
        "`IMGTOOL_SIGNERS` names a missing file": (lambda: None, {"IMGTOOL_SIGNERS": str(tmp_path / "gone")}),
    }
    for row, (spoil, env) in cases.items():
        restore()
        spoil()
        before = docker_cli.image_ids()
        full_env = {"HOME": str(home), "IMGTOOL_SIGNERS": "", **env}
        r = imgtool("load", str(out), env=full_env, docker_host=services.docker_host, timeout=HANG)
        sh = _load_sh(out, services.docker_host, {k: v for k, v in env.items()})
        assert (r.returncode, sh.returncode) == table[row], (row, r.stderr, sh.stderr)
        assert docker_cli.image_ids() == before, row

    # a delta bundle whose base this Docker lacks
    restore()
    base = factory.layers(1)
    old = factory.image(arch, layers=1, base=base)
    new = factory.image(arch, layers=1, base=base)
    (tmp_path / "m1").mkdir()
    (tmp_path / "m2").mkdir()
    ms = mirrored(factory.index([old]), tag="v1", targets=("upstream",))
    mirrored(factory.index([new]), tag="v2", targets=("upstream",))
    cfg = _mirrors(tmp_path / "m1", services, ms)
    docker_cleanup.image(*docker_cli.ids_of(old), *docker_cli.ids_of(new))
    inv = tmp_path / "inv.json"
    inv.write_text(json.dumps({"format": "imgtool-inventory", "version": 1, "images": [
        {"id": old.config_digest, "tags": [], "diff_ids": old.diff_ids}]}))
    delta = tmp_path / "delta"
    r = imgtool("fetch", "--no-tool", "v2", "--mirrors", str(cfg), "--have", str(inv), "-o", str(delta),
                env={"IMGTOOL_CACHE": str(tmp_path / "cache")})
    assert r.returncode == 0, r.stderr
    r = imgtool("load", str(delta), docker_host=services.docker_host)
    sh = _load_sh(delta, services.docker_host)
    assert (r.returncode, sh.returncode) == table["a delta bundle whose base Docker lacks"], (r.stderr, sh.stderr)

    # zstd layers on Docker 20.10
    d20 = services.on("20.10").docker_host
    zimg = factory.image(arch, layers=1)
    zs = mirrored(factory.index([factory.zstd_twin(zimg)]), tag="z1", targets=("upstream",))
    zcfg = _mirrors(tmp_path / "m2", services, zs)
    zout = tmp_path / "zstd"
    r = imgtool("fetch", "--no-tool", "z1", "--layers", "as-is", "--mirrors", str(zcfg), "-o", str(zout),
                env={"IMGTOOL_CACHE": str(tmp_path / "cache")})
    assert r.returncode == 0, r.stderr
    r = imgtool("load", str(zout), docker_host=d20)
    sh = _load_sh(zout, d20)
    assert (r.returncode, sh.returncode) == table["zstd layers on Docker older than 23.0"], (r.stderr, sh.stderr)

    # no runtime at all: Docker's socket answers nothing, no containerd socket, no podman in PATH
    from tests.test_load_sh import tool_dir

    bare = {"PATH": str(tool_dir(tmp_path / "bare-bin", {})), "CONTAINERD_ADDRESS": str(tmp_path / "no.sock")}
    r = imgtool("load", str(zout), docker_host=f"unix://{tmp_path}/no-docker.sock", env=bare)
    sh = _load_sh(zout, f"unix://{tmp_path}/no-docker.sock", bare)
    assert (r.returncode, sh.returncode) == \
        table["no runtime to load into (Docker not answering, no containerd socket, no Podman)"], (r.stderr, sh.stderr)


def test_load_sh_and_imgtool_find_the_same_policy_files(services, factory, mirrored, tmp_path, docker_cli):
    """~/.config/imgtool/allowed_signers and /etc/imgtool/allowed_signers (the latter in a mount
    namespace of the test's own, /etc overlaid, so the machine's /etc is never written): a stranger's
    signature is refused by imgtool, the pyz and load.sh alike."""
    import subprocess

    out, image, ref, _ = fetch_from_registry(services, factory, mirrored, tmp_path)
    keys = tmp_path / "keys"
    keys.mkdir()
    for who in ("release", "stranger"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", who, "-f", str(keys / who)],
                       check=True, timeout=60)
    r = imgtool("sign", str(out), "--sign-key", str(keys / "stranger"), env={"HOME": "/nonexistent", "IMGTOOL_SIGNERS": ""})
    assert r.returncode == 0, r.stderr
    release = (keys / "release.pub").read_text().split()
    policy_line = f"release@example.com {release[0]} {release[1]}\n"
    home = tmp_path / "home"
    user = home / ".config" / "imgtool" / "allowed_signers"
    user.parent.mkdir(parents=True)
    user.write_text(policy_line)
    upper, work = tmp_path / "etc-upper", tmp_path / "etc-work"
    (upper / "imgtool").mkdir(parents=True)
    work.mkdir()
    (upper / "imgtool" / "allowed_signers").write_text(policy_line)
    overlay = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
               f'mount -t overlay overlay -o lowerdir=/etc,upperdir={upper},workdir={work} /etc && exec "$@"', "sh"]
    before = docker_cli.image_ids()
    base_env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8", "DOCKER": f"docker -H {services.docker_host}",
                "DOCKER_HOST": services.docker_host, "IMGTOOL_CACHE": str(tmp_path / "cache")}
    from tests.test_selfbundle import old_python

    for where, home_dir, wrap in (("user", home, []), ("site", tmp_path / "nohome", overlay)):
        env = {**base_env, "HOME": str(home_dir)}
        for what, cmd in (("load.sh", ["sh", "load.sh"]),
                          ("imgtool", [os.sys.executable, "-m", "imgtool", "load", "."]),
                          ("pyz", [*old_python("3.7"), "imgtool.pyz", "load", "."])):
            r = subprocess.run([*wrap, *cmd], cwd=out, env=env, capture_output=True, text=True, timeout=HANG)
            assert r.returncode == 3, (where, what, r.stderr)
            assert "signed by a key not in" in r.stderr, (where, what, r.stderr)
            policy = str(user) if where == "user" else "/etc/imgtool/allowed_signers"
            assert policy in r.stderr, (where, what, r.stderr)
    assert docker_cli.image_ids() == before


def test_sixty_thousand_problems_print_twenty_and_a_count(bundle):
    """A bundle.json with 60,000 bogus layers: the error names 20 problems and how many more; --json
    lists every one (it used to be a 60,007-line error)."""
    import hashlib

    doc = json.loads((bundle / "bundle.json").read_text())
    image = doc["images"][0]
    for i in range(60_000):
        fake = hashlib.sha256(b"bogus %d" % i).hexdigest()
        image["layers"].append(dict(image["layers"][0], digest=f"sha256:{fake}",
                                    diff_id=f"sha256:{hashlib.sha256(fake.encode()).hexdigest()}"))
    (bundle / "bundle.json").write_text(json.dumps(doc))
    every = run("verify", str(bundle), "--json")
    assert every.returncode == 3
    n = len(json.loads(every.stdout)["problems"])
    assert n >= 60_000
    r = run("verify", str(bundle))
    assert r.returncode == 3
    listed = [line for line in r.stderr.splitlines() if line.startswith("  - ")]
    assert len(listed) == 21
    assert listed[-1] == f"  - and {n - 20} more (--json lists every one)"


def test_a_policy_file_that_is_not_a_regular_file_is_refused_not_skipped(services, factory, mirrored, tmp_path):
    """A FIFO (or directory) where the user's allowed_signers should be: skipping it would leave the
    site without its policy; imgtool and load.sh refuse, exit 2, without reading it."""
    import subprocess

    out, _, _, _ = fetch_from_registry(services, factory, mirrored, tmp_path)
    home = tmp_path / "home"
    policy = home / ".config" / "imgtool" / "allowed_signers"
    policy.parent.mkdir(parents=True)
    os.mkfifo(policy)
    r = imgtool("verify", str(out), env={"HOME": str(home), "IMGTOOL_SIGNERS": ""}, timeout=HANG)
    assert r.returncode == 2, r.stderr
    assert errors(r)[0] == f"error: the user's policy {policy} is not a regular file"
    sh = subprocess.run(["sh", "load.sh"], cwd=out, capture_output=True, text=True, timeout=HANG,
                        env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": str(home),
                             "DOCKER": f"docker -H {services.docker_host}"})
    assert sh.returncode == 2, sh.stderr
    assert f"load.sh: error: {policy} is not a regular file (an allowed_signers policy must be one)" in \
        sh.stderr.splitlines()


# --- every refusal of hostile input has its exit code, on every runtime and verb that meets it (issue 46) -----

def _mirrors_toml(path: Path, url: str, repo: str) -> Path:
    path.write_text(f'default_image = "quay.io/{repo}"\n[[mirrors]]\nname = "quay"\nregistry = "quay.io"\n'
                    f'url = "{url}"\nupstream = true\ninsecure = true\n')
    return path


def _refusal(r):
    """(exit code, the error line): what the user is told; a line saying "internal error" is a bug's."""
    lines = r.stderr.splitlines()
    return r.returncode, next((x for x in lines if x.startswith("error:")), None), \
        [x for x in lines if "internal error" in x]


def _append_to_archive(bundle: Path, extra: bytes) -> None:
    """`extra` after the end of a one-part bundle's archive, with bundle.json and SHA256SUMS made to agree: what a
    hostile maker writes (every size and sum checks out; only reading the archive can tell)."""
    import hashlib

    doc = json.loads((bundle / "bundle.json").read_text())
    (part,) = parts_of(bundle)
    data = part.read_bytes() + extra
    part.write_bytes(data)
    sha = hashlib.sha256(data).hexdigest()
    doc["archive"].update({"size": len(data), "sha256": sha})
    doc["parts"][0].update({"size": len(data), "sha256": sha})
    raw = (json.dumps(doc, indent=2) + "\n").encode()
    (bundle / "bundle.json").write_bytes(raw)
    sums = [f"{sha}  {part.name}", f"{hashlib.sha256(raw).hexdigest()}  bundle.json"]
    sums += [f"{f['sha256']}  {f['name']}" for f in doc["files"]]
    (bundle / "SHA256SUMS").write_text("\n".join(sums) + "\n")


class _Hostile:
    """The hostile inputs of one test: a registry image whose config's diff_id is not its layer's, a registry whose
    answer for a layer (and another's for its config) differs from its digest (a proxy flips a byte of every
    answer), a bundle with a part edited,
    and a gzip bundle with bytes after its compressed stream (bundle.json and SHA256SUMS made to match). Images are tiny (two 16 KiB
    layers): what is tested is the refusal, not the bytes."""

    def __init__(self, services, factory, mirrored, tmp_path: Path):
        from tests.support.proxy import Fault, FaultProxy

        arch = host_arch()
        self.tmp = tmp_path
        wrong = factory.wrong_diff_id(factory.image(arch, layers=2, layer_size=16 * 1024), 1)
        ms = mirrored(wrong, tag="v1", targets=("upstream",), name="diff-id")
        self.diff_ref = f"quay.io/{ms.repo}:v1"
        self.diff_image = wrong
        self.diff_cfg = _mirrors_toml(tmp_path / "diff.toml", f"http://{services.plain}", ms.repo)
        flipped = factory.image(arch, layers=2, layer_size=16 * 1024)
        ms = mirrored(flipped, tag="v1", targets=("upstream",), name="flipped")
        self.proxy = FaultProxy(services.plain)
        victim = flipped.layers[1].digest
        self.proxy.add(Fault("flip", lambda m, p: m == "GET" and victim in p, times=10_000, after=100))
        self.flip_ref = f"quay.io/{ms.repo}:v1"
        self.flip_cfg = _mirrors_toml(tmp_path / "flip.toml", self.proxy.url, ms.repo)
        config = factory.image(arch, layers=1, layer_size=16 * 1024)
        ms = mirrored(config, tag="v1", targets=("upstream",), name="config-flipped")
        self.proxy.add(Fault("flip", lambda m, p: m == "GET" and config.config_digest in p, times=10_000, after=10))
        self.config_cfg = _mirrors_toml(tmp_path / "config.toml", self.proxy.url, ms.repo)
        self.flip_image = flipped
        store = BlobDir(tmp_path / "blobs")
        image = factory.image(arch, layers=2, layer_size=16 * 1024)
        self.bundle_image = image
        self.edited = tmp_path / "edited"
        write(self.edited, [store.pulled(image, f"{REPO}:edited")], store)
        damage_member(self.edited, image.layers[1].digest)
        self.gz = tmp_path / "gz"
        write(self.gz, [store.pulled(image, f"{REPO}:gzend")], store, compress="gzip")
        _append_to_archive(self.gz, b"not gzip data after the last member")

    def close(self) -> None:
        self.proxy.close()

    def cache(self) -> str:
        """A fresh cache per run: nothing a run kept decides the next."""
        n = len(list(self.tmp.glob("cache-*")))
        return str(self.tmp / f"cache-{n}")


@pytest.fixture
def hostile(services, factory, mirrored, tmp_path):
    h = _Hostile(services, factory, mirrored, tmp_path)
    yield h
    h.close()


@pytest.mark.runtimes(stores=True, proof=True)
def test_hostile_input_is_refused_with_its_exit_code_on_every_runtime(hostile, node):
    """Issue 46 item 6: a registry whose config diff_ids do not match its layers, copied into Podman, ended as
    `internal error: Applied: ...` (exit 1): the exceptions raised while an image lands (bundle/landing.py's Cut,
    Applied) were not of the error root. Each hostile input through each verb that lands it in a runtime, on
    every runtime: its exit code, no `internal error`, nothing left in the runtime.

    The exit code says who refused: Docker and containerd check diff_ids as they unpack and refuse the image
    themselves (5, the runtime); Podman does not, so imgtool compares what it applied and refuses it (3,
    verification failed). Content that differs from its digest, a registry's answer or a bundle's member, is 3
    whichever runtime it was going to."""
    h = hostile
    runtime_refuses = 3 if node.kind == "podman" else 5
    cases = {
        "registry: a layer that is not its config's diff_id, copy registry: runtime:": (
            ("copy", "registry:v1", "runtime:", "--mirrors-file", str(h.diff_cfg)), runtime_refuses),
        "registry: a layer answer that differs from its digest, copy registry: runtime:": (
            ("copy", "registry:v1", "runtime:", "--mirrors-file", str(h.flip_cfg)), 3),
        "bundle: a part edited, load": (("load", str(h.edited)), 3),
        "bundle: bytes after a gzip archive's last member, load": (("load", str(h.gz)), 3),
    }
    before = node.image_ids()
    node.remove_later(h.diff_ref, h.flip_ref, *node.ids_of(h.diff_image), *node.ids_of(h.flip_image),
                      *node.ids_of(h.bundle_image))  # only if a refusal failed: a pass leaves nothing
    runs = {case: imgtool(*args, env=dict(node.env, IMGTOOL_CACHE=h.cache(), HOME="/nonexistent", IMGTOOL_SIGNERS=""),
                          timeout=HANG) for case, (args, _) in cases.items()}
    got = {case: _refusal(r) for case, r in runs.items()}
    assert {case: (code, lines) for case, (code, _, lines) in got.items()} == \
        {case: (code, []) for case, (_, code) in cases.items()}, got
    assert node.image_ids() == before
    if node.kind == "podman":  # the case, as the user reads it (4.3 applies the layer, 5 refuses it)
        r = runs["registry: a layer that is not its config's diff_id, copy registry: runtime:"]
        done = "applied" if node.version == "4.3" else "refused"
        assert errors(r) == [
            f"error: layer 2 of {h.diff_ref}: Podman {done} content that is not its diff_id (blob "
            f"{h.diff_image.layers[1].digest[7:19]}); no image of {h.diff_ref} was kept",
            "hint: the blob matches its digest, so the image is published this way (fetching it again gives the same "
            "bytes): report it to the image's publisher"]


def test_hostile_input_is_refused_with_its_exit_code_by_every_verb_that_reads_it(hostile, services, uniq, registry):
    """The same hostile inputs through the verbs that meet them without a runtime (fetch, inspect; verify, copy
    bundle: bundle:, push): the exit code, and no `internal error`.

    The codes are the ones each refusal has today: a layer that arrives unlike its digest is 3 (the puller's
    VerifyError), a config 4 (no source serves it: another may), and inspect says 1 for "no source could be
    inspected" (tests/test_cli.py holds it so). Bytes after a gzip archive's end are refused by every verb that reads
    the archive (issue 47: one reader; copy bundle: bundle: and push read only up to the last blob and exited 0)."""
    h = hostile
    out = h.tmp / "out"
    to = f"{services.plain}/{uniq}"  # a registry that holds none of the blobs: push reads each one
    cases = {
        "registry: a layer that is not its config's diff_id, fetch --check-diff-ids": (
            ("fetch", "v1", "--mirrors-file", str(h.diff_cfg), "--check-diff-ids", "--no-tool", "-o", str(out / "1")),
            3),
        "registry: a layer answer that differs from its digest, fetch": (
            ("fetch", "v1", "--mirrors-file", str(h.flip_cfg), "--no-tool", "-o", str(out / "2")), 3),
        "registry: a config answer that differs from its digest, fetch": (
            ("fetch", "v1", "--mirrors-file", str(h.config_cfg), "--no-tool", "-o", str(out / "3")), 4),
        "registry: a config answer that differs from its digest, inspect": (
            ("inspect", "v1", "--mirrors-file", str(h.config_cfg)), 1),
        "bundle: a part edited, verify": (("verify", str(h.edited)), 3),
        "bundle: a part edited, copy bundle: bundle:": (("copy", f"bundle:{h.edited}", f"bundle:{out / '4'}"), 3),
        "bundle: a part edited, push": (("push", str(h.edited), "--to", to, "--insecure"), 3),
        "bundle: bytes after a gzip archive's last member, verify": (("verify", str(h.gz)), 3),
        "bundle: bytes after a gzip archive's last member, copy bundle: bundle:": (
            ("copy", f"bundle:{h.gz}", f"bundle:{out / '5'}"), 3),
        "bundle: bytes after a gzip archive's last member, push": (("push", str(h.gz), "--to", to, "--insecure"), 3),
    }
    runs = {case: imgtool(*args, env={"IMGTOOL_CACHE": h.cache(), "HOME": "/nonexistent", "IMGTOOL_SIGNERS": ""},
                          timeout=HANG) for case, (args, _) in cases.items()}
    got = {case: _refusal(r) for case, r in runs.items()}
    assert {case: (code, lines) for case, (code, _, lines) in got.items()} == \
        {case: (code, []) for case, (_, code) in cases.items()}, got
    assert not (out / "5" / "bundle.json").exists()  # the copy left no bundle
    assert registry("plain").head_manifest(f"{uniq}/ascend/vllm-ascend", "gzend") is None  # no manifest pushed
