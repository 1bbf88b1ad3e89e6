"""The modelcar form of a model (imgtool/modelcar.py): each file's layer a pure function of its bytes, the image a pure
function of the layers' digests, recorded in bundle.json and checked there."""

import hashlib
import io
import json
import tarfile

import pytest

from imgtool import modelcar
from imgtool.bundle.format import BundleIndex
from imgtool.errors import VerifyError
from imgtool.model import OCI_INDEX, OCI_LAYER, Digest
from tests.support.bundles import BlobDir, put_model
from tests.support.models import small_model


def _layer(path: str, data: bytes) -> bytes:
    return b"".join(modelcar.layer_chunks(path, len(data), [data[:7], data[7:]]))


@pytest.mark.parametrize("path,size", [("config.json", 300), ("model-00001-of-00002.safetensors", 512),
                                       ("deep/" * 30 + "tokenizer.json", 1000), ("空.txt", 0)])
def test_a_files_layer_is_a_tar_of_that_file_alone_under_models_read_only(path, size):
    data = bytes((i * 7 + 3) % 256 for i in range(size))
    layer = _layer(path, data)
    assert len(layer) == modelcar.layer_size(path, size) and len(layer) % 512 == 0
    with tarfile.open(fileobj=io.BytesIO(layer)) as tar:
        members = tar.getmembers()
        assert [(m.name, m.size, m.mode, m.uid, m.mtime, m.isreg()) for m in members] == [
            (f"models/{path}", size, 0o444, 0, 0, True)]
        assert tar.extractfile(members[0]).read() == data
    assert layer.endswith(bytes(1024))
    assert modelcar.layer_digest(path, size, [data]) == Digest.of(layer)
    h = modelcar.LayerHash(path, size)
    for i in range(0, size, 100):
        h.update(data[i:i + 100])
    assert h.digest() == h.digest() == Digest.of(layer)  # digest() can be asked twice


def _car(files):
    return modelcar.image([modelcar.LayerFile(p, len(d), modelcar.layer_digest(p, len(d), [d]), Digest.of(d)) for p, d in files],
                          "https://huggingface.co/org/name", "c" * 40)


def test_the_image_is_an_index_of_amd64_and_arm64_sharing_every_layer_and_a_pure_function_of_the_files():
    files = [("b.safetensors", b"weights" * 100), ("a/config.json", b"{}")]
    car = _car(files)
    assert _car(list(reversed(files))).index == car.index  # the files' order given does not matter
    index = json.loads(car.index)
    assert index["mediaType"] == OCI_INDEX
    assert [(m["platform"]["os"], m["platform"]["architecture"]) for m in index["manifests"]] == [
        ("linux", "amd64"), ("linux", "arm64")]
    for (os_, arch, manifest, config), entry in zip(car.manifests, index["manifests"]):
        assert entry["digest"] == str(Digest.of(manifest))
        m, c = json.loads(manifest), json.loads(config)
        assert m["config"]["digest"] == str(Digest.of(config))
        assert [layer["mediaType"] for layer in m["layers"]] == [OCI_LAYER, OCI_LAYER]
        assert [layer["digest"] for layer in m["layers"]] == c["rootfs"]["diff_ids"] == [
            str(modelcar.layer_digest(p, len(d), [d])) for p, d in sorted(files)]
        assert (c["os"], c["architecture"]) == (os_, arch)
        assert "created" not in c and "history" not in c
        assert c["config"]["Labels"]["org.opencontainers.image.revision"] == "c" * 40
    assert car.for_platform("linux", "arm64") == car.manifests[1][2:]
    assert modelcar.tag("c" * 40) == "c" * 40 + "-modelcar"


def _index_json(tmp_path, modelcar_too: bool) -> dict:
    store = BlobDir(tmp_path / "store")
    model = put_model(store, small_model(seed=5), modelcar=modelcar_too)
    return {"format": "imgtool-bundle", "version": 4, "created": "2026-12-07T00:00:00Z", "imgtool_version": "0",
            "images": [], "archive": {"name": "m.tar", "compression": "none", "size": 0, "sha256": "0" * 64,
                                      "tar_size": 0},
            "parts": [{"name": "m.tar", "size": 0, "sha256": "0" * 64}], "models": [model.to_json()]}, model


def test_bundle_json_records_each_files_modelcar_layer_and_the_image_follows_from_them(tmp_path):
    doc, model = _index_json(tmp_path, True)
    assert all(f["modelcar"].startswith("sha256:") for f in doc["models"][0]["files"])
    read = BundleIndex.from_bytes(json.dumps(doc).encode()).models[0]
    assert read.modelcar() is not None and read.modelcar().index == model.modelcar().index
    rev = small_model(seed=5).head
    layers = {f.path: str(modelcar.layer_digest(f.path, f.size, f.chunks())) for f in rev.files.values()}
    assert {f.path: str(f.modelcar) for f in read.files} == layers
    plain, _ = _index_json(tmp_path / "plain", False)
    assert BundleIndex.from_bytes(json.dumps(plain).encode()).models[0].modelcar() is None


def test_a_bundle_json_where_only_some_files_have_a_modelcar_layer_is_refused(tmp_path):
    doc, _ = _index_json(tmp_path, True)
    del doc["models"][0]["files"][1]["modelcar"]
    with pytest.raises(VerifyError) as e:
        BundleIndex.from_bytes(json.dumps(doc).encode())
    assert "`models[0].files`: some have a `modelcar` digest and some not (a model has both forms or one)" in str(e.value)


def test_the_layer_digest_is_not_the_files_sha256():
    data = b"x" * 10
    assert modelcar.layer_digest("f", 10, [data]) != Digest("sha256", hashlib.sha256(data).hexdigest())


def test_each_layer_says_its_files_path_and_sha256_so_a_host_holding_the_image_knows_its_files():
    files = [("b.safetensors", b"weights" * 100), ("a/config.json", b"{}")]
    _, _, manifest, _ = _car(files).manifests[1]
    doc = json.loads(manifest)
    assert modelcar.files_of(doc) == [(p, Digest.of(d), modelcar.layer_digest(p, len(d), [d])) for p, d in sorted(files)]
    doc["layers"][0]["annotations"]["org.cncf.model.filepath"] = "../etc/passwd"
    with pytest.raises(ValueError) as e:
        modelcar.files_of(doc)
    assert str(e.value) == "a layer without a safe org.cncf.model.filepath and io.imgtool.model.file.sha256"

    doc = json.loads(manifest)
    doc["layers"][1]["digest"] = 7  # an edited manifest: a number where the digest goes
    with pytest.raises(ValueError) as e:
        modelcar.files_of(doc)
    assert str(e.value) == "invalid digest '': expected sha256:<64 lowercase hex digits>"
