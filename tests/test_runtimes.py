"""Nodes without Docker: `imgtool load` into containerd (a Kubernetes node) and Podman, as into Docker.

Against the private containerd 1.6 and 1.7 (CRI plugin on, as on a node) and Podman 4.3 of
scripts/services.sh. The tests shared with Docker (load, damage, reload, delta, multi-arch, the pyz on
Python 3.7, signatures) are marked @pytest.mark.runtimes where they live; here is what only these
runtimes have: the kubelet's namespace and label, the snapshotter, containerd's namespaces.
"""

import json
import os
import shutil
import subprocess

import pytest

from imgtool.delta import chain_ids
from imgtool.model import Digest, format_size
from tests.support.bundles import BlobDir, imgtool, write
from tests.support.images import host_arch
from tests.support.runtimes import PROOF_RUNTIMES, RUNTIMES

REPO = "quay.io/ascend/vllm-ascend"


@pytest.fixture
def runnable(factory, tmp_path):
    """A bundle of a runnable host-arch image (`echo` works in it), archive compressed as asked."""
    def make(compress="none"):
        image = factory.image(host_arch(), layers=2, runnable=True)
        store = BlobDir(tmp_path / f"blobs-{compress}")
        out = tmp_path / f"bundle-{compress}"
        write(out, [store.pulled(image, f"{REPO}:v1")], store, chunk_size=300 * 1024, compress=compress)
        return out, image
    return make


@pytest.mark.parametrize("engine", ["containerd-1.6", "containerd-1.7"], indirect=True)
def test_a_kubernetes_node_gets_the_image_where_the_kubelet_finds_it(runnable, node):
    """Docker's socket absent: load --runtime auto picks containerd, imports into k8s.io, names the image with
    its canonical reference and, as a pull by the CRI plugin does, by the registry's manifest digest (for Pods
    pinned by digest), beside the CRI plugin's own sha256:<config> ref: no import-DATE refs; the CRI plugin
    marks it managed, imgtool pins it, its layers are unpacked into the snapshotter, and a container runs."""
    out, image = runnable()
    node.remove_later(f"{REPO}:v1", node.bundle_id(image))
    r = imgtool("load", str(out), "--json", env=node.env)
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout)
    assert result["runtime"] == "containerd" and result["daemon"]["namespace"] == "k8s.io"
    assert "loading into containerd" in r.stderr
    refs = {row[0]: row for row in node.refs() if row[2] == node.bundle_id(image)}
    assert sorted(refs) == sorted([f"{REPO}:v1", f"{REPO}@{image.manifest_digest}", image.config_digest])
    again = imgtool("load", str(out), env=node.env)  # nothing sent; the names stay as they are
    assert again.returncode == 0 and sorted(r[0] for r in node.refs() if r[2] == node.bundle_id(image)) == sorted(refs)
    assert node.labels(f"{REPO}:v1") == "io.cri-containerd.image=managed,io.cri-containerd.pinned=pinned"
    assert node.ctr("leases", "ls", "-q").stdout.split() == []  # imgtool's unpack lease went with the unpack
    top = str(chain_ids(tuple(Digest.parse(d) for d in image.diff_ids))[-1])
    assert top in node.snapshot().items["snapshot"]  # unpacked: the whole chain is a committed snapshot
    assert node.run(f"{REPO}:v1", "echo", "ran-on-a-node").strip() == "ran-on-a-node"


def test_containerd_namespace_from_the_option_or_the_variable_as_ctr_reads_it(runnable, services):
    """--namespace, else $CONTAINERD_NAMESPACE, else k8s.io: the image lands there and nowhere else."""
    sock = services.containerd("1.7")
    out, image = runnable()

    def ctr(ns, *args):
        return subprocess.run(["ctr", "--address", sock, "-n", ns, *args], capture_output=True, text=True,
                              timeout=120, check=True).stdout

    try:
        r = imgtool("load", str(out), "--runtime", "containerd", "--address", sock, "--namespace", "imgtool-a")
        assert r.returncode == 0, r.stderr
        assert r.stdout.splitlines()[-1].endswith(", namespace imgtool-a)")
        r = imgtool("load", str(out), "--runtime", "containerd",
                    env={"CONTAINERD_ADDRESS": sock, "CONTAINERD_NAMESPACE": "imgtool-b"})
        assert r.returncode == 0, r.stderr
        names = [f"{REPO}:v1", f"{REPO}@{image.manifest_digest}"]  # no CRI plugin there: no sha256:<config>
        assert sorted(ctr("imgtool-a", "images", "ls", "-q").split()) == sorted(names)
        assert sorted(ctr("imgtool-b", "images", "ls", "-q").split()) == sorted(names)
        assert f"{REPO}:v1" not in ctr("k8s.io", "images", "ls", "-q").split()
    finally:
        for ns in ("imgtool-a", "imgtool-b"):
            subprocess.run(["ctr", "--address", sock, "-n", ns, "images", "rm", "--sync", f"{REPO}:v1",
                            f"{REPO}@{image.manifest_digest}"], capture_output=True, timeout=120)


