"""The model hubs on loopback (tests/support/hub.py) and the seeded models (tests/support/models.py) are faithful:
the real huggingface_hub and modelscope clients download from them, find what they wrote again offline, and
safetensors opens every weight file; each fault switch does what it says."""

import hashlib
import http.client
import json
import os
import time
from pathlib import Path
from typing import Dict, Optional, Tuple
from urllib.parse import urlsplit

import pytest

from tests.support.hub import Hub
from tests.support.hubclients import ClientFailed, run_clients
from tests.support.models import HubModel, big_model, seeded_bytes, small_model, two_revisions

SHARD1 = "model-00001-of-00002.safetensors"


def get(url: str, method: str = "GET", headers: Optional[Dict[str, str]] = None) -> Tuple[int, Dict[str, str], bytes]:
    """One request, redirects not followed: (status, headers with lower-case names, body)."""
    u = urlsplit(url)
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    try:
        c.request(method, u.path + (f"?{u.query}" if u.query else ""), headers=headers or {})
        r = c.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        c.close()


def assert_snapshot(path: Path, model: HubModel, commit: Optional[str] = None) -> None:
    """Every file of the revision is there, byte for byte, and nothing else."""
    rev = model.revisions[commit] if commit else model.head
    found = sorted(str(p.relative_to(path)) for p in path.rglob("*") if p.is_file() and ".cache" not in p.parts)
    assert found == sorted(rev.files)
    for name, f in rev.files.items():
        assert (path / name).read_bytes() == f.read(), name


@pytest.fixture
def model() -> HubModel:
    return small_model(seed=48)


# --- the models -------------------------------------------------------------------------------------------------

def test_a_model_is_the_same_bytes_from_the_same_seed_and_opens_in_safetensors():
    from safetensors import safe_open

    a, b = small_model(seed=7, shards=3), small_model(seed=7, shards=3)
    assert {p: f.sha256 for p, f in a.head.files.items()} == {p: f.sha256 for p, f in b.head.files.items()}
    assert small_model(seed=8).head.files[SHARD1].sha256 != small_model(seed=7).head.files[SHARD1].sha256
    assert sorted(a.head.files) == [".gitattributes", "README.md", "config.json", "generation_config.json",
                                    "model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
                                    "model-00003-of-00003.safetensors", "model.safetensors.index.json",
                                    "tokenizer.json", "tokenizer_config.json"]
    index = json.loads(a.head.files["model.safetensors.index.json"].read())
    tensors = 0
    for i in range(1, 4):
        f = a.head.files[f"model-0000{i}-of-00003.safetensors"]
        with safe_open_bytes(f.read()) as path, safe_open(str(path), "numpy") as st:
            for name in st.keys():
                assert index["weight_map"][name] == f.path
                tensors += st.get_tensor(name).nbytes
    assert tensors == index["metadata"]["total_size"]


class safe_open_bytes:
    """A temporary file holding `data` (safe_open reads files, not bytes)."""

    def __init__(self, data: bytes):
        import tempfile

        self.dir = tempfile.TemporaryDirectory()
        self.path = Path(self.dir.name, "x.safetensors")
        self.path.write_bytes(data)

    def __enter__(self) -> Path:
        return self.path

    def __exit__(self, *exc) -> None:
        self.dir.cleanup()


def test_two_revisions_differ_in_one_shard_only():
    m = two_revisions(seed=3)
    old, new = m.revisions[m.refs["v1"]], m.head
    assert old.commit != new.commit and len(old.commit) == len(new.commit) == 40
    changed = [p for p in new.files if new.files[p].sha256 != old.files[p].sha256]
    assert changed == ["model-00002-of-00002.safetensors"]


