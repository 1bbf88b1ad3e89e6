"""What `pip install .` ships: every package and every data file the code reads beside itself."""

import shutil
from pathlib import Path

from imgtool.config import read_toml

ROOT = Path(__file__).resolve().parents[1]


def test_every_package_and_data_file_is_in_pyproject():
    data, _ = read_toml(ROOT / "pyproject.toml")
    listed = set(data["tool"]["setuptools"]["packages"])
    package_data = data["tool"]["setuptools"]["package-data"]
    pkg_dirs = sorted(p.parent for p in (ROOT / "imgtool").rglob("__init__.py") if "__pycache__" not in p.parts)
    for d in pkg_dirs:
        name = ".".join(d.relative_to(ROOT).parts)
        assert name in listed, f"{name} is missing from [tool.setuptools] packages"
        shipped = set(package_data.get(name, ()))
        for f in sorted(f for f in d.iterdir() if f.is_file() and f.suffix not in (".py", ".pyc")):
            assert f.name in shipped, f"{name}/{f.name} is missing from [tool.setuptools.package-data]"


_NOT_SOURCES = shutil.ignore_patterns(".venv*", ".git", "*.egg-info", "build", "__pycache__", ".pytest_cache", ".hypothesis")


def _the_tree_alone(directory, names):
    """copytree's ignore: what is not source, and any symlink that leads out of the tree (a developer's venv)."""
    ignored = set(_NOT_SOURCES(directory, names))
    for name in names:
        path = Path(directory) / name
        if path.is_symlink() and ROOT not in path.resolve().parents:
            ignored.add(name)
    return ignored


def test_non_editable_install_into_a_fresh_venv(tmp_path):
    """`pip install .` (not editable) gives a working `imgtool` with its data files."""
    import subprocess
    import sys

    src = tmp_path / "src"
    shutil.copytree(ROOT, src, symlinks=True, ignore=_the_tree_alone)
    venv = tmp_path / "venv"
    # exactly what a user does: a fresh venv, `pip install .` with its dependencies from the index
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = subprocess.run([str(venv / "bin/python"), "-m", "pip", "install", "-q", str(src)],
                         capture_output=True, text=True, timeout=600)
    assert pip.returncode == 0, pip.stderr
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path)}
    exe = str(venv / "bin/imgtool")
    where = subprocess.run([str(venv / "bin/python"), "-c", "import imgtool; print(imgtool.__file__)"],
                           capture_output=True, text=True, env=env, cwd=tmp_path)
    assert str(venv) in where.stdout  # the installed copy, not the checkout
    # isal comes with it: gzip through ISA-L (gz.py falls back to zlib only where it is missing, as in the pyz)
    isal = subprocess.run([str(venv / "bin/python"), "-c", "from imgtool import gz; print(gz.compressor())"],
                          capture_output=True, text=True, env=env, cwd=tmp_path)
    assert isal.stdout.strip() == "isal level 2", isal.stderr
    helptext = subprocess.run([exe, "--help"], capture_output=True, text=True, env=env, cwd=tmp_path).stdout
    for verb in ("fetch", "verify", "load", "inspect", "mirrors", "export", "push", "inventory", "presets",
                 "run-flags", "run", "doctor", "tags", "lock", "diff", "self-bundle"):
        assert f"\n  {verb} " in helptext, verb
    version = subprocess.run([exe, "--version"], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert version.stdout.strip().startswith("imgtool ")
    presets = subprocess.run([exe, "presets"], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert presets.returncode == 0 and "a3" in presets.stdout  # presets.toml shipped
    bad = tmp_path / "bad.toml"
    bad.write_text("default_image = [\n")
    r = subprocess.run([exe, "mirrors", "--mirrors", str(bad)], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and r.stderr.startswith(f"error: {bad}: invalid TOML")
    builtin = subprocess.run([str(venv / "bin/python"), "-c", "from imgtool.config import load_mirrors; print(load_mirrors().path)"],
                             capture_output=True, text=True, env=env, cwd=tmp_path)
    assert str(venv) in builtin.stdout  # mirrors.toml shipped in the package
    shell = subprocess.run([str(venv / "bin/python"), "-c", "from imgtool.bundle import loadsh; print(loadsh.template())"],
                           capture_output=True, text=True, env=env, cwd=tmp_path)
    assert shell.stdout.startswith("#!/bin/sh\n"), shell.stderr  # load.sh's text shipped in the package
