"""Issue 49: inventory and delta know the modelcar images. A model the runtime holds as its modelcar image
(`load --models image`) is a held model of `imgtool inventory` (each file's sha256 from the layers' annotations, its
size from the layer's tar head); a delta against that inventory leaves out the unchanged files, and `load --models
image` of that delta on containerd imports the new revision's modelcar from the new files' layers and the base's
(same path and bytes: the same layer). Docker's load needs every layer: refused there, as on containerd when the base
modelcar is not held; `imgtool diff` shows the held modelcar as the delta's old side."""

import json

import pytest

from imgtool.delta import Inventory, have_from_inventory
from imgtool.model import Digest
from tests.support.bundles import BlobDir, imgtool, put_model, write
from tests.support.models import two_revisions
from tests.test_load_modelcar import err_lines, files_in_image

MODEL = "imgtool-test/tiny-llm"
CHANGED = "model-00002-of-00002.safetensors"  # two_revisions changes the last shard


@pytest.fixture
def model():
    return two_revisions(seed=4930)


def car_name(commit: str) -> str:
    return f"models.local/hf/{MODEL}:{commit}-modelcar"


def bundle_of(tmp_path, model, revision: str, name: str, omitted=()):
    store = BlobDir(tmp_path / f"blobs-{name}")
    out = tmp_path / name
    write(out, [], store, models=[put_model(store, model, revision, omitted=omitted, modelcar=True)],
          chunk_size=24 << 10)
    return out


def unchanged(model) -> set:
    old = {f.sha256 for f in model.resolve("v1").files.values()}
    return {Digest.parse("sha256:" + f.sha256) for f in model.head.files.values() if f.sha256 in old}


def expected_files(bundle) -> dict:
    doc = json.loads((bundle / "bundle.json").read_text())
    return {"/models/" + f["path"]: (f["sha256"][len("sha256:"):], "0o444") for f in doc["models"][0]["files"]}


def v1_held(tmp_path, model, node):
    """v1's bundle, its modelcar imported (load --models image) into the node's runtime; both revisions' modelcars
    removed after the test."""
    for name in (car_name(model.refs["v1"]), car_name(model.head.commit)):
        node.remove_later(name)
    base = bundle_of(tmp_path, model, "v1", "base")
    r = imgtool("load", str(base), "--models", "image", env=node.env)
    assert r.returncode == 0, r.stderr
    return base


@pytest.mark.parametrize("engine", ["containerd-1.7"], indirect=True)
def test_a_held_modelcar_is_an_inventory_model_whose_delta_loads_as_the_new_modelcar(tmp_path, model, node):
    v1, v2 = model.refs["v1"], model.head.commit
    base = v1_held(tmp_path, model, node)

    inv_path = tmp_path / "inventory.json"
    r = imgtool("inventory", "-o", str(inv_path), env=node.env)
    assert r.returncode == 0, r.stderr
    assert "not listed as a held model" not in r.stderr
    doc = json.loads(inv_path.read_text())
    [held] = [m for m in doc["models"] if m.get("image")]
    layers = {f["path"]: f["modelcar"] for f in json.loads((base / "bundle.json").read_text())["models"][0]["files"]}
    assert held == {"ref": f"hf:{MODEL}@{v1}", "commit": v1, "path": "", "image": car_name(v1),
                    "files": [{"path": f.path, "size": f.size, "sha256": "sha256:" + f.sha256,
                               "modelcar": layers[f.path]}
                              for f in sorted(model.resolve("v1").files.values(), key=lambda f: f.path)]}

    # what `fetch hf:ORG/NAME --have inventory.json` leaves out: the files the inventory holds by sha256, each with
    # the layer the runtime holds it as (the delta's modelcar names it: tests/test_fetch_models.py, have-modelcar)
    have = have_from_inventory(Inventory.from_bytes(inv_path.read_bytes()), "inventory.json")
    assert have.modelcar_layers == {(Digest.parse("sha256:" + f.sha256), f.path): Digest.parse(layers[f.path])
                                    for f in model.resolve("v1").files.values()}
    omitted = {Digest.parse("sha256:" + f.sha256) for f in model.head.files.values()
               if Digest.parse("sha256:" + f.sha256) in have.model_files}
    assert omitted == unchanged(model) and len(omitted) == len(model.head.files) - 1
    delta = bundle_of(tmp_path, model, "main", "delta", omitted=omitted)
    carried = [f["path"] for f in json.loads((delta / "bundle.json").read_text())["models"][0]["files"]
               if not f.get("omitted")]
    assert carried == [CHANGED]

    same = imgtool("diff", str(inv_path), str(base), "--json", env=node.env)  # the held modelcar is v1's bundle
    assert same.returncode == 0, same.stderr
    [row] = json.loads(same.stdout)["models"]
    assert (row["status"], {f["status"] for f in row["files"]}) == ("unchanged", {"shared"})
    diff = imgtool("diff", str(inv_path), str(delta), "--json", env=node.env)
    assert diff.returncode == 0, diff.stderr
    [row] = json.loads(diff.stdout)["models"]
    assert (row["status"], row["old_commit"], row["new_commit"]) == ("changed", v1, v2)
    assert {f["path"]: f["status"] for f in row["files"]} == {
        p: "changed" if p == CHANGED else "shared" for p in model.head.files}

    r = imgtool("load", str(delta), "--models", "image", env=node.env)
    assert r.returncode == 0, r.stderr
    assert files_in_image(node, car_name(v2)) == expected_files(delta)


