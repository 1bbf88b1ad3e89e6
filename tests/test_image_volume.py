"""Issue 49's proof: a model's modelcar image mounted as a Kubernetes image volume, read by a Pod's container.

On containerd 2.1 through the CRI, as the kubelet does it, with no kubelet, CNI or network: the Pod spec is what
`imgtool run-flags --format k8s --k8s-version 1.35 --model` prints (validated against the 1.35 schema); the
modelcar (tests/support/modelcars.py, until `imgtool load` imports it) and a pause image built from local files
are imported into k8s.io first (nothing can be pulled: the config's pinned_images names the pause image,
scripts/services.sh); the kubelet finds the volume's image present (IfNotPresent: ImageStatus, no pull), runs the
Pod sandbox on the node's network, and creates the container with a Mount whose `image` is the image's ID, at the
spec's mountPath. The container reads every file, and each sha256 is the hub's (what bundle.json records).

On Podman (5.8 and 4.3): `podman run --mount type=image,...` as `imgtool run --model` runs it once `load --models image`
imported the image: tests/test_podman_run.py test_run_model_mounts_its_modelcar_image_where_the_container_reads_every_file.
"""

import os


from tests.support.cri import CriMount, ImageService, RuntimeService
from tests.support.images import write_docker_archive
from tests.support.modelcars import modelcar_name, write_modelcar
from tests.support.models import small_model
from tests.support.runtimes import ContainerdNode
from tests.test_placed import REPO, place_hf
from tests.test_presets import imgtool
from tests.test_presets_k8s import validate

PAUSE_IMAGE = "imgtool.local/pause:1"  # scripts/services.sh: the CRI's pinned sandbox image on containerd 2.x
SHELL_IMAGE = "imgtool.local/shell:1"


def _model_pod(tmp_path, model, version):
    place_hf(model, tmp_path / "hf")
    home = tmp_path / "home"
    home.mkdir()
    r = imgtool("run-flags", "a2", "--format", "k8s", "--image", "v0.11.0rc1", "--model", REPO, "--k8s-version",
                version, home=home, extra_env={"HF_HUB_CACHE": str(tmp_path / "hf"),
                                               "MODELSCOPE_CACHE": str(tmp_path / "ms")})
    assert r.returncode == 0, r.stderr
    return validate(r.stdout, (version,))["spec"]


def _import(node, image, name, tmp_path):
    path = tmp_path / (name.replace("/", "_").replace(":", "_") + ".tar")
    write_docker_archive(image, path, name, uncompressed=True)
    node.ctr("images", "import", str(path))


def test_a_pod_reads_every_file_of_its_modelcar_image_volume_through_the_cri(services, factory, tmp_path):
    model = small_model(seed=49)
    spec = _model_pod(tmp_path, model, "1.35")
    volume = next(v for v in spec["volumes"] if "image" in v)
    mount = next(m for m in spec["containers"][0]["volumeMounts"] if m["name"] == volume["name"])
    reference = volume["image"]["reference"]
    assert reference == modelcar_name("hf", REPO, model.head.commit)
    assert "subPath" not in mount  # 1.35: containerd 2.1 mounts the image's root and ignores a subPath
    served = spec["containers"][0]["args"][2]

    node = ContainerdNode("containerd-2.1", services)
    images, runtime = ImageService(node.socket), RuntimeService(node.socket)
    sandbox = None
    try:
        shell = factory.image(layers=0, runnable=True, config={"Cmd": ["/bin/sleep", "3600"]})
        for name in (PAUSE_IMAGE, SHELL_IMAGE):
            _import(node, shell, name, tmp_path)
        node.ctr("images", "import", str(write_modelcar(model.head, "hf", REPO, tmp_path / "modelcar.tar")))
        node.remove_later(PAUSE_IMAGE, SHELL_IMAGE, reference)
        # the kubelet, pullPolicy IfNotPresent: the image is there, so no pull; the volume names its ID
        status = images.status(reference)
        assert status is not None and status.repo_tags == [reference]
        config = RuntimeService.sandbox_config("model-pod", os.urandom(8).hex())
        sandbox = runtime.run_pod_sandbox(config)
        cid = runtime.create_container(sandbox, config, "vllm", images.status(SHELL_IMAGE).id, ["/bin/sleep", "3600"],
                                       [CriMount(mount["mountPath"], image=status.id, readonly=mount["readOnly"])])
        runtime.start_container(cid)
        paths = sorted(model.head.files)
        code, out = runtime.exec_sync(cid, ["/bin/busybox", "sha256sum"] + [f"{served}/{p}" for p in paths])
        assert code == 0, out
        sums = {line.split()[1][len(served) + 1:]: line.split()[0] for line in out.decode().splitlines()}
        assert sums == {p: f.sha256 for p, f in model.head.files.items()}
        # read-only, as every image volume is
        code, _ = runtime.exec_sync(cid, ["/bin/busybox", "touch", f"{served}/x"])
        assert code != 0
    finally:
        if sandbox is not None:
            runtime.remove_pod_sandbox(sandbox)
        runtime.close()
        images.close()
        assert node.cleanup() == []
