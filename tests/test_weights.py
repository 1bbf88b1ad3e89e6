"""Model weights as values (imgtool/weights.py): references, names from a hub as data, the ModelPack artifact."""

import json

import pytest

from imgtool.errors import UsageError
from imgtool.model import Digest
from imgtool.weights import (DOC_RAW, FILEPATH, MODEL_ARTIFACT, MODEL_CONFIG, WEIGHT_CONFIG_RAW, WEIGHT_RAW, ModelFile,
                             ModelRef, ModelSnapshot, check_path, files_of, hf_folder, is_model_ref, modelpack,
                             modelscope_folder, parse_model_ref)

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def test_a_model_reference_names_its_hub_repository_and_revision():
    assert parse_model_ref("hf:Qwen/Qwen3-8B") == ModelRef("hf", "Qwen/Qwen3-8B", None)
    assert parse_model_ref("modelscope:vllm-ascend/Qwen3-8B-W8A8@v1.0") == ModelRef("modelscope", "vllm-ascend/Qwen3-8B-W8A8",
                                                                                    "v1.0")
    assert parse_model_ref(f"hf:Qwen/Qwen3-8B@{COMMIT}").revision == COMMIT
    assert str(parse_model_ref("hf:Qwen/Qwen3-8B@main")) == "hf:Qwen/Qwen3-8B@main"
    assert ModelRef("modelscope", "a/b").default_revision == "master"
    assert ModelRef("hf", "a/b").default_revision == "main"
    assert is_model_ref("hf:Qwen/Qwen3-8B") and not is_model_ref("v0.22.1rc1") and not is_model_ref("quay.io/a/b:1")


@pytest.mark.parametrize("text, why", [
    ("hf:Qwen", "the model is ORG/NAME"),
    ("hf:Qwen/../x", "the model is ORG/NAME"),
    ("hf:a/b/c", "the model is ORG/NAME"),
    ("hf:a/b@../x", "is not a revision"),
    ("hf:a/b@", "is not a revision"),
    ("ollama:a/b", "use hf:ORG/NAME"),
])
def test_a_bad_model_reference_is_a_usage_error(text, why):
    with pytest.raises(UsageError) as e:
        parse_model_ref(text)
    assert why in str(e.value) and e.value.exit_code == 2


@pytest.mark.parametrize("path, why", [
    ("../etc/passwd", "a `.`, `..` or empty component"),
    ("a/../../b", "a `.`, `..` or empty component"),
    ("/etc/passwd", "an absolute path"),
    ("a//b", "a `.`, `..` or empty component"),
    ("a\nb", "a control character in the name"),
    ("a\u202eb", "a control character in the name"),
    ("a\\b", "a backslash in the name"),
    ("", "an empty or too long name"),
])
def test_a_name_from_a_hub_that_is_not_a_safe_path_is_refused(path, why):
    assert check_path(path) == why
    snap = ModelSnapshot(ModelRef("hf", "a/b"), COMMIT, (ModelFile(path, 1, None),))
    with pytest.raises(UsageError) as e:
        snap.check()
    assert str(e.value) == f"hf:a/b: the hub lists {path!r}, {why}: not a file name imgtool places"


def test_a_listing_with_a_name_twice_or_a_file_that_is_also_a_directory_is_refused():
    twice = ModelSnapshot(ModelRef("hf", "a/b"), COMMIT, (ModelFile("x", 1, None), ModelFile("x", 1, None)))
    with pytest.raises(UsageError, match="lists 'x' twice"):
        twice.check()
    both = ModelSnapshot(ModelRef("hf", "a/b"), COMMIT, (ModelFile("x", 1, None), ModelFile("x/y", 1, None)))
    with pytest.raises(UsageError, match="lists 'x' as a file and as a directory"):
        both.check()
    assert check_path("sub/dir/model.safetensors") is None


def test_each_file_is_one_raw_layer_of_the_modelpack_artifact_its_digest_the_files_sha256():
    files = tuple(ModelFile(p, n, Digest.of(p.encode())) for p, n in (
        ("model-00002-of-00002.safetensors", 20), ("model-00001-of-00002.safetensors", 10), ("config.json", 3),
        ("tokenizer.json", 4), ("model.safetensors.index.json", 5), ("README.md", 6), ("LICENSE", 7)))
    snap = ModelSnapshot(ModelRef("hf", "Qwen/Qwen3-8B"), COMMIT, files)
    manifest, config, layers = modelpack(snap, "2026-12-07T00:00:00Z")
    doc = json.loads(manifest)
    assert doc["artifactType"] == MODEL_ARTIFACT and doc["config"]["mediaType"] == MODEL_CONFIG
    assert doc["config"]["digest"] == str(Digest.of(config))
    kinds = {layer["annotations"][FILEPATH]: layer["mediaType"] for layer in doc["layers"]}
    assert kinds == {"LICENSE": DOC_RAW, "README.md": DOC_RAW, "config.json": WEIGHT_CONFIG_RAW,
                     "model-00001-of-00002.safetensors": WEIGHT_RAW, "model-00002-of-00002.safetensors": WEIGHT_RAW,
                     "model.safetensors.index.json": WEIGHT_CONFIG_RAW, "tokenizer.json": WEIGHT_CONFIG_RAW}
    assert [layer["digest"] for layer in doc["layers"]] == json.loads(config)["modelfs"]["diff_ids"]
    assert all(layer["digest"] == str(Digest.of(layer["annotations"][FILEPATH].encode())) for layer in doc["layers"])
    assert json.loads(config)["descriptor"]["revision"] == COMMIT
    # a pure function of the snapshot: the same bytes from the files in any order
    again = modelpack(ModelSnapshot(snap.ref, COMMIT, tuple(reversed(files))), "2026-12-07T00:00:00Z")
    assert again[:2] == (manifest, config)
    assert [p for p, _ in files_of(layers)] == sorted(f.path for f in files)


def test_the_hubs_caches_name_a_model_their_own_way():
    assert hf_folder("Qwen/Qwen3-8B") == "models--Qwen--Qwen3-8B"
    assert modelscope_folder("Qwen/Qwen2.5-7B-Instruct") == "models/Qwen/Qwen2___5-7B-Instruct"