def test_a_big_shard_is_streamed_to_disk_in_the_safetensors_format(tmp_path):
    from safetensors import safe_open

    m = big_model(seed=5, directory=tmp_path / "a", shards=2, shard_bytes=3 << 20, hidden=512, tensor_bytes=1 << 20,
                  changed_shard=0)
    again = big_model(seed=5, directory=tmp_path / "b", shards=2, shard_bytes=3 << 20, hidden=512, tensor_bytes=1 << 20)
    f = m.head.files["model-00001-of-00002.safetensors"]
    assert f.source is not None and f.size == f.source.stat().st_size > 3 << 20
    assert f.sha256 == hashlib.sha256(f.source.read_bytes()).hexdigest()
    assert again.head.files[f.path].sha256 == f.sha256, "the same seed writes the same bytes"
    with safe_open(str(f.source), "numpy") as st:
        assert list(st.keys()) == ["model.layers.0.part0.weight", "model.layers.0.part1.weight",
                                   "model.layers.0.part2.weight"]
        assert st.get_slice("model.layers.0.part1.weight").get_shape() == [1024, 512]
        assert st.get_slice("model.layers.0.part1.weight").get_dtype() == "BF16"
        assert st.metadata() == {"format": "pt"}
    old = m.revisions[m.refs["v1"]]
    assert [p for p in old.files if old.files[p].sha256 != m.head.files[p].sha256] == [f.path]
    # a rerun keeps the shards it finds whole
    mtime = f.source.stat().st_mtime_ns
    big_model(seed=5, directory=tmp_path / "a", shards=2, shard_bytes=3 << 20, hidden=512, tensor_bytes=1 << 20)
    assert f.source.stat().st_mtime_ns == mtime


# --- Hugging Face: the real client ------------------------------------------------------------------------------

def test_huggingface_hub_downloads_a_snapshot_and_finds_it_again_offline(model, tmp_path):
    cache = tmp_path / "hub"
    with Hub([model], "hf", page_size=4) as hub:  # 4 entries a page: the client follows the Link header
        env = {"HF_ENDPOINT": hub.url}
        [path] = run_clients([("hf_snapshot_download", {"repo_id": model.repo_id, "revision": "main",
                                                        "cache_dir": str(cache)})], env, tmp_path)
        commit = model.head.commit
        repo = cache / "models--imgtool-test--tiny-llm"
        assert path == str(repo / "snapshots" / commit)
        assert_snapshot(Path(path), model)
        assert (repo / "refs" / "main").read_text() == commit
        tree = json.loads((repo / "trees" / f"{commit}.json").read_text())
        assert tree["format_version"] == 1 and sorted(tree["files"]) == sorted(model.head.files)
        for name, f in model.head.files.items():
            link = repo / "snapshots" / commit / name
            blob = f.sha256 if f.lfs else f.blob_id
            assert os.readlink(link) == f"../../blobs/{blob}", name
            entry = {"size": f.size, "blob_id": f.blob_id, **({"lfs_sha256": f.sha256, "lfs_size": f.size} if f.lfs else {})}
            assert tree["files"][name] == entry
        routes = [(r.method, r.route) for r in hub.requests]
        assert routes[:4] == [("GET", "/api/models/imgtool-test/tiny-llm/revision/main")] + \
            [("GET", f"/api/models/imgtool-test/tiny-llm/tree/{commit}")] * 3
        assert sorted(routes[4:]) == sorted((m, f"/imgtool-test/tiny-llm/resolve/{commit}/{p}")
                                            for p in model.head.files for m in ("HEAD", "GET"))

        hub.clear()
        for offline, local in (({"HF_HUB_OFFLINE": "1"}, False), ({}, True)):
            paths = run_clients([
                ("hf_snapshot_download", {"repo_id": model.repo_id, "revision": "main", "cache_dir": str(cache),
                                          "local_files_only": local}),
                ("hf_hub_download", {"repo_id": model.repo_id, "filename": SHARD1, "revision": "main",
                                     "cache_dir": str(cache), "local_files_only": local})], {**env, **offline}, tmp_path)
            assert paths == [str(repo / "snapshots" / commit), str(repo / "snapshots" / commit / SHARD1)]
        assert hub.requests == [], "offline, the client asks nothing"


def test_hf_hub_download_fetches_one_file_by_branch_and_by_commit(model, tmp_path):
    with Hub([model], "hf") as hub:
        for rev in ("main", model.head.commit):
            cache = tmp_path / rev
            [path] = run_clients([("hf_hub_download", {"repo_id": model.repo_id, "filename": SHARD1, "revision": rev,
                                                       "cache_dir": str(cache)})], {"HF_ENDPOINT": hub.url}, tmp_path)
            assert Path(path).read_bytes() == model.head.files[SHARD1].read()
            assert (cache / "models--imgtool-test--tiny-llm" / "refs" / "main").exists() == (rev == "main")
        assert [(r.method, r.route) for r in hub.requests] == [
            ("HEAD", f"/imgtool-test/tiny-llm/resolve/main/{SHARD1}"),
            ("GET", f"/imgtool-test/tiny-llm/resolve/main/{SHARD1}"),
            ("HEAD", f"/imgtool-test/tiny-llm/resolve/{model.head.commit}/{SHARD1}"),
            ("GET", f"/imgtool-test/tiny-llm/resolve/{model.head.commit}/{SHARD1}")]


