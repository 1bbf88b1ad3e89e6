"""A local directory as a model's source (issue 48, imgtool/model_dir.py): a Hugging Face cache's snapshot directory
names the model and its commit itself; a plain directory is named `hf:ORG/NAME=DIR`. Each file is hashed, carried
into the bundle, and the bundle verifies; links other than a cache snapshot's into its own blobs/ are refused.
Models generated from seeds (tests/support/models.py), laid out as huggingface_hub lays out its cache."""

import json
import os
from pathlib import Path

from tests.support.models import small_model
from tests.test_fetch_models import REPO, assert_carries, assert_modelcar, imgtool, index_of


def hf_cache(root: Path, model, refs=("main",)) -> Path:
    """The model's head laid out as huggingface_hub's cache: blobs/<sha256 | git blob id>, snapshots/<commit>/<path>
    relative links to them, refs/<branch> holding the commit. Returns the snapshot directory."""
    rev = model.head
    folder = root / ("models--" + REPO.replace("/", "--"))
    snap = folder / "snapshots" / rev.commit
    (folder / "blobs").mkdir(parents=True)
    for f in rev.files.values():
        blob = f.sha256 if f.lfs else f.blob_id
        (folder / "blobs" / blob).write_bytes(f.read())
        link = snap / f.path
        link.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.relpath(folder / "blobs" / blob, link.parent), link)
    (folder / "refs").mkdir()
    for r in refs:
        (folder / "refs" / r).write_text(rev.commit)
    return snap


def plain_dir(root: Path, model) -> Path:
    for f in model.head.files.values():
        p = root / f.path
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(f.read())
    return root


def test_a_hf_cache_snapshot_directory_is_a_model_by_itself_carried_and_verified(tmp_path):
    model = small_model(seed=60, shard_bytes=256 << 10)
    snap = hf_cache(tmp_path / "hub", model)
    out, cache = tmp_path / "b", tmp_path / "cache"
    r = imgtool(None, cache, "fetch", str(snap), "-o", str(out), "--chunk-size", "1M", "--no-tool")
    assert r.returncode == 0, r.stderr
    assert f"{snap}: {len(model.head.files)} files, " in r.stderr
    (m,) = index_of(out).models
    assert (m.ref, m.commit, m.source) == (f"hf:{REPO}@main", model.head.commit, str(snap))
    assert {f.path: (f.git_oid, f.lfs) for f in m.files} == {
        f.path: (None if f.lfs else f.blob_id, f.lfs) for f in model.head.files.values()}
    assert_carries(out, model)
    assert_modelcar(out, model)
    ok = imgtool(None, cache, "verify", str(out))
    assert ok.returncode == 0, ok.stderr


def test_a_plain_directory_is_named_by_the_user_and_gets_a_commit_from_its_contents(tmp_path):
    model = small_model(seed=61, shard_bytes=256 << 10)
    src = plain_dir(tmp_path / "dl", model)
    (src / ".cache" / "huggingface").mkdir(parents=True)  # what `huggingface-cli download --local-dir` keeps
    (src / ".cache" / "huggingface" / "x.metadata").write_text("not the model's")
    out, cache = tmp_path / "b", tmp_path / "cache"
    r = imgtool(None, cache, "fetch", f"hf:{REPO}={src}", "-o", str(out), "--chunk-size", "1M", "--no-tool")
    assert r.returncode == 0, r.stderr
    (m,) = index_of(out).models
    assert m.ref == f"hf:{REPO}" and m.commit.startswith("local-") and len(m.commit) == 38
    assert sorted(f.path for f in m.files) == sorted(model.head.files)
    assert_carries(out, model)
    again = imgtool(None, cache, "fetch", f"hf:{REPO}@{'a' * 40}={src}", "-o", str(tmp_path / "c"), "--no-tool")
    assert again.returncode == 0, again.stderr
    assert index_of(tmp_path / "c").models[0].commit == "a" * 40  # a commit the user names is the commit
    ok = imgtool(None, cache, "verify", str(out))
    assert ok.returncode == 0, ok.stderr


def test_a_link_leaving_the_caches_blobs_is_refused(tmp_path):
    model = small_model(seed=62, shard_bytes=1024)
    snap = hf_cache(tmp_path / "hub", model)
    secret = tmp_path / "secret"
    secret.write_text("not a model file")
    (snap / "config.json").unlink()
    os.symlink(str(secret), snap / "config.json")
    r = imgtool(None, tmp_path / "cache", "fetch", str(snap), "-o", str(tmp_path / "b"), "--no-tool")
    assert r.returncode == 2
    assert r.stderr.splitlines()[0] == f"error: {snap}: config.json links outside the cache's blobs/ ({secret}): refused"
    assert not (tmp_path / "b").exists()


def test_a_link_in_a_plain_directory_is_refused(tmp_path):
    model = small_model(seed=63, shard_bytes=1024)
    src = plain_dir(tmp_path / "dl", model)
    os.symlink("/etc/hostname", src / "extra.txt")
    r = imgtool(None, tmp_path / "cache", "fetch", f"hf:{REPO}={src}", "-o", str(tmp_path / "b"), "--no-tool")
    assert r.returncode == 2
    assert r.stderr.splitlines()[0] == (f"error: hf:{REPO}={src}: extra.txt is a symbolic link: refused (only a "
                                        "Hugging Face cache's snapshot links are followed, into its own blobs/)")


def test_a_damaged_cache_blob_is_refused_naming_the_file(tmp_path):
    model = small_model(seed=64, shard_bytes=4096)
    snap = hf_cache(tmp_path / "hub", model)
    shard = "model-00001-of-00002.safetensors"
    blob = Path(os.path.realpath(snap / shard))
    blob.write_bytes(b"x" * blob.stat().st_size)
    r = imgtool(None, tmp_path / "cache", "fetch", str(snap), "-o", str(tmp_path / "b"), "--no-tool")
    assert r.returncode == 3
    assert r.stderr.splitlines()[:2] == [
        f"error: {snap}: {shard}: the cache's blob {blob.name[:12]} does not hold the bytes its name says; refused",
        "hint: the cache is damaged: download the model again"]


def test_a_directory_naming_no_model_is_refused_before_any_work(tmp_path):
    r = imgtool(None, tmp_path / "cache", "fetch", str(tmp_path), "-o", str(tmp_path / "b"))
    assert r.returncode == 2
    assert r.stderr.splitlines()[0] == (
        f"error: {tmp_path}: a directory names no model by itself: use hf:ORG/NAME=DIR (or modelscope:ORG/NAME=DIR), "
        "or give a Hugging Face cache's snapshot directory (.../models--ORG--NAME/snapshots/<commit>)")


def test_a_spec_and_lock_take_a_local_directory(tmp_path):
    model = small_model(seed=65, shard_bytes=2048)
    src = plain_dir(tmp_path / "dl", model)
    spec = tmp_path / "bundle.toml"
    spec.write_text(f'models = ["hf:{REPO}={src}"]\noutput = "out"\n')
    r = imgtool(None, tmp_path / "cache", "lock", "-f", str(spec))
    assert r.returncode == 0, r.stderr
    (locked,) = json.loads((tmp_path / "bundle.lock").read_text())["models"]
    assert locked["ref"] == f"hf:{REPO}={src}" and locked["source"] == str(src)
    f = imgtool(None, tmp_path / "cache", "fetch", "-f", str(spec), "--no-tool", cwd=tmp_path)
    assert f.returncode == 0, f.stderr
    assert_carries(tmp_path / "out", model)