@pytest.mark.parametrize("engine", RUNTIMES + PROOF_RUNTIMES, indirect=True)  # the Docker engines: tests/test_bundle.py
@pytest.mark.parametrize("compress", ["gzip", "zstd"])
def test_a_compressed_bundle_loads_and_its_container_runs(compress, runnable, node):
    out, image = runnable(compress)
    node.remove_later(f"{REPO}:v1", *node.ids_of(image))
    r = imgtool("load", str(out), env=node.env)
    assert r.returncode == 0, r.stderr
    assert node.holds(f"{REPO}:v1", image)
    assert node.run(f"{REPO}:v1", "echo", f"ran-on-{node.kind}").strip() == f"ran-on-{node.kind}"


@pytest.mark.parametrize("engine", ["podman-4.3"], indirect=True)
def test_podman_s_copy_of_the_archive_needs_room_where_it_is_staged(runnable, node, tiny_tmpfs):
    """imgtool writes the checked archive where podman load would copy a piped one ($TMPDIR, else /var/tmp):
    a staging dir too small for it is named by doctor and refused by load before anything is written."""
    out, image = runnable()
    env = dict(node.env, TMPDIR=str(tiny_tmpfs))
    size = json.loads((out / "bundle.json").read_text())["archive"]["tar_size"]
    doctor = imgtool("doctor", str(out), "--runtime", "podman", env=env)
    assert doctor.returncode == 1, doctor.stdout
    space = [line for line in doctor.stdout.splitlines() if line.startswith("FAIL  space")]
    assert len(space) == 1 and space[0].startswith(
        f"FAIL  space        not enough space for Podman's copy of the archive in {tiny_tmpfs}: it needs ")
    before = node.snapshot()
    r = imgtool("load", str(out), env=env)
    assert r.returncode == 1, r.stderr
    assert r.stderr.splitlines()[0].startswith(f"error: not enough space for Podman's copy of the archive in {tiny_tmpfs}")
    assert node.leftovers(before) == [] and list(tiny_tmpfs.iterdir()) == []
    assert size > 1024 * 1024  # the archive is bigger than the 1 MiB tmpfs: the check is what refused it
    forced = imgtool("load", str(out), "--force", env=env)  # tried anyway: the disk fills, nothing is left
    assert forced.returncode == 5, forced.stderr
    assert forced.stderr.splitlines()[-2:] == [
        f"error: cannot stage the archive for podman load in {tiny_tmpfs}: No space left on device",
        "hint: podman load needs the archive's size free there; set TMPDIR to another directory"]
    assert node.leftovers(before) == [] and list(tiny_tmpfs.iterdir()) == []


@pytest.mark.parametrize("engine", ["podman-4.3"], indirect=True)
def test_podman_without_a_record_of_the_layers_it_applied_is_a_runtime_error(runnable, node, services, monkeypatch,
                                                                            tmp_path):
    """The applied-diff_id check finds no record in Podman's storage (a fault put in front of the real room):
    the image is removed and the error names Podman, not the bundle (which is fine), exit 5."""
    from imgtool.load import load_bundle
    from imgtool.errors import DaemonError
    from imgtool.runtimes.podman import Podman
    from imgtool.progress import Progress

    class Forgetful(Podman):
        def applied_diff_ids(self, image_id):
            return None

    out, image = runnable()
    for key, value in node.env.items():
        monkeypatch.setenv(key, value)
    before = node.snapshot()
    room = Forgetful(staging_dir=str(tmp_path))
    with pytest.raises(DaemonError) as e:
        load_bundle(out, room, progress=Progress())
    assert (e.value.message, e.value.hint, e.value.exit_code) == (
        f"Podman loaded {REPO}:v1 but keeps no record of the layers it applied (image {image.config_digest[7:19]}), "
        "so imgtool cannot confirm them; it was removed again",
        f"check Podman's storage ({room.info().root_dir}), then load again", 5)
    assert node.leftovers(before) == []


