"""`imgtool load --models image` (issue 49): each model imported into the runtime as its modelcar image, streamed
from the raw files the bundle stores once, on Docker 20.10, containerd 1.7 and 2.1 (namespace k8s.io, unpacked,
pinned) and Podman 4.3: every file inside the image equals bundle.json's sha256, a second load sends nothing, a
damaged part is refused with placement's words and nothing imported, and inventory lists the image."""

import hashlib
import io
import json
import os
import subprocess
import tarfile
import tempfile

import pytest

from tests.support.bundles import BlobDir, damage_member, imgtool, parts_of, put_model, write
from tests.support.images import host_arch
from tests.support.models import small_model

MODEL = "imgtool-test/tiny-llm"
SHARD2 = "model-00002-of-00002.safetensors"
ENGINES = ["20.10", "containerd-1.7", "containerd-2.1", "podman-4.3"]


def err_lines(r):
    return [line for line in r.stderr.splitlines() if line.startswith(("error:", "hint:", "  - "))]


@pytest.fixture
def model():
    return small_model(seed=4901)


@pytest.fixture
def car_bundle(tmp_path, model):
    """A bundle of one model (with its modelcar digests) and no image, in several parts."""
    store = BlobDir(tmp_path / "blobs")
    out = tmp_path / "car-bundle"
    write(out, [], store, models=[put_model(store, model, modelcar=True)], chunk_size=24 << 10)
    assert len(parts_of(out)) >= 3
    return out


def car_name(model) -> str:
    return f"models.local/hf/{MODEL}:{model.head.commit}-modelcar"


def files_in_image(node, ref: str) -> dict:
    """/models/PATH -> (sha256, mode) of every regular file in the image, read with the runtime's own tools."""
    if node.kind == "containerd":
        where = tempfile.mkdtemp(prefix="imgtool-test-mount-")
        node.ctr("images", "mount", "--platform", f"linux/{host_arch()}", ref, where)
        try:
            out = {}
            for here, _, names in os.walk(where):
                for name in names:
                    p = os.path.join(here, name)
                    with open(p, "rb") as f:
                        out["/" + os.path.relpath(p, where)] = (hashlib.sha256(f.read()).hexdigest(),
                                                                oct(os.stat(p).st_mode & 0o777))
            return out
        finally:
            node.ctr("images", "unmount", "--rm", where, check=False)
            os.rmdir(where)
    tool = ["podman"] if node.kind == "podman" else ["docker", "-H", node.env["DOCKER_HOST"]]
    env = node.services.podman_env(version=node.version) if node.kind == "podman" else dict(os.environ)
    name = "carcheck-" + os.urandom(4).hex()
    subprocess.run(tool + ["create", "--name", name, ref, "none"], env=env, check=True, capture_output=True,
                   timeout=120)
    try:
        tar = subprocess.run(tool + ["export", name], env=env, check=True, capture_output=True, timeout=120).stdout
    finally:
        subprocess.run(tool + ["rm", "-f", name], env=env, capture_output=True, timeout=120)
    out = {}
    with tarfile.open(fileobj=io.BytesIO(tar)) as t:
        for m in t.getmembers():
            if m.isfile() and m.name.lstrip("./").startswith("models/"):
                data = t.extractfile(m).read()  # type: ignore[union-attr]
                out["/" + m.name.lstrip("./")] = (hashlib.sha256(data).hexdigest(), oct(m.mode & 0o777))
    return out


