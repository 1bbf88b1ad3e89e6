"""Nodes without Docker: `imgtool load` into containerd (a Kubernetes node) and Podman, as into Docker.

Against the private containerd 1.6 and 1.7 (CRI plugin on, as on a node) and Podman 4.3 of
scripts/services.sh. The tests shared with Docker (load, damage, reload, delta, multi-arch, the pyz on
Python 3.7, signatures) are marked @pytest.mark.runtimes where they live; here is what only these
runtimes have: the kubelet's namespace and label, the snapshotter, containerd's namespaces.
"""

import json
import subprocess

import pytest

from imgtool.delta import chain_ids
from imgtool.model import Digest
from tests.support.bundles import BlobDir, imgtool, write
from tests.support.images import host_arch
from tests.support.runtimes import RUNTIMES

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


@pytest.mark.parametrize("engine", RUNTIMES, indirect=True)  # the Docker engines: tests/test_bundle.py
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
    from imgtool.bundle.load import load_bundle
    from imgtool.errors import DaemonError
    from imgtool.podman import Podman
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