def test_a_gated_model_behind_the_storage_bridge_the_token_goes_to_the_hub_only(model, tmp_path):
    with Hub([model], "hf") as hub:
        hub.faults.token = "hf_sekrit"
        hub.faults.redirect = True
        env = {"HF_ENDPOINT": hub.url}
        with pytest.raises(ClientFailed) as e:
            run_clients([("hf_snapshot_download", {"repo_id": model.repo_id, "cache_dir": str(tmp_path / "no")})],
                        env, tmp_path)
        assert "GatedRepoError" in e.value.stderr
        hub.clear()
        [path] = run_clients([("hf_snapshot_download", {"repo_id": model.repo_id, "cache_dir": str(tmp_path / "yes")})],
                             {**env, "HF_TOKEN": "hf_sekrit"}, tmp_path)
        assert_snapshot(Path(path), model)
        assert all(r.headers.get("authorization") == "Bearer hf_sekrit" for r in hub.requests_to("hub"))
        bridged = hub.requests_to("bridge")
        assert sorted(r.route.split("/")[-1] for r in bridged) == sorted(p for p, f in model.head.files.items() if f.lfs)
        assert all("authorization" not in r.headers and r.status == 200 for r in bridged)


# --- ModelScope: the real client --------------------------------------------------------------------------------

def test_modelscope_downloads_a_snapshot_and_finds_it_again_offline(tmp_path):
    model = small_model(seed=48, repo_id="imgtool-test/tiny-llm-0.5B")  # a dot: the old cache layout spelled it ___
    cache = tmp_path / "ms"
    with Hub([model], "modelscope") as hub:
        env = {"MODELSCOPE_DOMAIN": hub.url, "MODELSCOPE_CACHE": str(cache)}
        [path] = run_clients([("ms_snapshot_download", {"model_id": model.repo_id})], env, tmp_path)
        snapshot = cache / "models" / "imgtool-test--tiny-llm-0.5B" / "snapshots" / "master"
        assert path == str(snapshot)
        assert_snapshot(snapshot, model)
        routes = [(r.method, r.route, r.query.get("Revision"), r.query.get("FilePath")) for r in hub.requests]
        assert routes[0] == ("GET", "/api/v1/models/imgtool-test/tiny-llm-0.5B/repo/files", "master", None)
        assert hub.requests[0].query["Recursive"] == "True"
        assert sorted(x for x in routes[1:] if x[1] != "/api/v1/repos/internalAccelerationInfo") == sorted(
            ("GET", "/api/v1/models/imgtool-test/tiny-llm-0.5B/repo", "master", p) for p in model.head.files)

        hub.clear()
        paths = run_clients([
            ("ms_snapshot_download", {"model_id": model.repo_id, "local_files_only": True}),
            ("ms_file_download", {"model_id": model.repo_id, "file_path": SHARD1, "revision": "master",
                                  "local_files_only": True})], env, tmp_path)
        assert paths == [str(snapshot), str(snapshot / SHARD1)]
        assert hub.requests == []


def test_modelscope_offline_reads_the_old_cache_layout_first(tmp_path):
    # what modelscope <= 1.37 wrote, and the current client still prefers: {cache}/models/ORG/NAME with . as ___
    model = small_model(seed=48, repo_id="imgtool-test/tiny-llm-0.5B")
    old = tmp_path / "ms" / "models" / "imgtool-test" / "tiny-llm-0___5B"
    for name, f in model.head.files.items():
        (old / name).parent.mkdir(parents=True, exist_ok=True)
        (old / name).write_bytes(f.read())
    paths = run_clients([("ms_snapshot_download", {"model_id": model.repo_id, "local_files_only": True}),
                         ("ms_file_download", {"model_id": model.repo_id, "file_path": SHARD1, "revision": "master",
                                               "local_files_only": True})],
                        {"MODELSCOPE_CACHE": str(tmp_path / "ms")}, tmp_path)
    assert paths == [str(old), str(old / SHARD1)]


