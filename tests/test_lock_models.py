"""bundle.toml `models` and `imgtool lock` (issue 48): lock pins each model's commit and every file's size and
sha256; `fetch -f` fetches exactly those however the branch moves, and refuses a hub that lists another sha256 for
a pinned commit, naming the file. Against the loopback hub of tests/support/hub.py, through the real CLI."""

import json
from pathlib import Path

from tests.support.hub import Hub
from tests.support.models import two_revisions
from tests.test_fetch_models import REPO, assert_carries, imgtool, index_of

CHANGED = "model-00002-of-00002.safetensors"  # two_revisions: main changes the last shard


def spec_for(tmp_path: Path, *models: str) -> Path:
    spec = tmp_path / "bundle.toml"
    spec.write_text("models = [" + ", ".join(json.dumps(m) for m in models) + ']\noutput = "out"\nchunk_size = "1M"\n')
    return spec


def test_lock_pins_the_commit_and_every_files_sha256_and_fetch_f_fetches_exactly_those_after_the_branch_moved(
        tmp_path):
    model = two_revisions(seed=55, shards=2, shard_bytes=64 << 10)
    v1, v2 = model.refs["v1"], model.refs["main"]
    model.refs["main"] = v1  # main is v1 when the release is locked
    spec = spec_for(tmp_path, f"hf:{REPO}")
    cache = tmp_path / "cache"
    with Hub([model], flavour="hf") as hub:
        r = imgtool(hub, cache, "lock", "-f", str(spec))
        assert r.returncode == 0, r.stderr
        assert r.stdout.splitlines() == [f"added      hf:{REPO}: {v1[:12]}",
                                         f"wrote {tmp_path / 'bundle.lock'}: 0 image(s) x 0 platform(s), 1 model(s)"]
        lock = json.loads((tmp_path / "bundle.lock").read_text())
        assert lock["models"] == [{"ref": f"hf:{REPO}", "commit": v1, "source": "HF_ENDPOINT",
                                   "files": [{"path": f.path, "size": f.size, "sha256": "sha256:" + f.sha256}
                                             for f in sorted(model.resolve("v1").files.values(), key=lambda f: f.path)]}]
        model.refs["main"] = v2  # the branch moves on
        r = imgtool(hub, cache, "fetch", "-f", str(spec), "--no-tool", cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        again = imgtool(hub, cache, "lock", "-f", str(spec))
        assert again.returncode == 0, again.stderr
        assert again.stdout.splitlines() == [f"{tmp_path / 'bundle.lock'}: up to date with {spec} (0 image(s) x "
                                             "0 platform(s), 1 model(s) pinned); --update re-resolves the tags"]
        moved = imgtool(hub, cache, "lock", "--update", "-f", str(spec))
        assert moved.returncode == 0, moved.stderr
        assert moved.stdout.splitlines()[0] == f"moved      hf:{REPO}: {v1[:12]} -> {v2[:12]} ({CHANGED} changed)"
    (m,) = index_of(tmp_path / "out").models
    assert (m.ref, m.commit) == (f"hf:{REPO}", v1)
    assert_carries(tmp_path / "out", model, "v1")


def test_a_hub_listing_another_sha256_for_a_pinned_commit_is_refused_naming_the_file(tmp_path):
    model = two_revisions(seed=56, shards=2, shard_bytes=64 << 10)
    spec = spec_for(tmp_path, f"hf:{REPO}@v1")
    cache = tmp_path / "cache"
    with Hub([model], flavour="hf") as hub:
        assert imgtool(hub, cache, "lock", "-f", str(spec)).returncode == 0
        pinned = model.resolve("v1").files[CHANGED]
        hub.faults.lie_sha256[CHANGED] = "ab" * 32  # the hub now lists other bytes under the pinned commit
        r = imgtool(hub, cache, "fetch", "-f", str(spec), "--no-tool", cwd=tmp_path)
    assert r.returncode == 3, r.stderr
    assert r.stderr.splitlines()[-2:] == [
        f"error: hf:{REPO}@v1 at commit {model.refs['v1'][:12]}: {CHANGED}: the hub lists sha256:{'ab' * 32} "
        f"({pinned.size} bytes), the lock pins sha256:{pinned.sha256} ({pinned.size} bytes); refused",
        "hint: the hub's files changed under a pinned commit: try another endpoint with --mirror NAME; if the change "
        f"is wanted, imgtool lock --update (pins in {tmp_path / 'bundle.lock'})"]
    assert not (tmp_path / "out").exists()


def test_a_spec_naming_neither_images_nor_models_is_refused(tmp_path):
    spec = tmp_path / "bundle.toml"
    spec.write_text('output = "out"\n')
    r = imgtool(None, tmp_path / "cache", "lock", "-f", str(spec))
    assert r.returncode == 2
    assert r.stderr.splitlines()[0] == (f"error: {spec}: missing key 'images' (e.g. images = [\"v0.22.1rc1\", "
                                        "\"v0.22.1rc1-a3\"]) or 'models' (e.g. models = [\"hf:Qwen/Qwen3-8B\"])")


def test_a_bad_model_in_the_spec_is_refused_naming_the_key(tmp_path):
    spec = spec_for(tmp_path, "hf:../x")
    r = imgtool(None, tmp_path / "cache", "lock", "-f", str(spec))
    assert r.returncode == 2
    assert "invalid model reference 'hf:../x': the model is ORG/NAME (letters, digits, . _ -)" in r.stderr