@pytest.mark.parametrize("engine", ["podman-4.3"], indirect=True)
def test_each_runtime_is_told_its_own_way_to_free_space(runnable, node, tiny_tmpfs, tmp_path):
    """Issue 35 case 10: containerd and Podman were told `docker image prune`. Podman's storage on a 1 MiB tmpfs
    (a storage.conf of its own): load refuses with Podman's own advice; containerd's words from the same check."""
    from imgtool.bundle.hostcheck import space_check
    from imgtool.bundle.reader import read_index
    from imgtool.runtimes.containerd import TRAITS as CONTAINERD
    from imgtool.runtimes.base import RuntimeInfo

    out, _ = runnable()
    conf = tmp_path / "storage.conf"
    conf.write_text(f'[storage]\ndriver = "overlay"\ngraphroot = "{tiny_tmpfs}/storage"\nrunroot = "{tmp_path}/run"\n')
    r = imgtool("load", str(out), env=dict(node.env, CONTAINERS_STORAGE_CONF=str(conf)))
    assert r.returncode == 1, r.stderr
    lines = [x for x in r.stderr.splitlines() if x.startswith(("error:", "hint:"))]
    assert lines[0].startswith(f"error: not enough space for Podman under {tiny_tmpfs}/storage: the bundle needs about ")
    assert lines[1] == ("hint: free space there (podman image prune, podman system df), or move Podman's graphroot "
                        "(storage.conf); or pass --force to try anyway")
    index, _ = read_index(out)
    containerd = RuntimeInfo("/run/containerd/containerd.sock", "1.7.24", "", "overlayfs", str(tiny_tmpfs), "amd64",
                             "linux", True, CONTAINERD, image_store="containerd", runtime="containerd",
                             namespace="k8s.io")
    check = space_check(containerd, index)
    assert (check.status, check.advice) == ("fail", "free space there (ctr -n k8s.io images prune --all; on a "
                                            "Kubernetes node crictl rmi --prune), or move containerd's root (root in "
                                            "/etc/containerd/config.toml)")