@pytest.mark.parametrize("engine", ENGINES, indirect=True)
def test_a_model_imported_as_its_modelcar_holds_every_file_and_a_second_load_sends_nothing(model, car_bundle, node):
    name = car_name(model)
    node.remove_later(name)
    r = imgtool("load", str(car_bundle), "--models", "image", env=node.env)
    assert r.returncode == 0, r.stderr
    where = "containerd, namespace k8s.io" if node.kind == "containerd" else node.title
    pinned = ", pinned" if node.kind == "containerd" else ""
    [line] = [x for x in r.stdout.splitlines() if x.startswith("model image ")]
    assert line.startswith(f"model image {name} (linux/{host_arch()}, ") and \
        line.endswith(f"{pinned}): imported in {where}"), line
    doc = json.loads((car_bundle / "bundle.json").read_text())
    expected = {"/models/" + f["path"]: (f["sha256"][len("sha256:"):], "0o444") for f in doc["models"][0]["files"]}
    assert files_in_image(node, name) == expected
    again = imgtool("load", str(car_bundle), "--models", "image", "--json", env=node.env)
    assert again.returncode == 0, again.stderr
    result = json.loads(again.stdout)
    assert result["modelcars_sent"] is False and [m["ref"] for m in result["modelcars"]] == [name]
    inventory = imgtool("inventory", env=node.env)
    assert inventory.returncode == 0, inventory.stderr
    listed = [im for im in json.loads(inventory.stdout)["images"] if name in im.get("tags", [])]
    assert listed, inventory.stdout


@pytest.mark.parametrize("engine", ENGINES, indirect=True)
def test_a_damaged_part_imports_no_modelcar_and_is_named_as_for_placement(model, car_bundle, node):
    name = car_name(model)
    node.remove_later(name)
    before = node.snapshot()
    spans = damage_member(car_bundle, "sha256:" + model.head.files[SHARD2].sha256)
    r = imgtool("load", str(car_bundle), "--models", "image", env=node.env)
    assert r.returncode == 3, r.stderr
    assert err_lines(r)[0] == f"error: refusing to load: {car_bundle}: 1 problem; nothing was loaded"
    label = parts_of(car_bundle)[spans[0]].name.rsplit("part", 1)[1]
    assert any(line.startswith(f"  - part {label}") for line in err_lines(r)), r.stderr
    assert node.leftovers(before) == []


def test_models_image_on_a_bundle_without_the_modelcar_form_is_refused(tmp_path):
    store = BlobDir(tmp_path / "blobs")
    out = tmp_path / "plain"
    write(out, [], store, models=[put_model(store, small_model(seed=4902))])
    r = imgtool("load", str(out), "--models", "image")
    assert r.returncode == 2, r.stderr
    assert err_lines(r)[0] == f"error: --models image: {out} does not carry the modelcar form of its models " \
                              "(bundle.json records no modelcar digest for their files)"


@pytest.mark.parametrize("engine", ["containerd-2.1"], indirect=True)
def test_the_pyz_on_python_3_7_imports_the_modelcar_as_this_python_does(tmp_path, model, car_bundle, node):
    """Kylin's Python 3.7 runs imgtool.pyz: `load --models image` imports the same image (same ID) into containerd,
    and 3.11's imgtool then finds it held."""
    from tests.support.pythons import pyenv_python

    python = pyenv_python("3.7")
    assert python, "python3.7 is not under pyenv's versions: the pyz imports modelcars on Kylin's 3.7 (never a skip)"
    pyz = tmp_path / "imgtool.pyz"
    assert imgtool("self-bundle", "-o", str(pyz), "-q").returncode == 0
    name = car_name(model)
    node.remove_later(name)
    given = dict(node.env, HOME=str(tmp_path / "home37"), LANG="C.UTF-8")
    given.setdefault("PATH", "/usr/bin:/bin")
    r = subprocess.run(["env", "-i"] + [f"{k}={v}" for k, v in given.items()]
                       + [python, "-I", str(pyz), "load", str(car_bundle), "--models", "image", "--json"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    [car] = json.loads(r.stdout)["modelcars"]
    again = imgtool("load", str(car_bundle), "--models", "image", "--json", env=node.env)
    assert again.returncode == 0, again.stderr
    result = json.loads(again.stdout)
    assert result["modelcars_sent"] is False and result["modelcars"][0]["docker_id"] == car["docker_id"]
    doc = json.loads((car_bundle / "bundle.json").read_text())
    expected = {"/models/" + f["path"]: (f["sha256"][len("sha256:"):], "0o444") for f in doc["models"][0]["files"]}
    assert files_in_image(node, name) == expected
