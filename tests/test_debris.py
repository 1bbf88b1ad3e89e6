"""What a load cut short leaves in Podman is imgtool's, found and removed (issue 46 item 5), with the real Podman 4.3.

`podman load` killed midway left its own temporaries (the archive unpacked into an oci* directory, layers staged in a
storage* one: 108 MB for a 74 MB image) in /var/tmp, which nothing counted or removed. Podman now runs with a
directory of the load's own as its TMPDIR, beside imgtool's copy of the archive: removed by the load, else named by
doctor and removed by the next load. The containerd cases (a killed containerd) are in tests/test_kubelet.py.
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import List

import pytest

from imgtool.model import format_size
from tests.support.bundles import BlobDir, write
from tests.support.images import host_arch

REPO = "quay.io/ascend/vllm-ascend"


def _podman_wrote(stage: Path) -> bool:
    """Podman has written a layer's worth of its own temporaries under `stage` (not imgtool's copy of the archive)."""
    for root, _, files in os.walk(stage):
        for name in files:
            path = os.path.join(root, name)
            if name != "archive.tar" and not name.startswith("imgtool-load-"):
                try:
                    if os.path.getsize(path) > 4 << 20:
                        return True
                except OSError:
                    pass
    return False


def _children(pid: int) -> List[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rpartition(")")[2].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                out.append(int(entry))
    return out


def _killed_midway(out: Path, env: dict, stage: Path, imgtool_too: bool) -> subprocess.Popen:
    """`imgtool load` started, and once Podman has written its temporaries, `podman load` (the load's child)
    SIGKILLed, with imgtool before it when `imgtool_too`: the processes this test started, nothing else."""
    load = subprocess.Popen([sys.executable, "-m", "imgtool", "load", str(out)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not _podman_wrote(stage):
        assert load.poll() is None, load.communicate()[1]
        assert time.monotonic() < deadline, "podman never wrote its temporaries"
        time.sleep(0.01)
    podman = [pid for pid in _children(load.pid) if "load" in open(f"/proc/{pid}/cmdline").read()]
    assert len(podman) == 1, podman
    if imgtool_too:
        load.kill()
    os.kill(podman[0], signal.SIGKILL)
    load.communicate(timeout=120)
    return load


@pytest.fixture
def big(factory, tmp_path):
    """A bundle with a layer big enough for podman load to be caught midway."""
    image = factory.image(host_arch(), layers=2, layer_size=[256 * 1024, 48 * 1024 * 1024])
    store = BlobDir(tmp_path / "blobs")
    write(tmp_path / "bundle", [store.pulled(image, f"{REPO}:v1")], store)
    return tmp_path / "bundle", image


@pytest.mark.parametrize("engine", ["podman-4.3"], indirect=True)
def test_podman_killed_midway_leaves_none_of_its_temporaries(big, node, tmp_path):
    """SIGKILL to `podman load` once it has written its temporaries: the load fails (exit 5) and $TMPDIR is as it
    was: Podman's oci* and storage* directories went with the load's own directory (they stayed, before)."""
    out, image = big
    stage = tmp_path / "stage"
    stage.mkdir()
    before = node.snapshot()
    node.remove_later(f"{REPO}:v1", *node.ids_of(image))
    load = _killed_midway(out, dict(node.env, TMPDIR=str(stage)), stage, imgtool_too=False)
    assert load.returncode == 5
    assert sorted(os.listdir(stage)) == []
    assert node.leftovers(before) == []


@pytest.mark.parametrize("engine", ["podman-4.3"], indirect=True)
def test_what_a_killed_load_left_for_podman_is_named_by_doctor_and_removed_by_the_next_load(big, node, tmp_path):
    """imgtool and its `podman load` SIGKILLed midway: the load's directory (the archive copy and Podman's
    temporaries) is all that is left in $TMPDIR; doctor names it with its size and says
    the next load removes it; the next load removes it, says so, and loads the image."""
    out, image = big
    stage = tmp_path / "stage"
    stage.mkdir()
    env = dict(node.env, TMPDIR=str(stage))
    node.remove_later(f"{REPO}:v1", *node.ids_of(image))
    load = _killed_midway(out, env, stage, imgtool_too=True)
    left = sorted(stage.iterdir())
    assert [p.name for p in left] == [f"imgtool-load-{load.pid}-{left[0].name.rsplit('-', 1)[1]}"], left
    size = sum(p.stat().st_size for p in left[0].rglob("*") if p.is_file() and not p.is_symlink())
    assert size > 4 << 20 and any(p.name != "archive.tar" for p in left[0].iterdir())  # Podman's, beside the copy

    doctor = subprocess.run([sys.executable, "-m", "imgtool", "doctor", "--runtime", "podman"], env=env,
                            capture_output=True, text=True, timeout=300)
    lines = doctor.stdout.splitlines()
    said = (f"WARN  podman       {left[0]} ({format_size(size)}), the archive copy and Podman's temporaries of an "
            f"imgtool load that was cut short (pid {load.pid})")
    assert said in lines, doctor.stdout
    assert lines[lines.index(said) + 1] == f"{'':<18}-> the next imgtool load removes it"

    again = subprocess.run([sys.executable, "-m", "imgtool", "load", str(out)], env=env, capture_output=True,
                           text=True, timeout=600)
    assert again.returncode == 0, again.stderr
    assert (f"warning: removed {left[0]} ({format_size(size)}), the archive copy and Podman's temporaries of an "
            f"imgtool load that was cut short (pid {load.pid})") in again.stderr.splitlines()
    assert sorted(os.listdir(stage)) == []
    assert node.holds(f"{REPO}:v1", image)


def test_podman_gets_the_loads_tmpdir_unless_rootless_podman_would_keep_its_run_dirs_there():
    """Root, or rootless with a runtime dir: TMPDIR is the load's own directory. Rootless with no XDG_RUNTIME_DIR and
    no /run/user/<uid> of its own, Podman would put its runtime dir and storage's run root under TMPDIR: left alone."""
    from imgtool.runtimes.podman import _load_env

    assert _load_env({"TMPDIR": "/x", "A": "1"}, "/w", 0) == {"TMPDIR": "/w", "A": "1"}
    assert _load_env({"XDG_RUNTIME_DIR": "/run/user/4242"}, "/w", 4242)["TMPDIR"] == "/w"
    assert not os.path.exists("/run/user/4243")
    assert _load_env({"TMPDIR": "/x"}, "/w", 4243) == {"TMPDIR": "/x"}