@pytest.mark.parametrize("engine", ["podman-4.3"], indirect=True)
def test_podman_is_asked_for_the_space_it_really_needs(node, factory, mirrored, services, tmp_path):
    """Issue 35 case 10: the 2.5x unpacked estimate refused a Podman load that fit. Measured with this Podman
    (docs/runtimes.md): its graphroot takes what the layers unpack to, its staging dir 3x the archive at the peak.
    fetch now records each layer's unpacked size (its diff_id check unpacks them anyway): incompressible layers
    (8 MiB unpacking to 8 MiB; the estimate said 20 MiB) load into a graphroot of 14 MiB; a staging dir of twice
    the archive is refused up front for Podman's copies (it was let through, for Podman to run out of space)."""
    from tests.support.bundles import random_layer

    def fetched(name, seeds):
        image = factory.image(host_arch(), layers=[random_layer(4 << 20, n) for n in seeds])
        ms = mirrored(image, tag=name, targets=("upstream",))
        cfg = tmp_path / f"{name}.toml"
        cfg.write_text(f'default_image = "quay.io/{ms.repo}"\n[[mirrors]]\nname = "quay"\nregistry = "quay.io"\n'
                       f'url = "http://{services.plain}"\nupstream = true\ninsecure = true\n')
        r = imgtool("fetch", name, "--arch", host_arch(), "--mirrors", str(cfg), "-o", str(tmp_path / name),
                    "--no-tool", "-q", env={"IMGTOOL_CACHE": str(tmp_path / "cache")})
        assert r.returncode == 0, r.stderr
        doc = json.loads((tmp_path / name / "bundle.json").read_text())
        return image, doc

    image, doc = fetched("v1", (1, 2))
    tar = doc["archive"]["tar_size"]
    mounts = {"graph": 14 << 20, "stage": 2 * tar + (1 << 20)}
    for name, size in mounts.items():
        (tmp_path / name).mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(tmp_path / name)], check=True)
    try:
        conf = tmp_path / "storage.conf"
        conf.write_text(f'[storage]\ndriver = "overlay"\ngraphroot = "{tmp_path}/graph/storage"\n'
                        f'runroot = "{tmp_path}/run"\n')
        env = dict(node.env, CONTAINERS_STORAGE_CONF=str(conf))
        r = imgtool("load", str(tmp_path / "v1"), env=env)
        assert r.returncode == 0, r.stderr
        held = subprocess.run(["podman", "images", "-q", "--no-trunc"], env=dict(node.services.podman_env(version=node.version), **env),
                              capture_output=True, text=True, timeout=120, check=True).stdout.split()
        assert held == [image.config_digest]
        assert [x["unpacked_size"] for x in doc["images"][0]["layers"]] == [x.uncompressed_size for x in image.layers]
        _, doc = fetched("v2", (3, 4))
        tar = doc["archive"]["tar_size"]
        refused = imgtool("load", str(tmp_path / "v2"), env=dict(env, TMPDIR=str(tmp_path / "stage")))
        assert refused.returncode == 1, refused.stderr
        assert [x for x in refused.stderr.splitlines() if x.startswith("error:")][0].startswith(
            f"error: not enough space for Podman's copy of the archive in {tmp_path}/stage: it needs "
            f"{format_size(3 * tar)} (the copy of the archive Podman loads from and the two Podman makes of its layers)")
    finally:
        for name in mounts:
            subprocess.run(["umount", "-l", str(tmp_path / name)], check=False)


@pytest.mark.parametrize("engine", ["podman-4.3"], indirect=True)
def test_the_archive_copies_of_killed_loads_are_removed_by_the_next_load(runnable, node, tmp_path):
    """Issue 36 item 7: imgtool killed while staging for Podman left $TMPDIR/imgtool-load-*.tar (archive-sized:
    15 GB at the real size) forever. The next load removes the copies whose imgtool is gone, before it counts
    the space, and says so; a copy of a load still running, and any file not of that name, stay."""
    out, image = runnable()
    stage = tmp_path / "stage"
    stage.mkdir()
    gone = subprocess.run(["sh", "-c", "echo $$"], capture_output=True, text=True).stdout.strip()  # a pid now free
    stale = stage / f"imgtool-load-{gone}-k1ll3d.tar"
    stale.write_bytes(b"\0" * 3 * 1024 * 1024)
    running = stage / f"imgtool-load-{os.getpid()}-st1ll.tar"  # this test's own pid: a load still running
    running.write_bytes(b"\0" * 1024)
    other = stage / "imgtool-load-notes.tar"
    other.write_bytes(b"\0")
    node.remove_later(f"{REPO}:v1", *node.ids_of(image))
    r = imgtool("load", str(out), env=dict(node.env, TMPDIR=str(stage)))
    assert r.returncode == 0, r.stderr
    assert (f"warning: removed {stale} (3.0 MiB), the archive copy of an imgtool load that was cut short "
            f"(pid {gone})") in r.stderr.splitlines()
    assert sorted(p.name for p in stage.iterdir()) == sorted([running.name, other.name])
    assert node.holds(f"{REPO}:v1", image)


@pytest.mark.parametrize("engine", ["podman-4.3"], indirect=True)
def test_podman_killed_by_a_signal_is_said_to_be_killed(runnable, node, tmp_path):
    """Issue 36 item 7: podman killed by a signal during `podman load` was reported by its last progress line
    ("Copying blob ..."), as if that were the reason. A fault in front of the real podman: `load` prints
    progress, then the process is killed; every other command is the real one."""
    out, image = runnable()
    real = shutil.which("podman", path=node.env.get("PATH"))
    assert real, node.env
    faulty = tmp_path / "faulty-bin"
    faulty.mkdir()
    (faulty / "podman").write_text(f'#!/bin/sh\nif [ "$1" = load ]; then echo "Copying blob 0123abcd done"; '
                                   f'kill -KILL $$; fi\nexec {real} "$@"\n')
    (faulty / "podman").chmod(0o755)
    before = node.snapshot()
    env = dict(node.env, PATH=f"{faulty}:{node.env['PATH']}", TMPDIR=str(tmp_path))
    r = imgtool("load", str(out), env=env)
    assert r.returncode == 5, r.stderr
    assert r.stderr.splitlines()[-1] == "error: Podman: `podman load` failed: killed by SIGKILL", r.stderr
    assert "Copying blob" not in r.stderr
    assert node.leftovers(before) == [] and not list(tmp_path.glob("imgtool-load-*"))