def test_modelscope_through_the_storage_bridge_with_a_token(tmp_path, model):
    with Hub([model], "modelscope") as hub:
        hub.faults.token = "ms-sekrit"
        hub.faults.redirect = True
        env = {"MODELSCOPE_DOMAIN": hub.url, "MODELSCOPE_CACHE": str(tmp_path / "ms"), "MODELSCOPE_API_TOKEN": "ms-sekrit"}
        [path] = run_clients([("ms_snapshot_download", {"model_id": model.repo_id})], env, tmp_path)
        assert_snapshot(Path(path), model)
        bridged = hub.requests_to("bridge")
        assert sorted(r.route.split("/")[-1] for r in bridged) == sorted(p for p, f in model.head.files.items() if f.lfs)
        assert all("authorization" not in r.headers and "cookie" not in r.headers and r.status == 200 for r in bridged)
        assert all(r.headers.get("cookie") == "m_session_id=ms-sekrit" for r in hub.requests_to("hub")
                   if r.route.startswith("/api/v1/models/"))


# --- the fault switches -----------------------------------------------------------------------------------------

def test_range_is_honoured_or_ignored_on_the_hub_and_on_the_bridge(model):
    data = model.head.files[SHARD1].read()
    with Hub([model], "hf") as hub:
        url = f"{hub.url}/{model.repo_id}/resolve/main/{SHARD1}"
        status, h, body = get(url, headers={"Range": "bytes=100-199"})
        assert (status, h["content-range"], body) == (206, f"bytes 100-199/{len(data)}", data[100:200])
        assert get(url, headers={"Range": f"bytes={len(data)}-"})[:2][0] == 416
        hub.faults.redirect = True
        status, h, _ = get(url, "HEAD")
        assert status == 302 and h["location"].startswith(hub.bridge_url + "/")
        assert (h["x-linked-etag"], h["x-linked-size"], h["x-repo-commit"]) == (
            f'"{hashlib.sha256(data).hexdigest()}"', str(len(data)), model.head.commit)
        status, h, body = get(h["location"], headers={"Range": "bytes=-10"})
        assert (status, body) == (206, data[-10:])
        hub.faults.honour_range = False
        for u in (url, get(url, "HEAD")[1]["location"]):
            status, h, body = get(u, headers={"Range": "bytes=100-199"})
            if status == 302:
                continue
            assert (status, "content-range" in h, body) == (200, False, data)
        assert [(r.server, r.status, r.range) for r in hub.requests if r.range] == [
            ("hub", 206, "bytes=100-199"), ("hub", 416, f"bytes={len(data)}-"), ("bridge", 206, "bytes=-10"),
            ("hub", 302, "bytes=100-199"), ("bridge", 200, "bytes=100-199")]


def test_the_bridge_refuses_a_login(model):
    with Hub([model], "hf") as hub:
        hub.faults.redirect = True
        location = get(f"{hub.url}/{model.repo_id}/resolve/main/{SHARD1}", "HEAD")[1]["location"]
        status, _, body = get(location, headers={"Authorization": "Bearer hf_x"})
        assert status == 400 and b"Only one auth mechanism allowed" in body


def test_429_and_5xx_for_the_first_requests_then_the_answer(model):
    with Hub([model], "modelscope") as hub:
        hub.faults.fail(2, 429, retry_after=3, match=lambda method, path: path.endswith("/repo"))
        hub.faults.fail(1, 503)
        url = f"{hub.url}/api/v1/models/{model.repo_id}/repo?Revision=master&FilePath=config.json"
        answers = [get(url) for _ in range(4)]
        assert [a[0] for a in answers] == [429, 429, 503, 200]
        assert answers[0][1]["retry-after"] == "3" and "retry-after" not in answers[2][1]
        assert answers[3][2] == model.head.files["config.json"].read()


