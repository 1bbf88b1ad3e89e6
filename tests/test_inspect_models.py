"""`imgtool inspect hf:ORG/NAME[@REV]` (issue 48): the commit, every endpoint's answer, each file's size and sha256,
against the loopback hubs of tests/support/hub.py through the real CLI."""

import json

import pytest

from tests.support.hub import Hub
from tests.support.models import small_model, two_revisions
from tests.test_fetch_models import REPO, imgtool


@pytest.mark.parametrize("flavour", ["hf", "modelscope"])
def test_inspect_of_a_model_shows_its_commit_the_endpoint_and_each_files_size_and_sha256(flavour, tmp_path):
    model = small_model(seed=52, shard_bytes=64 << 10)
    rev = model.head
    with Hub([model], flavour=flavour) as hub:
        r = imgtool(hub, tmp_path / "cache", "inspect", f"{flavour}:{REPO}")
        assert r.returncode == 0, r.stderr
        j = imgtool(hub, tmp_path / "cache", "inspect", f"{flavour}:{REPO}", "--json")
        assert j.returncode == 0, j.stderr
    lines = r.stdout.splitlines()
    variable = "HF_ENDPOINT" if flavour == "hf" else "MODELSCOPE_DOMAIN"  # the variable the endpoint was given in
    assert lines[:2] == [f"{flavour}:{REPO}", f"commit:  {rev.commit}"]
    assert lines[3].startswith(f"source:  {variable} ({hub.url}): ") and lines[3].endswith(" ms")
    files = sorted(rev.files.values(), key=lambda f: f.path)
    assert lines[4:6] == ["", lines[5]] and lines[5].split() == ["FILE", "BYTES", "SHA256"]
    assert [line.split() for line in lines[6:]] == [[f.path, str(f.size), "sha256:" + f.sha256] for f in files]
    doc = json.loads(j.stdout)
    assert (doc["ref"], doc["commit"], doc["size"]) == (f"{flavour}:{REPO}", rev.commit, sum(f.size for f in files))
    assert [(e["name"], e["url"], e["commit"], e["stale"]) for e in doc["endpoints"]] == [
        (variable, hub.url, rev.commit, False)]
    assert [(f["path"], f["size"], f["sha256"]) for f in doc["files"]] == [
        (f.path, f.size, "sha256:" + f.sha256) for f in files]


def test_inspect_of_a_revision_names_that_revisions_commit(tmp_path):
    model = two_revisions(seed=53, shards=2, shard_bytes=32 << 10)
    with Hub([model], flavour="hf") as hub:
        r = imgtool(hub, tmp_path / "cache", "inspect", f"hf:{REPO}@v1", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert (doc["ref"], doc["commit"]) == (f"hf:{REPO}@v1", model.refs["v1"])
    assert {f["path"]: f["sha256"] for f in doc["files"]} == {
        p: "sha256:" + f.sha256 for p, f in model.resolve("v1").files.items()}


def test_inspect_of_an_unknown_model_says_so(tmp_path):
    with Hub([small_model(seed=54, shard_bytes=1024)], flavour="hf") as hub:
        r = imgtool(hub, tmp_path / "cache", "inspect", "hf:imgtool-test/no-such-model")
    host = hub.url.split("://", 1)[1].rstrip("/")
    assert (r.returncode, r.stderr.splitlines()[0]) == (
        4, f"error: hf:imgtool-test/no-such-model@main: not found on {host} (no such model (HTTP 404 RepoNotFound))"), \
        r.stderr