@pytest.mark.parametrize("engine", ["20.10", "containerd-1.7"], indirect=True)
def test_a_delta_whose_left_out_files_the_runtime_does_not_hold_as_layers_is_refused(tmp_path, model, node):
    delta = bundle_of(tmp_path, model, "main", "delta", omitted=unchanged(model))
    node.remove_later(car_name(model.head.commit))
    before = node.snapshot()
    r = imgtool("load", str(delta), "--models", "image", env=node.env)
    if node.kind == "containerd":
        assert r.returncode == 1, r.stderr
        assert err_lines(r) == [
            f"error: refusing to load: {delta} is a delta bundle that leaves out .gitattributes of hf:{MODEL}@main, "
            f"and containerd holds no modelcar layer of it at that path ({len(model.head.files) - 1} such files)",
            "hint: load the modelcar of the revision the delta was fetched against first (a file renamed since then "
            "needs its bytes: fetch a full bundle), or place the files: --models hf (or --models modelscope, "
            "--models-dir DIR)"]
    else:
        assert r.returncode == 2, r.stderr
        assert err_lines(r) == [
            f"error: --models image: {delta} is a delta bundle that leaves out files of its models, and Docker "
            "is sent every layer of an image (only containerd reuses a layer it holds by digest)",
            "hint: load --models image of a delta bundle needs containerd (which holds the base revision's modelcar "
            "layers by digest); or place the files: --models hf (or --models modelscope, --models-dir DIR)"]
    assert node.leftovers(before) == []


@pytest.mark.parametrize("engine", ["20.10"], indirect=True)
def test_a_modelcar_docker_holds_is_not_an_inventory_model_and_inventory_says_why(tmp_path, model, node):
    name = car_name(model.refs["v1"])
    node.remove_later(name)
    r = imgtool("load", str(bundle_of(tmp_path, model, "v1", "base")), "--models", "image", env=node.env)
    assert r.returncode == 0, r.stderr
    r = imgtool("inventory", env=node.env)
    assert r.returncode == 0, r.stderr
    assert [m for m in json.loads(r.stdout)["models"] if m.get("image")] == []
    assert f"{name}: not listed as a held model: Docker does not give imgtool the image's manifest, whose layers " \
           "name the files" in r.stderr.splitlines()


