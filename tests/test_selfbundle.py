"""imgtool.pyz: the bundle carries the tool that reads it, runnable by a bare Python 3.9.

The bare interpreter is pyenv's python3.9 run with -I (no user site, no PYTHON* variables)
when none of imgtool's dependencies is importable in it, else a fresh `venv --without-pip`.
Never skipped: without a bare interpreter the promise "no install needed" is untested.
"""

import ast
import hashlib
import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from imgtool import __version__, selfbundle
from imgtool.errors import ImgtoolError
from tests.support.bundles import damaged_part_line, fetch_from_registry, imgtool, parts_of
from tests.support.images import host_arch
from tests.support.pythons import pyenv_python, pyenv_root

ROOT = Path(__file__).resolve().parents[1]
DEPS = ("click", "requests", "urllib3", "idna", "certifi", "charset_normalizer", "docker", "tqdm", "tomli",
        "zstandard", "isal", "imgtool")


def _importable(python):
    code = "import importlib.util as u, sys; print(','.join(m for m in sys.argv[1:] if u.find_spec(m)))"
    r = subprocess.run([*python, "-c", code, *DEPS], capture_output=True, text=True, cwd="/", timeout=60)
    assert r.returncode == 0, r.stderr
    return [m for m in r.stdout.strip().split(",") if m]