@pytest.mark.parametrize("engine", ["podman-4.3"], indirect=True)
def test_a_space_refusal_names_the_copies_of_loads_still_running(runnable, node, tiny_tmpfs):
    """Issue 36 item 7: the next load's space refusal named only the free bytes. What a load still running holds
    there is named (a killed one's copy is removed first, and said)."""
    out, image = runnable()
    gone = subprocess.run(["sh", "-c", "echo $$"], capture_output=True, text=True).stdout.strip()
    stale = tiny_tmpfs / f"imgtool-load-{gone}-k1ll3d.tar"
    stale.write_bytes(b"\0" * 256 * 1024)
    live = tiny_tmpfs / f"imgtool-load-{os.getpid()}-st1ll.tar"  # this test's own pid: a load still running
    live.write_bytes(b"\0" * 256 * 1024)
    before = node.snapshot()
    r = imgtool("load", str(out), env=dict(node.env, TMPDIR=str(tiny_tmpfs)))
    assert r.returncode == 1, r.stderr
    lines = r.stderr.splitlines()
    assert (f"warning: removed {stale} ({format_size(256 * 1024)}), the archive copy of an imgtool load that was cut "
            f"short (pid {gone})") in lines
    error = [line for line in lines if line.startswith("error: ")]
    assert len(error) == 1 and error[0].startswith(f"error: not enough space for Podman's copy of the archive in {tiny_tmpfs}: ")
    assert error[0].endswith(f" is free; imgtool loads still running hold {format_size(256 * 1024)} of it: "
                             f"{live} ({format_size(256 * 1024)})"), error[0]
    assert sorted(tiny_tmpfs.iterdir()) == [live] and node.leftovers(before) == []


@pytest.mark.parametrize("room, version, floor", [("containerd", "1.4.13", "1.5"), ("podman", "2.2.1", "3.0"),
                                                  ("docker", "20.10.24", "23.0")])
def test_each_runtime_is_held_to_its_own_zstd_floor(factory, tmp_path, room, version, floor):
    """Issue 37: the zstd refusal said "Docker {version} ... needs Docker 23.0" for every runtime. Each room's traits
    give its own name and floor (containerd 1.5, Podman 3.0); at the floor the bundle passes."""
    import importlib

    from imgtool.bundle.hostcheck import zstd_check
    from imgtool.bundle.reader import read_index
    from imgtool.runtimes.base import RuntimeInfo

    traits = importlib.import_module(f"imgtool.runtimes.{room}").TRAITS
    image = factory.zstd_twin(factory.image(host_arch(), layers=2))
    store = BlobDir(tmp_path / "blobs")
    write(tmp_path / "z", [store.pulled(image, f"{REPO}:zl")], store)
    index, _ = read_index(tmp_path / "z")
    old = RuntimeInfo("here", version, "", "overlay", str(tmp_path), host_arch(), "linux", True, traits, runtime=room)
    check = zstd_check(index, old)
    title = traits.title
    symptom = " (older ones fail with `invalid tar header`, vllm-ascend FAQ 19)" if room == "docker" else ""
    assert (check.name, check.status, check.detail, check.advice) == (
        room, "fail", f"{title} {version} cannot read zstd-compressed layers ({REPO}:zl): that needs {title} {floor} or "
        f"later{symptom}", f"upgrade {title} to {floor} or later, or fetch the image again with imgtool fetch --layers "
        "compat (the default), which rewrites zstd layers as gzip: this bundle kept the registry's zstd bytes")
    assert zstd_check(index, RuntimeInfo("here", floor + ".0", "", "overlay", str(tmp_path), host_arch(), "linux", True,
                                         traits, runtime=room)) is None
