"""bundle.json's `models` (format version 4) and the archive members they imply: the contract fetch, verify, load,
serve and push share (docs/models.md, "In the bundle")."""

import json

import pytest

from imgtool.bundle import layout
from imgtool.bundle.format import MODELS_VERSION, Archive, BundleIndex, Part, bundle_model
from imgtool.errors import VerifyError
from imgtool.model import Digest
from imgtool.weights import ModelFile, ModelRef, ModelSnapshot

COMMIT = "0123456789abcdef0123456789abcdef01234567"
CREATED = "2026-12-07T00:00:00Z"


def _snapshot() -> ModelSnapshot:
    files = tuple(ModelFile(p, len(p) * 10, Digest.of(p.encode()), git_oid="ab" * 20, lfs=p.endswith("safetensors"))
                  for p in ("model-00002-of-00002.safetensors", "model-00001-of-00002.safetensors", "config.json",
                            "README.md"))
    return ModelSnapshot(ModelRef("hf", "Qwen/Qwen3-8B", "main"), COMMIT, files)


def _index(models, omitted=()) -> BundleIndex:
    return BundleIndex(CREATED, "0.1.0", (), Archive("b.tar", "none", 10, "0" * 64, 10), (Part("b.tar", 10, "0" * 64),),
                       models=tuple(models))


def test_a_bundle_of_a_model_round_trips_as_version_4_and_its_members_follow_the_images():
    model = bundle_model(_snapshot(), "huggingface.co")
    index = _index([model])
    doc = json.loads(index.to_bytes())
    assert doc["version"] == MODELS_VERSION
    assert [f["path"] for f in doc["models"][0]["files"]] == sorted(f.path for f in _snapshot().files)
    again = BundleIndex.from_bytes(index.to_bytes())
    assert again.models == (model,)
    assert again.models[0].snapshot().files[0].lfs is False and again.models[0].files[2].lfs is True
    members = layout.bundle_members(again)
    kinds = [m.kind for m in members]
    assert kinds == ["meta", "meta", "meta", "model", "model", "model", "model", "model-meta", "model-meta"]
    assert members[3].what == "README.md of hf:Qwen/Qwen3-8B@main"
    assert members[-1].digest == model.manifest_digest and members[-1].content == model.artifact()[0]
    slots, _ = layout.arrange(members)
    assert layout.images_end(slots) == slots[3].offset


def test_an_omitted_file_is_not_a_member_but_stays_in_the_artifact():
    held = Digest.of(b"model-00001-of-00002.safetensors")
    model = bundle_model(_snapshot(), "huggingface.co", omitted={held})
    members = layout.bundle_members(BundleIndex.from_bytes(_index([model]).to_bytes()))
    assert held not in {m.digest for m in members}
    assert model.manifest_digest == bundle_model(_snapshot(), "huggingface.co").manifest_digest


@pytest.mark.parametrize("edit, why", [
    (lambda m: m.update(manifest_digest="sha256:" + "1" * 64),
     "`models[0].manifest_digest` does not follow from its files: the artifact of hf:Qwen/Qwen3-8B@main is sha256:"),
    (lambda m: m["files"][0].update(path="../../etc/passwd"),
     "`models[0].files[0].path` is not a path under a model's directory: '../../etc/passwd'"),
    (lambda m: m["files"][0].update(media_type="application/vnd.cncf.model.weight.v1.raw"),
     "`models[0].files[0].media_type` is not application/vnd.cncf.model.doc.v1.raw for 'README.md'"),
    (lambda m: m.update(ref="hf:../x"), "`models[0].ref` is not a model reference: 'hf:../x'"),
    # a directory of the connected side is never a bundle's name for a model (fetch records the hub's spelling)
    (lambda m: m.update(ref="hf:Qwen/Qwen3-8B=/etc"), "`models[0].ref` is not a model reference: 'hf:Qwen/Qwen3-8B=/etc'"),
])
def test_an_edited_model_entry_is_refused_naming_it(edit, why):
    doc = json.loads(_index([bundle_model(_snapshot(), "huggingface.co")]).to_bytes())
    edit(doc["models"][0])
    with pytest.raises(VerifyError) as e:
        BundleIndex.from_bytes(json.dumps(doc).encode())
    assert e.value.message.startswith("bundle.json is malformed: " + why)


def test_models_in_an_older_version_are_refused():
    doc = json.loads(_index([bundle_model(_snapshot(), "huggingface.co")]).to_bytes())
    doc["version"] = 3
    with pytest.raises(VerifyError) as e:
        BundleIndex.from_bytes(json.dumps(doc).encode())
    assert e.value.message == "bundle.json is malformed: `models` needs format version 4"


def test_a_bundle_with_an_image_and_a_model_verifies_and_a_damaged_part_is_refused(tmp_path, factory):
    from tests.support.bundles import BlobDir, damage_member, imgtool, put_model, write
    from tests.support.models import small_model

    store = BlobDir(tmp_path / "blobs")
    image = store.pulled(factory.image(layers=1), "quay.io/ascend/vllm-ascend:v1")
    model = put_model(store, small_model(seed=3, shard_bytes=256 << 10))
    out = tmp_path / "b"
    write(out, [image], store, chunk_size=64 << 10, models=[model])
    ok = imgtool("verify", str(out))
    assert ok.returncode == 0, ok.stderr
    shard = next(m for m in layout.bundle_members(BundleIndex.from_bytes((out / "bundle.json").read_bytes()))
                 if m.what.startswith("model-00002-of-00002.safetensors"))
    spans = damage_member(out, shard.name)
    bad = imgtool("verify", str(out))
    assert bad.returncode == 3
    index = BundleIndex.from_bytes((out / "bundle.json").read_bytes())
    assert len(spans) > 2  # the damaged part, in the shard's middle, holds nothing else
    part = index.parts[spans[len(spans) // 2]]
    n = part.name[-3:]
    assert bad.stderr.splitlines()[-1] == (
        f"  - part {n} ({part.name}) is damaged: its sha256 differs from "
        f"bundle.json (it holds model-00002-of-00002.safetensors of hf:imgtool-test/tiny-llm@main); re-copy part {n} "
        "from the source medium")