@pytest.fixture(scope="session")
def bare_python(tmp_path_factory):
    """[interpreter, -I]: pyenv's CPython 3.9 (or, lacking one, this Python's venv) with none of the deps."""
    py39 = pyenv_python("3.9")
    if py39 and not _importable([py39, "-I"]):
        python = [py39, "-I"]
    else:
        base = py39 or sys.executable
        venv = tmp_path_factory.mktemp("bare") / "venv"
        subprocess.run([base, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
        python = [str(venv / "bin" / "python"), "-I"]
    assert _importable(python) == [], "the bare interpreter must have none of imgtool's dependencies"
    return python


def run_bare(python, *args, cwd, docker_host=None, cache=None):
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/root"), "LANG": "C.UTF-8",
           "IMGTOOL_CACHE": str(cache or "/nonexistent/imgtool-cache")}  # verify/load must not need it
    if docker_host:
        env["DOCKER_HOST"] = docker_host
    return subprocess.run([*python, *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=300)


@pytest.mark.engines
def test_bundle_pyz_verifies_and_loads_with_a_bare_python(services, factory, mirrored, tmp_path, bare_python,
                                                          docker_cli, docker_cleanup):
    out, image, ref, fetched = fetch_from_registry(services, factory, mirrored, tmp_path)
    pyz = out / "imgtool.pyz"
    data = pyz.read_bytes()
    files = {f["name"]: f for f in json.loads((out / "bundle.json").read_text())["files"]}
    assert files["imgtool.pyz"] == {"name": "imgtool.pyz", "size": len(data),
                                    "sha256": hashlib.sha256(data).hexdigest()}
    assert f"{hashlib.sha256(data).hexdigest()}  imgtool.pyz" in (out / "SHA256SUMS").read_text().splitlines()
    assert len(data) < 3 * 2**20  # "a few MB at most": about 0.9 MB today
    assert f"python3 {out}/imgtool.pyz load {out}" in fetched.stdout
    for text in ((out / "README.txt").read_text(), run_bare(["sh"], "load.sh", "--help", cwd=out).stdout):
        assert "imgtool load ." in text and "python3 imgtool.pyz load ." in text and "sh load.sh" in text
        assert "--no-tool" not in text
        # which Python the pyz needs, push included (issue 18)
        assert "On python3 3.7+ imgtool.pyz also verifies, prints run flags, runs, and pushes to a site " \
               "registry; fetch needs 3.9+." in text
        assert "python3 3.7+ 上 imgtool.pyz 还可 verify、run-flags、run，以及 push 到站内镜像仓库；fetch 需要 3.9+。" in text

    ok = run_bare(bare_python, "imgtool.pyz", "verify", ".", cwd=out)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.startswith("ok: .: 1 image(s); ")
    docker_cleanup.image(ref, image.config_digest)
    loaded = run_bare(bare_python, "imgtool.pyz", "load", ".", cwd=out, docker_host=services.docker_host)
    assert loaded.returncode == 0, loaded.stderr
    assert "loaded 1 image(s) from . in " in loaded.stdout
    assert docker_cli.holds(ref, image)

    # the pyz is code people run: a changed one is damage, as a changed load.sh is
    pyz.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    bad = imgtool("verify", str(out), "--quick")
    assert bad.returncode == 3
    assert "  - imgtool.pyz does not match bundle.json: it was changed after the fetch; " \
           "copy imgtool.pyz again from the source medium" in bad.stderr.splitlines()


def test_zstd_bundle_without_zstandard_says_what_to_do(services, factory, mirrored, tmp_path, bare_python):
    out, _, _, _ = fetch_from_registry(services, factory, mirrored, tmp_path, "--compress", "zstd")
    r = run_bare(bare_python, "imgtool.pyz", "verify", ".", cwd=out)
    assert r.returncode == 3, r.stderr
    assert r.stderr.splitlines() == [
        "error: this bundle is zstd-compressed and the zstandard Python package is missing",
        "hint: install it (pip install zstandard, or the system's python3-zstandard package), "
        "or run `sh load.sh` on a host with the zstd command",
    ]
    quick = run_bare(bare_python, "imgtool.pyz", "verify", ".", "--quick", cwd=out)
    assert quick.returncode == 0, quick.stderr  # the parts' checksums need no zstandard


def test_no_tool_leaves_the_pyz_out_and_says_so(services, factory, mirrored, tmp_path):
    out, _, _, fetched = fetch_from_registry(services, factory, mirrored, tmp_path, "--no-tool")
    assert not (out / "imgtool.pyz").exists()
    assert "imgtool.pyz" not in (out / "SHA256SUMS").read_text()
    assert [f["name"] for f in json.loads((out / "bundle.json").read_text())["files"]] == ["load.sh", "README.txt"]
    assert "imgtool.pyz load" not in fetched.stdout
    readme = (out / "README.txt").read_text()
    assert "not in this bundle (made with --no-tool); `imgtool self-bundle` writes one" in readme
    assert imgtool("verify", str(out)).returncode == 0


def test_the_pyz_fetches_too_and_copies_itself(services, factory, mirrored, tmp_path, bare_python):
    """The connected side without pip: the pyz fetches (gzip; zstd says what is missing) and
    `self-bundle` run from a pyz writes that same pyz."""
    tool = tmp_path / "imgtool.pyz"
    assert imgtool("self-bundle", "-o", str(tool)).returncode == 0
    idx = factory.multiarch(media="oci", layers=1)
    ms = mirrored(idx, tag="v1", targets=("upstream",))
    cfg = tmp_path / "mirrors.toml"
    cfg.write_text(f'default_image = "quay.io/{ms.repo}"\n[[mirrors]]\nname = "quay"\nregistry = "quay.io"\n'
                   f'url = "http://{services.plain}"\nupstream = true\ninsecure = true\n')
    common = ["--mirrors", str(cfg), "--arch", host_arch()]
    (tmp_path / "home").mkdir()
    r = run_bare(bare_python, str(tool), "fetch", "v1", *common, "-o", "b", "--compress", "gzip", "-q",
                 cwd=tmp_path / "home", cache=tmp_path / "cache")
    assert r.returncode == 0, r.stderr
    out = tmp_path / "home" / "b"
    assert (out / "imgtool.pyz").read_bytes() == tool.read_bytes()
    v = run_bare(bare_python, "imgtool.pyz", "verify", ".", cwd=out)
    assert v.returncode == 0, v.stderr
    z = run_bare(bare_python, str(tool), "fetch", "v1", *common, "-o", "z", "--compress", "zstd", "-q",
                 cwd=tmp_path / "home", cache=tmp_path / "cache")
    assert (z.returncode, z.stderr.splitlines()) == (2, [
        "error: --compress zstd needs the zstandard Python package",
        "hint: pip install zstandard, or use --compress gzip"])
    assert not (tmp_path / "home" / "z" / "bundle.json").exists()
    again = run_bare(bare_python, str(tool), "self-bundle", "-o", "copy.pyz", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert ": imgtool %s for Python 3.7+ (offline verbs and push; every verb on 3.9+), " % __version__ \
        in again.stdout  # read back from the copied pyz's imgtool-pyz.json
    assert (tmp_path / "copy.pyz").read_bytes() == tool.read_bytes()


def test_builds_are_byte_identical_and_cached(tmp_path, monkeypatch):
    a, b = selfbundle.build(tmp_path / "a.pyz"), selfbundle.build(tmp_path / "b.pyz")
    assert (tmp_path / "a.pyz").read_bytes() == (tmp_path / "b.pyz").read_bytes() and a.sha256 == b.sha256
    # the size the README promises, in English and in Chinese, is the size built (within 10 %)
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    stated = re.findall(r"`imgtool.pyz` \(≈([0-9.]+) MB\)|imgtool 本身，约 ([0-9.]+) MB", readme)
    assert len(stated) == 2, stated
    built = (tmp_path / "a.pyz").stat().st_size / 1e6
    for said in (float(en or zh) for en, zh in stated):
        assert abs(said - built) <= 0.1 * built, f"README says the pyz is {said} MB; it is {built:.2f} MB"
    with zipfile.ZipFile(tmp_path / "a.pyz") as z:
        infos = z.infolist()
        names = [i.filename for i in infos]
        assert names == sorted(names)
        assert {i.date_time for i in infos} == {(1980, 1, 1, 0, 0, 0)}
        assert {i.external_attr >> 16 for i in infos} == {0o100644}
        assert {"__main__.py", "imgtool/cli.py", "imgtool/mirrors.toml", "click/core.py", "requests/api.py",
                "docker/api/client.py", "charset_normalizer/md.py", "tomli/_parser.py",
                "certifi/cacert.pem"} <= set(names)
        assert not [n for n in names if re.search(r"\.(so|pyd|pyc)$|__pycache__|/RECORD$|^(zstandard|isal)/", n)]
        manifest = json.loads(z.read("imgtool-pyz.json"))
    assert manifest["imgtool_version"] == __version__
    # it starts on Kylin's 3.7 (offline verbs and push); every verb needs 3.9
    assert (manifest["requires_python"], manifest["requires_python_every_verb"]) == (">=3.7", ">=3.9")
    assert a.to_json()["requires_python"] == ">=3.7" and a.warnings == []
    assert manifest["packages"] == a.packages and manifest["left_out"] == ["zstandard", "isal"]
    assert (tmp_path / "a.pyz").read_bytes().startswith(b"#!/usr/bin/env python3\n")

    first = selfbundle.cached_tool(tmp_path / "cache")
    again = selfbundle.cached_tool(tmp_path / "cache")
    assert (first.cached, again.cached) == (False, True)
    assert again.path == first.path and again.sha256 == first.sha256 == a.sha256
    assert first.path.parent == tmp_path / "cache" / "tool"


def test_version_of_the_pyz_and_the_self_bundle_verb(tmp_path, bare_python):
    r = imgtool("self-bundle", "-o", str(tmp_path / "tool.pyz"))
    assert r.returncode == 0, r.stderr
    first = r.stdout.splitlines()[0]
    assert first.startswith(f"wrote {tmp_path / 'tool.pyz'}: imgtool {__version__} for Python 3.7+ (offline verbs "
                            "and push; every verb on 3.9+), ")
    v = run_bare(bare_python, str(tmp_path / "tool.pyz"), "--version", cwd=tmp_path)
    assert (v.returncode, v.stdout, v.stderr) == (0, f"imgtool {__version__}\n", "")
    # reads its built-in mirrors.toml and presets from inside the zip
    # (--runtime docker: run-flags' auto would ask the machine's own Podman for local images)
    flags = run_bare(bare_python, str(tmp_path / "tool.pyz"), "run-flags", "a2", "--image", "v1", "--runtime", "docker",
                     cwd=tmp_path)
    assert flags.returncode == 0, flags.stderr
    assert "quay.io/ascend/vllm-ascend:v1" in flags.stdout


def test_requirements_for_an_extra_are_left_out_by_the_marker_variable_not_by_words():
    parse = selfbundle.Requirement.parse
    assert parse('PySocks!=1.5.7,>=1.5.6; extra == "socks"') == selfbundle.Requirement("PySocks", frozenset({"extra"}))
    assert parse('PySocks; extra == "socks"').for_extra
    assert parse("urllib3<3,>=1.21.1") == selfbundle.Requirement("urllib3", frozenset())
    # a dependency for older Pythons goes in (the pyz runs on them), flagged conditional only
    tomli = parse('tomli>=1.1.0; python_version < "3.11"')
    assert (tomli.name, tomli.for_extra, tomli.conditional) == ("tomli", False, True)
    # "extra" inside a string or a longer name is not the extra variable
    odd = parse("""colorama; platform_system == 'extra' and sys_platform != "win32" or python_full_version>'3'""")
    assert odd.variables == frozenset({"platform_system", "sys_platform", "python_full_version"})
    assert not odd.for_extra
    # a platform marker that never names Linux: not for the pyz (tqdm's colorama on Windows); one that may: kept
    assert parse('colorama; platform_system == "Windows"').not_for_linux
    assert parse("pywin32>=304; sys_platform == 'win32'").not_for_linux
    assert not parse('uvloop; sys_platform == "linux" or sys_platform == "darwin"').not_for_linux
    assert not parse('tomli>=1.1.0; python_version < "3.11"').not_for_linux
    assert not odd.not_for_linux


def test_compiled_only_packages_are_refused():
    from importlib import metadata

    with pytest.raises(ImgtoolError) as e:
        selfbundle._package(metadata.distribution("zstandard"), [])
    assert re.fullmatch(r"cannot build imgtool\.pyz: zstandard \S+ needs compiled code \(zstandard/\S+\.so\) "
                        r"that has no pure-Python version", e.value.message)


def test_roots_are_pyprojects_dependencies_and_zstandard_is_imported_lazily():
    text = (ROOT / "pyproject.toml").read_text()
    deps = re.search(r"^dependencies = \[(.*?)^\]", text, re.S | re.M).group(1)
    names = {re.match(r"[A-Za-z0-9_.-]+", d).group(0) for d in re.findall(r'"([^"]+)"', deps)}
    assert names == set(selfbundle.ROOTS) | set(selfbundle.LAZY)
    # zstandard is left out of the pyz: no module may import it at import time
    for path in (ROOT / "imgtool").rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in tree.body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                assert not any(m.split(".")[0] == "zstandard" for m in mods), path


def test_a_dependency_needing_a_newer_python_is_warned_and_gated(tmp_path):
    packages, notes = selfbundle.collect()
    packages[1] = selfbundle.Package(packages[1].name, packages[1].version, ">=3.99", packages[1].files)
    tool = selfbundle._write(tmp_path / "new.pyz", packages, notes)
    assert tool.min_python == tool.start_python == (3, 99)
    assert tool.python_text() == "Python 3.99+"
    assert tool.warnings == [f"imgtool.pyz needs Python 3.99+ because of {packages[1].name} {packages[1].version}; "
                             "install imgtool's pinned dependencies (pip install .) for a pyz that runs on Python 3.9"]
    assert not [n for n in tool.notes if n in tool.warnings]
    r = subprocess.run([sys.executable, "-I", str(tool.path), "--version"], capture_output=True, text=True, timeout=60)
    assert (r.returncode, r.stdout) == (1, "")
    assert r.stderr.splitlines() == [
        "error: imgtool.pyz needs Python 3.99 or newer; this is Python %d.%d" % sys.version_info[:2],
        "hint: run it with a newer python3, or load the bundle with: sh load.sh"]


# --- Kylin's own python3: the offline verbs on 3.7 and 3.8 ----------------------------------

OLD_PYTHONS = ("3.7", "3.8")  # Kylin V10 / openEuler 20.03 ship 3.7; Ubuntu 20.04 ships 3.8
# The load tests that run on every runtime (6 of them) take the floor only: 3.8 adds nothing the pyz uses
# there that 3.7 lacks, and the 3.8 runs of the other verbs below stay.
KYLIN_PYTHON = ("3.7",)


def old_python(version):
    """pyenv's python3.X, run isolated (-I): that Python's standard library and nothing else."""
    found = pyenv_python(version)
    assert found, f"python{version} is not under {pyenv_root()}/versions: the Kylin test needs it (never a skip)"
    return [found, "-I"]


def run_clean(python, *args, cwd, docker_host=None, node=None):
    """`env -i`: no site-packages, no proxies, no PYTHON* variables; Docker at docker_host only, or the
    runtime `node` (tests.support.runtimes.Node) as on a host that has only it."""
    given = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": str(cwd), "LANG": "C.UTF-8",
             "IMGTOOL_CACHE": "/nonexistent/imgtool-cache"}
    if docker_host:
        given["DOCKER_HOST"] = docker_host
    if node is not None:
        given.update(node.env)
    env = ["env", "-i"] + [f"{k}={v}" for k, v in given.items()]
    return subprocess.run([*env, *python, *args], capture_output=True, text=True, cwd=cwd, timeout=300)


@pytest.mark.runtimes(proof=True)
@pytest.mark.parametrize("version", KYLIN_PYTHON)
def test_the_pyz_verifies_loads_and_inventories_on_kylins_python(version, services, engine, factory, mirrored,
                                                                  tmp_path, node):
    """On every runtime (containerd and Podman without Docker): the pyz on Python 3.7/3.8 checks, loads
    and inventories as 3.11's imgtool does."""
    python = old_python(version)
    out, image, ref, _ = fetch_from_registry(services, factory, mirrored, tmp_path)
    node.remove_later(ref, *node.ids_of(image))
    assert "python3 imgtool.pyz load .   any python3 3.7+, nothing to install" in (out / "README.txt").read_text()
    assert "任何 python3 3.7+，无需安装" in run_clean(["sh"], "load.sh", "--help", cwd=out).stdout
    ok = run_clean(python, "imgtool.pyz", "verify", ".", cwd=out)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.startswith("ok: .: 1 image(s); ")

    doctor = run_clean(python, "imgtool.pyz", "doctor", ".", cwd=out, node=node)
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    version = engine.split("-")[0 if node.kind == "docker" else 1]  # 26.1-containerd, containerd-1.7, podman-4.3
    assert f"OK    {node.kind:<12} {node.title} {version}." in doctor.stdout
    assert f"OK    arch         linux/{host_arch()}, as the bundle's images" in doctor.stdout.splitlines()

    loaded = run_clean(python, "imgtool.pyz", "load", ".", cwd=out, node=node)
    assert loaded.returncode == 0, loaded.stderr
    assert "loaded 1 image(s) from . in " in loaded.stdout
    assert node.holds(ref, image)

    inv = run_clean(python, "imgtool.pyz", "inventory", "-o", "inventory.json", cwd=out, node=node)
    assert inv.returncode == 0, inv.stderr
    held = json.loads((out / "inventory.json").read_text())
    assert any(ref in i.get("tags", ()) for i in held["images"]), held
    # the same inventory 3.11's imgtool writes (delta bundles are planned from it)
    mine = imgtool("inventory", "-o", str(tmp_path / "inv311.json"), env=node.env)
    assert mine.returncode == 0, mine.stderr
    assert held["images"] == json.loads((tmp_path / "inv311.json").read_text())["images"]
    assert held["daemon"] == json.loads((tmp_path / "inv311.json").read_text())["daemon"]  # image_store too


@pytest.mark.runtimes(stores=True)
@pytest.mark.parametrize("version", KYLIN_PYTHON)
def test_a_damaged_bundle_fails_on_kylins_python_and_loads_nothing(version, services, factory, mirrored, tmp_path,
                                                                     node):
    python = old_python(version)
    out, image, ref, _ = fetch_from_registry(services, factory, mirrored, tmp_path)
    node.remove_later(ref, *node.ids_of(image))
    part = parts_of(out)[-1]
    data = bytearray(part.read_bytes())
    data[len(data) // 2] ^= 1
    part.write_bytes(bytes(data))
    bad = run_clean(python, "imgtool.pyz", "verify", ".", cwd=out)
    assert bad.returncode == 3, bad.stderr
    name = part.name
    damaged = damaged_part_line(out, int(name[-3:]) - 1)
    assert bad.stderr.splitlines()[-2:] == ["error: bundle failed verification: .: 1 problem", damaged]
    before = node.snapshot()
    refused = run_clean(python, "imgtool.pyz", "load", ".", cwd=out, node=node)
    assert refused.returncode == 3, refused.stderr
    assert damaged in refused.stderr.splitlines()
    assert not node.holds(ref, image) and not node.find(image)
    assert node.leftovers(before) == []


def test_run_flags_and_presets_on_kylins_python_print_what_3_11_prints(services, factory, mirrored, tmp_path):
    """Each old Python against one 3.11 run of each command (the pyz and the bundle are the same for all)."""
    out, _, _, _ = fetch_from_registry(services, factory, mirrored, tmp_path)
    dead = f"unix://{tmp_path}/no-docker.sock"  # no local image to ask for: the placeholder tag, as in the golden
    # (--runtime docker: that dead Docker; auto would go on to ask the machine's own Podman, outside the test's reach)
    for args in (("run-flags", "a2", "--runtime", "docker"), ("run-flags", "a3", "--runtime", "docker"),
                 ("run-flags", "a3", "--image", "v0.11.0rc1-a3", "--json", "--runtime", "docker"), ("presets",)):
        new = run_clean([sys.executable, "-I"], "imgtool.pyz", *args, cwd=out, docker_host=dead)
        assert new.returncode == 0, new.stderr
        for version in OLD_PYTHONS:
            old = run_clean(old_python(version), "imgtool.pyz", *args, cwd=out, docker_host=dead)
            assert old.returncode == 0, (version, old.stderr)
            assert (old.stdout, old.stderr) == (new.stdout, new.stderr), version
    assert new.stdout.startswith("--env-preset") or "a2" in new.stdout


def test_kubernetes_manifests_from_the_pyz_on_kylins_python_are_3_11s_bytes(tmp_path):
    """run-flags --format k8s writes its YAML without a library: the same bytes on 3.7/3.8 as on 3.11,
    from a bundle's digest too."""
    from tests.test_presets_k8s import make_bundle, validate

    assert imgtool("self-bundle", "-o", str(tmp_path / "imgtool.pyz"), "-q").returncode == 0
    bundle, _ = make_bundle(tmp_path, [("v0.11.0rc1", "arm64", 1), ("v0.11.0rc1-310p", "amd64", 2)])
    dead = f"unix://{tmp_path}/no-docker.sock"
    for args in (("a2",), ("300i-duo", "--kind", "deployment", "--image", "v0.11.0rc1-310p"),
                 ("a5", "--resource-name", "huawei.com/ascend-1980", "-e", "A=é \u2028 yes", "--", "bash", "-c", "x: y"),
                 ("a2", "--bundle", str(bundle), "--", "vllm", "serve", "Qwen/Qwen3-8B"),
                 ("a2", "--bundle", str(bundle), "--json")):
        new = run_clean([sys.executable, "-I"], "imgtool.pyz", "run-flags", "--format", "k8s", "--runtime", "docker", *args,
                        cwd=tmp_path, docker_host=dead)
        assert new.returncode == 0, new.stderr
        validate(new.stdout)
        for version in OLD_PYTHONS:
            old = run_clean(old_python(version), "imgtool.pyz", "run-flags", "--format", "k8s", "--runtime", "docker",
                            *args, cwd=tmp_path, docker_host=dead)
            assert old.returncode == 0, (version, old.stderr)
            assert (old.stdout, old.stderr) == (new.stdout, new.stderr), version


@pytest.mark.parametrize("version", OLD_PYTHONS)
def test_connected_verbs_on_kylins_python_say_they_need_3_9(version, tmp_path):
    python = old_python(version)
    pyz = tmp_path / "imgtool.pyz"
    assert imgtool("self-bundle", "-o", str(pyz), "-q").returncode == 0
    for verb in ("fetch", "lock", "tags", "inspect", "mirrors", "export", "self-bundle"):
        r = run_clean(python, "imgtool.pyz", verb, "x", cwd=tmp_path)
        assert r.returncode == 2, (verb, r.stderr)
        assert r.stderr.splitlines() == [
            f"error: imgtool {verb} needs Python 3.9 or newer; this is Python {version}",
            "hint: run it on a host with python3 3.9+; here imgtool can verify, load, copy (from a bundle), doctor, inventory, presets, "
            "run-flags, run, diff, push, serve, sign, self-install, self-update"]


def test_a_python_older_than_3_7_is_told_what_to_do(tmp_path):
    python = old_python("3.6")  # CentOS 7: no dataclasses; load.sh is the way there
    pyz = tmp_path / "imgtool.pyz"
    assert imgtool("self-bundle", "-o", str(pyz), "-q").returncode == 0
    r = run_clean(python, "imgtool.pyz", "verify", ".", cwd=tmp_path)
    assert r.returncode == 1
    assert r.stderr.splitlines() == ["error: imgtool.pyz needs Python 3.7 or newer; this is Python 3.6",
                                     "hint: run it with a newer python3, or load the bundle with: sh load.sh"]


@pytest.mark.parametrize("version", OLD_PYTHONS)
def test_run_on_kylins_python_streams_output_and_exits_with_the_containers_code(version, services, docker_cli,
                                                                               docker_cleanup, uniq, tmp_path):
    import io
    import tarfile

    from tests.support.images import static_busybox

    python = old_python(version)
    rootfs = tmp_path / "rootfs.tar"
    busybox = static_busybox()
    with tarfile.open(rootfs, "w") as tar:
        binary = tarfile.TarInfo("bin/busybox")
        binary.size, binary.mode = len(busybox), 0o755
        tar.addfile(binary, io.BytesIO(busybox))
        link = tarfile.TarInfo("bin/sh")
        link.type, link.linkname = tarfile.SYMTYPE, "busybox"
        tar.addfile(link)
    ref = f"imgtool-test/kylin-busybox:{uniq}"
    docker_cli("import", "--change", "ENV PATH=/bin", str(rootfs), ref)
    docker_cleanup.image(ref)
    pyz = tmp_path / "imgtool.pyz"
    assert imgtool("self-bundle", "-o", str(pyz), "-q").returncode == 0
    r = run_clean(python, "imgtool.pyz", "run", "a3", ref, "--allow-missing-devices", "-q", "--net",
                  services.docker_network, "--name", f"imgtool-{uniq}", "--",
                  "sh", "-c", "echo out; echo err >&2; exit 7", cwd=tmp_path, docker_host=services.docker_host)
    assert (r.returncode, r.stdout, r.stderr) == (7, "out\n", "err\n")
    assert docker_cli("ps", "-a", "-q", "--filter", f"name=^imgtool-{uniq}$").stdout.strip() == ""  # --rm