def test_a_lying_sha256_is_what_the_metadata_says_and_not_what_the_bytes_are(model):
    lie = "0" * 64
    data = model.head.files[SHARD1].read()
    with Hub([model], "hf") as hf, Hub([model], "modelscope") as ms:
        for hub in (hf, ms):
            hub.faults.lie_sha256[SHARD1] = lie
        tree = json.loads(get(f"{hf.url}/api/models/{model.repo_id}/tree/main?recursive=true")[2])
        info = json.loads(get(f"{hf.url}/api/models/{model.repo_id}/revision/main?blobs=true")[2])
        head = get(f"{hf.url}/{model.repo_id}/resolve/main/{SHARD1}", "HEAD")[1]
        files = json.loads(get(f"{ms.url}/api/v1/models/{model.repo_id}/repo/files?Revision=master&Recursive=true")[2])
        assert [e["lfs"]["oid"] for e in tree if e["path"] == SHARD1] == [lie]
        assert [s["lfs"]["sha256"] for s in info["siblings"] if s["rfilename"] == SHARD1] == [lie]
        assert head["x-linked-etag"] == head["etag"] == f'"{lie}"'
        assert [f["Sha256"] for f in files["Data"]["Files"] if f["Path"] == SHARD1] == [lie]
        for url in (f"{hf.url}/{model.repo_id}/resolve/main/{SHARD1}",
                    f"{ms.url}/api/v1/models/{model.repo_id}/repo?Revision=master&FilePath={SHARD1}"):
            assert get(url)[2] == data and hashlib.sha256(data).hexdigest() != lie


def test_hostile_names_are_listed_and_served_as_given(model):
    hostile = {"../escape.txt": b"up", "/etc/evil.txt": b"abs", "bad\x1bname.txt": b"ctl"}
    with Hub([model], "hf") as hf, Hub([model], "modelscope") as ms:
        for hub in (hf, ms):
            hub.faults.extra_files.update(hostile)
        tree = json.loads(get(f"{hf.url}/api/models/{model.repo_id}/tree/main?recursive=true")[2])
        files = json.loads(get(f"{ms.url}/api/v1/models/{model.repo_id}/repo/files?Revision=master&Recursive=true")[2])
        for name in hostile:
            assert name in [e["path"] for e in tree if e["type"] == "file"]
            assert name in [f["Path"] for f in files["Data"]["Files"] if f["Type"] == "blob"]
        from urllib.parse import quote
        assert get(f"{ms.url}/api/v1/models/{model.repo_id}/repo?Revision=master&FilePath={quote('../escape.txt')}")[2] == b"up"


def test_a_file_that_grows_after_the_listing(model):
    f = model.head.files[SHARD1]
    with Hub([model], "hf") as hub:
        hub.faults.grow[SHARD1] = 1000
        tree = json.loads(get(f"{hub.url}/api/models/{model.repo_id}/tree/main?recursive=true")[2])
        assert [e["size"] for e in tree if e["path"] == SHARD1] == [f.size]
        status, h, body = get(f"{hub.url}/{model.repo_id}/resolve/main/{SHARD1}")
        assert (status, int(h["content-length"]), len(body)) == (200, f.size + 1000, f.size + 1000)
        assert body[:f.size] == f.read() and body[f.size:] == b"".join(seeded_bytes(b"grown:" + SHARD1.encode(), 1000))
        status, h, body = get(f"{hub.url}/{model.repo_id}/resolve/main/{SHARD1}", headers={"Range": f"bytes={f.size}-"})
        assert (status, len(body)) == (206, 1000)


def test_a_dripping_source_sends_at_the_set_rate(model):
    with Hub([model], "hf") as hub:
        hub.faults.drip = 20_000
        t = time.monotonic()
        status, _, body = get(f"{hub.url}/{model.repo_id}/resolve/main/{SHARD1}", headers={"Range": "bytes=0-3999"})
        took = time.monotonic() - t
        assert (status, len(body)) == (206, 4000)
        assert 0.2 <= took < 2


def test_a_gated_model_answers_401_without_the_token_on_either_hub(model):
    with Hub([model], "hf") as hf, Hub([model], "modelscope") as ms:
        for hub in (hf, ms):
            hub.faults.token = "t0k"
        status, h, _ = get(f"{hf.url}/api/models/{model.repo_id}/revision/main")
        assert (status, h["x-error-code"]) == (401, "GatedRepo")
        assert get(f"{hf.url}/api/models/{model.repo_id}/revision/main", headers={"Authorization": "Bearer t0k"})[0] == 200
        url = f"{ms.url}/api/v1/models/{model.repo_id}/repo/files?Revision=master"
        assert get(url)[0] == 401
        assert get(url, headers={"Authorization": "Bearer t0k"})[0] == 200
        assert [(r.method, r.route, r.headers.get("authorization")) for r in ms.requests] == [
            ("GET", f"/api/v1/models/{model.repo_id}/repo/files", None),
            ("GET", f"/api/v1/models/{model.repo_id}/repo/files", "Bearer t0k")]