@pytest.mark.parametrize("engine", ["containerd-1.7"], indirect=True)
def test_a_modelcar_containerd_holds_only_partly_is_not_an_inventory_model_and_inventory_says_why(tmp_path, model,
                                                                                                    node):
    name = car_name(model.refs["v1"])
    node.remove_later(name)
    base = bundle_of(tmp_path, model, "v1", "base")
    r = imgtool("load", str(base), "--models", "image", env=node.env)
    assert r.returncode == 0, r.stderr
    doc = json.loads((base / "bundle.json").read_text())
    [layer] = [f["modelcar"] for f in doc["models"][0]["files"] if f["path"] == CHANGED]
    node.ctr("content", "rm", layer)
    r = imgtool("inventory", env=node.env)
    assert r.returncode == 0, r.stderr
    assert [m for m in json.loads(r.stdout)["models"] if m.get("image")] == []
    assert f"{name}: not listed as a held model: containerd holds it only partly (1 of its blobs are not in the " \
           "content store)" in r.stderr.splitlines()


def test_a_modelcar_layer_says_its_files_size_from_its_head_alone():
    """inventory reads only a layer's first bytes: the size is the one whose head and layer size both match."""
    from imgtool import modelcar

    for path in ("config.json", "sub/" + "x" * 120 + ".bin", "tokenizer/vocabulário.txt"):
        for size in (0, 1, 511, 512, 513, 70000):
            data = b"".join(modelcar.layer_chunks(path, size, [bytes(size)]))
            assert modelcar.file_size(path, len(data), data[:modelcar.head_length(path)]) == size
    framed = b"".join(modelcar.layer_chunks("a.bin", 10, [bytes(10)]))
    assert modelcar.file_size("b.bin", len(framed), framed[:512]) is None  # another path's layer: no size


def test_only_a_modelcar_name_is_read_as_a_held_model():
    from imgtool.inventory import modelcar_name

    assert modelcar_name(car_name("0" * 40)) == ("hf", MODEL, "0" * 40)
    assert modelcar_name("models.local/modelscope/org/name:main-modelcar") == ("modelscope", "org/name", "main")
    for other in (f"models.local/hf/{MODEL}:{'0' * 40}", f"docker.io/hf/{MODEL}:x-modelcar",
                  "models.local/dir/org/name:x-modelcar", "models.local/hf/name:x-modelcar",
                  f"models.local/hf/{MODEL}:-modelcar", "models.local/hf/org/x..y:c-modelcar"):
        assert modelcar_name(other) is None, other


@pytest.mark.parametrize("engine", ["containerd-1.7"], indirect=True)
def test_a_delta_naming_a_held_layer_that_is_not_its_file_is_refused(tmp_path, model, node):
    """An inventory crosses the gap unsigned: one edited on the way claims the host holds the new revision's changed
    file as the old revision's layer at that path (same path, held, older bytes). fetch writes that layer into the
    delta's modelcar; load checks a reused layer against the held modelcar's own record of the file (path and
    sha256), refuses, and imports nothing: the new revision's name never serves the old file."""
    import dataclasses

    from tests.support.bundles import BlobDir, put_model, write

    base = v1_held(tmp_path, model, node)
    old_layer = {f["path"]: f["modelcar"] for f in json.loads((base / "bundle.json").read_text())["models"][0]["files"]}
    changed = Digest.parse("sha256:" + model.head.files[CHANGED].sha256)
    store = BlobDir(tmp_path / "blobs-forged")
    honest = put_model(store, model, "main", omitted=unchanged(model) | {changed}, modelcar=True)
    forged = dataclasses.replace(honest, files=tuple(
        dataclasses.replace(f, modelcar=Digest.parse(old_layer[f.path])) if f.path == CHANGED else f
        for f in honest.files))
    delta = tmp_path / "forged"
    write(delta, [], store, models=[forged], chunk_size=24 << 10)
    before = node.snapshot()
    r = imgtool("load", str(delta), "--models", "image", env=node.env)
    assert r.returncode == 1, r.stderr
    assert err_lines(r)[0] == (f"error: refusing to load: {delta} is a delta bundle that leaves out {CHANGED} of "
                               f"hf:{MODEL}@main, and containerd holds no modelcar layer of it at that path")
    assert node.leftovers(before) == []  # no modelcar of main, no blob of it
