"""The tracked tree works on any machine: no link or path into the machine it was written on, no half-done merge.

CI runs on the machine the tree was written on, where such a link or path still leads somewhere, so a green
CI does not show these; this test reads `git ls-files` and holds them everywhere.
"""

import os
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Where developers' checkouts, homes and interpreters live, never what the product or its docs name for a
# user (`/root/.cache` is the Ascend model cache the presets mount; `/usr/local/Ascend` the driver).
MACHINE_PATHS = re.compile(r"(?<![\w.~$/-])(/work/|/home/[a-z_][\w-]*/|/Users/\w|/root/\.pyenv|/tmp/pytest-of-)")
CONFLICT_MARKERS = re.compile(r"^(<<<<<<< |\|\|\|\|\|\|\| |>>>>>>> )", re.M)


def _tracked():
    r = subprocess.run(["git", "ls-files", "-s", "-z"], cwd=ROOT, capture_output=True, timeout=60)
    assert r.returncode == 0, f"the tree checks need a git checkout: {r.stderr.decode(errors='replace').strip()}"
    entries = [line.split("\t", 1) for line in r.stdout.decode().split("\0") if line]
    assert entries, "git ls-files listed nothing"
    return [(meta.split()[0], path) for meta, path in entries]


def _texts():
    for mode, path in _tracked():
        if mode == "120000":
            continue
        data = (ROOT / path).read_bytes()
        if b"\0" not in data[:8192]:
            yield path, data.decode("utf-8", errors="replace")


def test_no_tracked_symlink_leaves_the_tree():
    leaving = []
    for mode, path in _tracked():
        if mode != "120000":
            continue
        target = os.readlink(ROOT / path)
        resolved = Path(os.path.normpath(ROOT / Path(path).parent / target))
        if os.path.isabs(target) or ROOT not in resolved.parents:
            leaving.append(f"{path} -> {target}")
    assert leaving == [], "tracked symlinks that lead out of the tree (they work only where they were made)"


def test_no_merge_conflict_markers():
    marked = [f"{path}:{text.count(chr(10), 0, m.start()) + 1}" for path, text in _texts()
              for m in CONFLICT_MARKERS.finditer(text)]
    assert marked == [], "merge-conflict markers left in tracked files"


def test_no_path_of_a_developers_machine():
    own = re.compile(re.escape(str(ROOT)) + r"\b")
    found = [f"{path}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)}" for path, text in _texts()
             if path != "tests/test_tree.py"  # this file names the paths it looks for
             for pattern in (MACHINE_PATHS, own) for m in pattern.finditer(text)]
    assert found == [], "absolute paths of a developer's machine in tracked files"


def test_the_checks_see_what_they_look_for(tmp_path):
    """The patterns find the cases that went unnoticed before (a merge's markers, a venv link's target)."""
    assert CONFLICT_MARKERS.search("| row |\n<<<<<<< HEAD\n| a |\n=======\n>>>>>>> benchimg\n")
    assert not CONFLICT_MARKERS.search("Title\n=======\n")  # a setext heading is not a marker
    assert MACHINE_PATHS.search("lrwx .venv-main -> /work/main/.venv")
    assert MACHINE_PATHS.search('PYENV_VERSIONS = Path("/root/.pyenv/versions")')
    assert not MACHINE_PATHS.search("-v /root/.cache:/root/.cache -v /usr/local/Ascend/driver/lib64/")
    assert not MACHINE_PATHS.search("$(pyenv root)/versions/3.9.*/bin/python3.9 and ~/.cache/imgtool-test")
