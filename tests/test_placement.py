"""Placing a model on the offline host (imgtool/placement.py, imgtool/placer.py): the real huggingface_hub and modelscope
clients find what was placed without the network, safetensors opens it, and a damaged file, a kill, a second revision
and a second placement do what docs/models.md says."""

import json
import os
import re
import signal
import stat
import hashlib
import subprocess
import time
from pathlib import Path
from typing import Dict, Iterator, List, Optional

import pytest

from imgtool import config, filecopy
from imgtool.dirlock import DirectoryBusy, lock_output
from imgtool.errors import EXIT_VERIFY, ImgtoolError
from imgtool.filecopy import Regions
from imgtool.model import Digest
from imgtool.placement import CACHEDIR_TAG, STAGING_PREFIX, hf_link, layout
from imgtool.placer import PlacementDamaged, place_model
from imgtool.weights import ModelFile, ModelRef, ModelSnapshot
from tests.support.hub import Hub
from tests.support.hubclients import client_python, run_clients
from tests.support.models import HubModel, Revision, small_model, two_revisions
from tests.support.pythons import pyenv_python
from tests.support.smallfs import small_fs

ROOT = Path(__file__).resolve().parents[1]
SHARD1, SHARD2 = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
DOTTED = "imgtool-test/tiny-llm-0.5B"  # ModelScope's cache spells the dot ___


def snapshot_of(model: HubModel, revision: str = "main", hub: str = "hf", git_oids: bool = True) -> ModelSnapshot:
    """The snapshot a bundle carries of `model` at `revision` (git_oids False: a ModelScope listing, no blob ids)."""
    rev = model.resolve(revision)
    assert rev is not None
    files = tuple(ModelFile(f.path, f.size, Digest("sha256", f.sha256), f.blob_id if git_oids else None, f.lfs)
                  for f in rev.files.values())
    return ModelSnapshot(ModelRef(hub, model.repo_id, revision), rev.commit, files)


def reader(rev: Revision, damage: Optional[str] = None, short: Optional[str] = None):
    """Each file's bytes from the model, in pieces; `damage`: that file with one byte changed; `short`: cut short."""
    def read(f: ModelFile) -> Iterator[bytes]:
        data = rev.files[f.path].read()
        if f.path == damage:
            data = data[:100] + bytes([data[100] ^ 1]) + data[101:]
        if f.path == short:
            data = data[:-1]
        for i in range(0, len(data), 4096):
            yield data[i:i + 4096]
    return read


def tree(root: Path) -> Dict[str, str]:
    """Every path under root: 'link -> target', a file's size and mode, a directory's mode."""
    out = {}
    for here, dirs, files in os.walk(root):
        for name in dirs + files:
            p = Path(here, name)
            rel = p.relative_to(root).as_posix()
            st = os.lstat(p)
            if stat.S_ISLNK(st.st_mode):
                out[rel] = "-> " + os.readlink(p)
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = f"dir {stat.S_IMODE(st.st_mode):o}"
            else:
                out[rel] = f"{st.st_size} {stat.S_IMODE(st.st_mode):o}"
    return out


def hf_offline(cache: Path, repo: str, revision: str, files: List[str], home: Path) -> List[str]:
    """What the real huggingface_hub returns offline (HF_HUB_OFFLINE=1, and local_files_only): the snapshot and
    each file, asserted the same both ways."""
    calls = [("hf_snapshot_download", {"repo_id": repo, "revision": revision, "cache_dir": str(cache),
                                       "local_files_only": True})]
    calls += [("hf_hub_download", {"repo_id": repo, "filename": f, "revision": revision, "cache_dir": str(cache),
                                   "local_files_only": True}) for f in files]
    found = run_clients(calls, {"HF_HUB_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9"}, home)
    return found


# --- the Hugging Face cache ---------------------------------------------------------------------------------------

def test_the_placed_hf_cache_is_what_huggingface_hub_writes_and_it_finds_it_offline(tmp_path):
    model = small_model(seed=48)
    snapshot = snapshot_of(model)
    placed_root = tmp_path / "placed"
    done = place_model(snapshot, "hf", placed_root, reader(model.head))
    repo = placed_root / "models--imgtool-test--tiny-llm"
    commit = model.head.commit
    assert done.path == repo / "snapshots" / commit and not done.unchanged
    assert done.line() == f"placed hf:imgtool-test/tiny-llm@main (commit {commit[:12]}) in {done.path} (9 files, 85.2 KiB)"
    assert done.written == snapshot.size

    # the real client's own download of the same model, for comparison: the same names, links, tree listing and ref
    with Hub([model], "hf") as hub:
        run_clients([("hf_snapshot_download", {"repo_id": model.repo_id, "cache_dir": str(tmp_path / "client")})],
                    {"HF_ENDPOINT": hub.url}, tmp_path)
    client = tmp_path / "client"
    theirs = {k: v for k, v in tree(client).items() if not k.startswith(".locks")}
    ours = tree(placed_root)
    assert sorted(ours) == sorted(theirs)
    for path, what in theirs.items():
        if what.startswith("->"):
            assert ours[path] == what, path
    mine = json.loads((repo / "trees" / f"{commit}.json").read_text())
    assert mine == json.loads((client / "models--imgtool-test--tiny-llm" / "trees" / f"{commit}.json").read_text())
    assert (repo / "refs" / "main").read_bytes() == commit.encode()  # no newline, as the client writes it
    assert (placed_root / "CACHEDIR.TAG").read_text() == CACHEDIR_TAG == (client / "CACHEDIR.TAG").read_text()

    found = hf_offline(placed_root, model.repo_id, "main", sorted(model.head.files), tmp_path)
    assert found == [str(done.path)] + [str(done.path / f) for f in sorted(model.head.files)]
    for f in sorted(model.head.files):
        assert Path(done.path / f).read_bytes() == model.head.files[f].read()
    # by commit too (no ref asked)
    [by_commit] = run_clients([("hf_snapshot_download", {"repo_id": model.repo_id, "revision": commit,
                                                         "cache_dir": str(placed_root), "local_files_only": True})],
                              {"HF_HUB_OFFLINE": "1"}, tmp_path)
    assert by_commit == str(done.path)


def test_read_only_modes_and_what_vllm_and_safetensors_read(tmp_path):
    from safetensors import safe_open

    model = small_model(seed=48)
    done = place_model(snapshot_of(model), "hf", tmp_path, reader(model.head))
    blobs = done.path.parent.parent / "blobs"
    assert {stat.S_IMODE(p.lstat().st_mode) for p in blobs.iterdir()} == {0o444}
    assert stat.S_IMODE(done.path.stat().st_mode) == 0o555
    assert stat.S_IMODE((done.path.parent.parent / "trees" / f"{model.head.commit}.json").stat().st_mode) == 0o444
    # vLLM's path resolution: `vllm serve <snapshot>` reads config.json and the weights the index names, beside it
    assert json.loads((done.path / "config.json").read_text())["architectures"] == ["Qwen2ForCausalLM"]
    index = json.loads((done.path / "model.safetensors.index.json").read_text())
    assert sorted(set(index["weight_map"].values())) == [SHARD1, SHARD2]
    for shard in (SHARD1, SHARD2):
        with safe_open(str(done.path / shard), framework="numpy") as st:
            names = list(st.keys())
            assert names and all(st.get_tensor(n).size for n in names)
        assert sorted(names) == sorted(t for t, s in index["weight_map"].items() if s == shard)


def test_a_modelscope_listing_placed_in_the_hf_cache_gets_the_git_blob_ids_computed(tmp_path):
    model = small_model(seed=48)
    done = place_model(snapshot_of(model, git_oids=False), "hf", tmp_path, reader(model.head))
    entries = json.loads((tmp_path / "models--imgtool-test--tiny-llm" / "trees" / f"{model.head.commit}.json").read_text())
    for name, f in model.head.files.items():
        assert entries["files"][name]["blob_id"] == f.blob_id, name
        assert os.readlink(done.path / name) == hf_link(name, f.sha256 if f.lfs else f.blob_id)
    assert hf_offline(tmp_path, model.repo_id, "main", [SHARD1], tmp_path)[1] == str(done.path / SHARD1)


def test_a_second_revision_writes_only_the_changed_shard_and_keeps_the_blobs(tmp_path):
    model = two_revisions(seed=48)
    v1 = place_model(snapshot_of(model, "v1"), "hf", tmp_path, reader(model.resolve("v1")))
    blobs = tmp_path / "models--imgtool-test--tiny-llm" / "blobs"
    before = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in blobs.iterdir()}
    main = place_model(snapshot_of(model, "main"), "hf", tmp_path, reader(model.head))
    assert main.written == model.head.files[SHARD2].size and main.kept == len(model.head.files) - 1
    assert main.line().endswith("(9 files, 85.2 KiB; 8 held already)")
    after = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in blobs.iterdir()}
    assert {k: v for k, v in after.items() if k in before} == before  # not one blob rewritten
    assert set(after) - set(before) == {model.head.files[SHARD2].sha256}
    repo = tmp_path / "models--imgtool-test--tiny-llm"
    assert (repo / "refs" / "v1").read_text() == v1.commit and (repo / "refs" / "main").read_text() == main.commit
    assert hf_offline(tmp_path, model.repo_id, "v1", [SHARD2], tmp_path) == [str(v1.path), str(v1.path / SHARD2)]
    assert hf_offline(tmp_path, model.repo_id, "main", [SHARD2], tmp_path) == [str(main.path), str(main.path / SHARD2)]


@pytest.mark.parametrize("target", ["hf", "modelscope", "dir"])
def test_a_second_placement_of_an_unchanged_model_does_nothing(tmp_path, target):
    model = small_model(seed=48)
    first = place_model(snapshot_of(model), target, tmp_path, reader(model.head))
    before = tree(tmp_path)
    again = place_model(snapshot_of(model), target, tmp_path, reader(model.head, damage=SHARD1))  # never read
    assert again.unchanged and again.written == 0 and again.path == first.path
    assert again.line() == f"hf:imgtool-test/tiny-llm@main is placed already in {first.path} (9 files, 85.2 KiB): nothing to do"
    assert tree(tmp_path) == before


# --- ModelScope and a plain directory ----------------------------------------------------------------------------

def test_modelscope_finds_its_placed_copy_without_the_network_at_the_default_root(tmp_path, monkeypatch):
    model = small_model(seed=48, repo_id=DOTTED)
    monkeypatch.setenv("HOME", str(tmp_path))
    for name in ("MODELSCOPE_CACHE", "MS_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    root = config.modelscope_cache()
    assert root == tmp_path / ".cache" / "modelscope" / "hub"
    done = place_model(snapshot_of(model, "master", hub="modelscope"), "modelscope", root, reader(model.head))
    assert done.path == root / "models" / "imgtool-test" / "tiny-llm-0___5B"
    assert stat.S_IMODE(done.path.stat().st_mode) == 0o555
    assert {stat.S_IMODE((done.path / f).stat().st_mode) for f in model.head.files} == {0o444}
    assert sorted(p.name for p in done.path.iterdir()) == sorted(
        [".imgtool-model.json", ".mdl", ".msc", ".mv"] + list(model.head.files))
    dead = "http://127.0.0.1:9"  # nothing listens: any request fails
    for env in ({}, {"MODELSCOPE_CACHE": str(root)}):  # the client's default cache (~/.cache/modelscope), and ours
        paths = run_clients([("ms_snapshot_download", {"model_id": DOTTED, "local_files_only": True}),
                             ("ms_file_download", {"model_id": DOTTED, "file_path": SHARD1, "revision": "master",
                                                   "local_files_only": True})],
                            {"MODELSCOPE_DOMAIN": dead, **env}, tmp_path)
        assert paths == [str(done.path), str(done.path / SHARD1)]


def test_a_new_revision_replaces_a_modelscope_or_plain_directory_whole(tmp_path):
    model = two_revisions(seed=48)
    for target in ("modelscope", "dir"):
        v1 = place_model(snapshot_of(model, "v1", hub="modelscope"), target, tmp_path, reader(model.resolve("v1")))
        head = place_model(snapshot_of(model, "master", hub="modelscope"), target, tmp_path, reader(model.head))
        assert head.path == v1.path and not head.unchanged
        assert (head.path / SHARD2).read_bytes() == model.head.files[SHARD2].read()
        assert json.loads((head.path / ".imgtool-model.json").read_text())["commit"] == model.head.commit
        assert not [p for p in head.path.parent.iterdir() if p.name.startswith(STAGING_PREFIX)]
    assert (tmp_path / "imgtool-test" / "tiny-llm" / "config.json").is_file()  # dir: DIR/ORG/NAME


def test_a_directory_imgtool_did_not_place_is_not_replaced_without_force(tmp_path):
    model = small_model(seed=48)
    theirs = tmp_path / "imgtool-test" / "tiny-llm"
    theirs.mkdir(parents=True)
    (theirs / "mine.txt").write_text("a user's own file\n")
    with pytest.raises(ImgtoolError) as e:
        place_model(snapshot_of(model), "dir", tmp_path, reader(model.head))
    assert (e.value.message, e.value.hint) == (
        f"{theirs} exists and was not placed by imgtool: hf:imgtool-test/tiny-llm@main was not placed",
        "move it away, or place with --force to replace it")
    assert sorted(p.name for p in theirs.iterdir()) == ["mine.txt"]
    done = place_model(snapshot_of(model), "dir", tmp_path, reader(model.head), force=True)
    assert not (done.path / "mine.txt").exists() and (done.path / SHARD1).is_file()


# --- refusals -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("target", ["hf", "modelscope", "dir"])
def test_a_damaged_file_places_nothing_and_is_named(tmp_path, target):
    model = small_model(seed=48)
    snapshot = snapshot_of(model)
    want = model.head.files[SHARD2].sha256[:12]
    with pytest.raises(PlacementDamaged) as e:
        place_model(snapshot, target, tmp_path, reader(model.head, damage=SHARD2))
    assert e.value.exit_code == EXIT_VERIFY == 3 and e.value.path == SHARD2
    got = e.value.message.split("sha256:")[1][:12]
    assert e.value.message == (f"hf:imgtool-test/tiny-llm@main: {SHARD2}: its bytes do not match its sha256 "
                               f"(sha256:{got} read, {want} expected); nothing was placed")
    name = Path(str(layout(target, str(tmp_path), snapshot).name))
    assert not name.exists()
    if target == "hf":
        repo = name.parent.parent
        assert sorted(p.name for p in repo.iterdir() if not p.name.startswith(STAGING_PREFIX)) == []
    with pytest.raises(PlacementDamaged) as e:
        place_model(snapshot, target, tmp_path, reader(model.head, short="tokenizer.json"))
    size = model.head.files["tokenizer.json"].size
    assert e.value.message == (f"hf:imgtool-test/tiny-llm@main: tokenizer.json: {size - 1} bytes where the snapshot "
                               f"says {size}; nothing was placed")
    assert not name.exists()
    done = place_model(snapshot, target, tmp_path, reader(model.head))  # the files checked before are kept
    assert done.kept > 0 and done.notes and done.notes[0].startswith("resumed the placement pid ")


def test_what_a_stopped_placement_of_another_commit_staged_is_never_taken_for_this_one(tmp_path):
    # v1 and main differ in shard 2 alone, at the same path and size: v1's staged shard must not be kept for main
    model = two_revisions(seed=48)
    assert model.head.files[SHARD2].size == model.resolve("v1").files[SHARD2].size
    with pytest.raises(PlacementDamaged):
        place_model(snapshot_of(model, "v1"), "modelscope", tmp_path, reader(model.resolve("v1"), damage="tokenizer.json"))
    [left] = [p for p in (tmp_path / "models" / "imgtool-test").iterdir() if p.name.startswith(STAGING_PREFIX)]
    done = place_model(snapshot_of(model, "master"), "modelscope", tmp_path, reader(model.head))
    assert done.kept == 0 and done.written == sum(f.size for f in model.head.files.values())
    assert (done.path / SHARD2).read_bytes() == model.head.files[SHARD2].read()
    assert len(done.notes) == 1 and done.notes[0].startswith(f"removed {left} (") and \
        done.notes[0].endswith(f"), left by a stopped placement (pid {os.getpid()})")


def test_a_link_planted_where_a_blob_goes_is_replaced_never_written_through(tmp_path):
    model = small_model(seed=48)
    victim = tmp_path / "victim"
    victim.write_bytes(b"x" * model.head.files[SHARD1].size)  # the blob's size: a size check through the link passes
    blobs = tmp_path / "hub" / "models--imgtool-test--tiny-llm" / "blobs"
    blobs.mkdir(parents=True)
    (blobs / model.head.files[SHARD1].sha256).symlink_to(victim)
    done = place_model(snapshot_of(model), "hf", tmp_path / "hub", reader(model.head))
    blob = blobs / model.head.files[SHARD1].sha256
    assert not blob.is_symlink() and blob.read_bytes() == model.head.files[SHARD1].read()
    assert victim.read_bytes() == b"x" * model.head.files[SHARD1].size and done.kept == 0


def test_not_enough_space_refuses_before_writing_and_force_tries_anyway(tmp_path):
    model = small_model(seed=48, shard_bytes=6 << 20)  # two 6 MiB shards: 12.0 MiB
    with small_fs(tmp_path / "disk", 12 << 20) as disk:
        with pytest.raises(ImgtoolError) as e:
            place_model(snapshot_of(model), "hf", disk / "hub", reader(model.head))
        assert e.value.exit_code == 1
        assert re.fullmatch(f"not enough space to place hf:imgtool-test/tiny-llm@main in "
                            f"{disk / 'hub' / 'models--imgtool-test--tiny-llm'}: it needs 12.0 MiB, "
                            r"(\d+\.\d) MiB is free", e.value.message), e.value.message
        assert e.value.hint == "free space there, or set HF_HUB_CACHE (or HF_HOME); --force tries anyway"
        assert not (disk / "hub" / "models--imgtool-test--tiny-llm" / "blobs").exists()
        with pytest.raises(ImgtoolError) as e:
            place_model(snapshot_of(model), "hf", disk / "hub", reader(model.head), force=True)
        assert "No space left on device; nothing was placed" in e.value.message


def test_a_second_placement_of_the_same_model_at_once_is_refused(tmp_path):
    model = small_model(seed=48)
    folder = tmp_path / "models--imgtool-test--tiny-llm"
    folder.mkdir()
    with lock_output(folder, "load"):
        with pytest.raises(DirectoryBusy) as e:
            place_model(snapshot_of(model), "hf", tmp_path, reader(model.head))
    assert e.value.message == f"{folder} is being written by imgtool load (pid {os.getpid()}); nothing was done"


# --- in another process: Python 3.7, and a kill half-way ---------------------------------------------------------

# Places the model described in argv[1] (JSON) from the files in argv[2] into argv[3] (target) under argv[4]; with
# argv[5], after that many files it writes argv[6] and waits to be killed. Prints Placed.line(), or the error and
# exits with its code, as `imgtool load` will.
PLACER = """
import json, sys, time
sys.path.insert(0, sys.argv[7])
from pathlib import Path
from imgtool.errors import ImgtoolError
from imgtool.model import Digest
from imgtool.placer import place_model
from imgtool.weights import ModelFile, ModelRef, ModelSnapshot
doc = json.loads(sys.argv[1])
snapshot = ModelSnapshot(ModelRef(*doc["ref"]), doc["commit"], tuple(
    ModelFile(p, s, Digest.parse(h), o, l) for p, s, h, o, l in doc["files"]))
stop, seen = int(sys.argv[5]), [0]
def read(f):
    if seen[0] == stop:
        Path(sys.argv[6]).write_text("half")
        time.sleep(600)
    seen[0] += 1
    with open(str(Path(sys.argv[2]) / f.path), "rb") as src:
        while True:
            b = src.read(8192)
            if not b:
                return
            yield b
try:
    print(place_model(snapshot, sys.argv[3], Path(sys.argv[4]), read).line())
except ImgtoolError as e:
    print("error: " + e.message)
    sys.exit(e.exit_code)
"""


def run_placer(python: str, snapshot: ModelSnapshot, src: Path, target: str, root: Path, stop: int = -1,
               flag: Optional[Path] = None, **kw) -> subprocess.Popen:
    doc = {"ref": [snapshot.ref.hub, snapshot.ref.repo, snapshot.ref.revision], "commit": snapshot.commit,
           "files": [[f.path, f.size, str(f.sha256), f.git_oid, f.lfs] for f in snapshot.files]}
    return subprocess.Popen([python, "-I", "-c", PLACER, json.dumps(doc), str(src), target, str(root), str(stop),
                             str(flag or "/nonexistent"), str(ROOT)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, **kw)


def written_out(model: HubModel, where: Path) -> Path:
    for name, f in model.head.files.items():
        (where / name).parent.mkdir(parents=True, exist_ok=True)
        (where / name).write_bytes(f.read())
    return where


def python37() -> str:
    found = pyenv_python("3.7")
    assert found, "python3.7 is not under pyenv's versions: the pyz places models on Kylin's 3.7 (never a skip)"
    return found


def test_python_3_7_places_all_three_layouts_as_this_python_does(tmp_path):
    model = small_model(seed=48, repo_id=DOTTED)
    src = written_out(model, tmp_path / "src")
    for target in ("hf", "modelscope", "dir"):
        snapshot = snapshot_of(model, "main", hub="hf" if target == "hf" else "modelscope")
        p = run_placer(python37(), snapshot, src, target, tmp_path / "py37" / target)
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        place_model(snapshot, target, tmp_path / "here" / target, reader(model.head), created=0)
        ours, theirs = tree(tmp_path / "here" / target), tree(tmp_path / "py37" / target)
        assert sorted(ours) == sorted(theirs) and out.startswith("placed ")
        for path in ours:
            if not path.endswith((".mv", ".msc", ".mdl")):
                assert ours[path] == theirs[path], path
    found = hf_offline(tmp_path / "py37" / "hf", DOTTED, "main", [SHARD1], tmp_path)
    assert found[1].endswith(SHARD1) and Path(found[1]).read_bytes() == model.head.files[SHARD1].read()


def test_a_damaged_file_in_another_process_says_one_line_and_exits_3(tmp_path):
    model = small_model(seed=48)
    src = written_out(model, tmp_path / "src")
    data = bytearray((src / SHARD1).read_bytes())
    data[200] ^= 0xFF
    (src / SHARD1).write_bytes(bytes(data))
    snapshot = snapshot_of(model)
    p = run_placer(python37(), snapshot, src, "hf", tmp_path / "hub")
    out, _ = p.communicate(timeout=120)
    assert p.returncode == 3
    got = hashlib.sha256(bytes(data)).hexdigest()[:12]
    assert out == (f"error: hf:imgtool-test/tiny-llm@main: {SHARD1}: its bytes do not match its sha256 (sha256:{got} "
                   f"read, {model.head.files[SHARD1].sha256[:12]} expected); nothing was placed\n")
    assert not (tmp_path / "hub" / "models--imgtool-test--tiny-llm" / "snapshots").exists()


@pytest.mark.parametrize("target", ["hf", "modelscope"])
def test_a_placement_killed_half_way_shows_nothing_and_the_next_one_finishes_it(tmp_path, target):
    model = small_model(seed=48)
    src = written_out(model, tmp_path / "src")
    snapshot = snapshot_of(model)
    flag = tmp_path / "half"
    p = run_placer(python37(), snapshot, src, target, tmp_path / "root", stop=5, flag=flag)
    deadline = time.monotonic() + 60
    while not flag.exists():
        assert p.poll() is None and time.monotonic() < deadline, p.stderr.read() if p.stderr else ""
        time.sleep(0.05)
    p.send_signal(signal.SIGKILL)
    p.wait(timeout=30)
    name = Path(str(layout(target, str(tmp_path / "root"), snapshot).name))
    assert not name.exists()
    [staged] = [q for q in name.parent.parent.iterdir() if q.name.startswith(STAGING_PREFIX)] if target == "hf" else \
        [q for q in name.parent.iterdir() if q.name.startswith(STAGING_PREFIX)]
    assert staged.name.startswith(f"{STAGING_PREFIX}{p.pid}-")
    if target == "hf":
        assert not (name.parent.parent / "blobs").exists() and not (name.parent.parent / "refs").exists()

    done = place_model(snapshot, target, tmp_path / "root", reader(model.head))
    assert done.notes == [f"resumed the placement pid {p.pid} left in {staged}"]
    assert done.kept == 5 and done.written == sum(f.size for f in sorted(snapshot.files, key=lambda f: f.path)[5:])
    assert not staged.exists() and not [q for q in staged.parent.iterdir() if q.name.startswith(STAGING_PREFIX)]
    for name_ in model.head.files:
        assert (done.path / name_).read_bytes() == model.head.files[name_].read()


# --- where each target's root comes from ---------------------------------------------------------------------------

def test_the_roots_come_from_the_clients_variables(monkeypatch, tmp_path):
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME", "MODELSCOPE_CACHE", "MS_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert config.hf_hub_cache() == tmp_path / ".cache" / "huggingface" / "hub"
    assert config.modelscope_cache() == tmp_path / ".cache" / "modelscope" / "hub"
    monkeypatch.setenv("XDG_CACHE_HOME", "/x")
    assert config.hf_hub_cache() == Path("/x/huggingface/hub")
    monkeypatch.setenv("HF_HOME", "~/hf")
    assert config.hf_hub_cache() == tmp_path / "hf" / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", "/cache/hub")
    assert config.hf_hub_cache() == Path("/cache/hub")
    monkeypatch.setenv("MS_CACHE_HOME", "/old")
    assert config.modelscope_cache() == Path("/old")
    monkeypatch.setenv("MODELSCOPE_CACHE", "/ms")
    assert config.modelscope_cache() == Path("/ms")
    # what the real clients say, from the same environment
    env = {"HF_HOME": str(tmp_path / "hf"), "MODELSCOPE_CACHE": str(tmp_path / "ms")}
    code = "from huggingface_hub import constants; print(constants.HF_HUB_CACHE)"
    out = subprocess.run([client_python(), "-c", code], env={"HOME": str(tmp_path), **env}, capture_output=True,
                         text=True, timeout=120)
    assert out.stdout.strip() == str(tmp_path / "hf" / "hub"), out.stderr
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE")
    assert str(config.hf_hub_cache()) == out.stdout.strip()


# --- the kernel's copy (filecopy.py): an uncompressed bundle's model files placed from where they lie in its parts ---

def parts_reader(model: HubModel, where: Path, damage: Optional[str] = None):
    """Each file's bytes as Regions of two "parts" (the file's first half ends one, the rest starts the next, as a
    bundle's part boundary splits a member); `damage`: that file's bytes changed in its part (one byte, mid-file)."""
    where.mkdir(parents=True, exist_ok=True)

    def read(f: ModelFile) -> Regions:
        data = model.head.files[f.path].read()
        if f.path == damage:
            data = data[:100] + bytes([data[100] ^ 1]) + data[101:]
        half = len(data) // 2
        a, b = where / (f.sha256.hex + ".a"), where / (f.sha256.hex + ".b")
        a.write_bytes(b"\0" * 512 + data[:half])
        b.write_bytes(data[half:] + b"\0" * 512)
        return Regions(((str(a), 512, half), (str(b), 0, len(data) - half)))
    return read


@pytest.mark.parametrize("target", ["hf", "modelscope", "dir"])
def test_the_kernel_copy_and_its_fallbacks_place_the_tree_the_streamed_bytes_place(tmp_path, target, monkeypatch):
    model = small_model(seed=48, repo_id=DOTTED)
    snapshot = snapshot_of(model, "main", hub="hf" if target == "hf" else "modelscope")
    place_model(snapshot, target, tmp_path / "streamed", reader(model.head), created=0)
    want = tree(tmp_path / "streamed")
    for ways in (("copy_file_range", "sendfile", "read"), ("sendfile", "read"), ("read",)):
        monkeypatch.setattr(filecopy, "METHODS", ways)
        root = tmp_path / ways[0]
        done = place_model(snapshot, target, root, parts_reader(model, tmp_path / "parts"), created=0)
        assert done.written == snapshot.size and tree(root) == want, ways
        for f in snapshot.files:
            assert (done.path / f.path).read_bytes() == model.head.files[f.path].read(), (ways, f.path)
    if target == "hf":  # the git blob ids the HF cache names small files by, computed from the copy
        assert json.loads((tmp_path / "read" / f"models--{DOTTED.replace('/', '--')}" / "trees" /
                           f"{model.head.commit}.json").read_text()) == json.loads(
            (tmp_path / "streamed" / f"models--{DOTTED.replace('/', '--')}" / "trees" /
             f"{model.head.commit}.json").read_text())


@pytest.mark.parametrize("ways", [("copy_file_range", "sendfile", "read"), ("sendfile", "read"), ("read",)],
                         ids=lambda w: w[0])
def test_a_part_changed_so_a_file_differs_is_refused_naming_the_file_and_nothing_is_placed(tmp_path, ways,
                                                                                          monkeypatch):
    monkeypatch.setattr(filecopy, "METHODS", ways)
    model = small_model(seed=48)
    snapshot = snapshot_of(model)
    want = model.head.files[SHARD2].sha256[:12]
    with pytest.raises(PlacementDamaged) as e:
        place_model(snapshot, "hf", tmp_path, parts_reader(model, tmp_path / "parts", damage=SHARD2))
    assert e.value.exit_code == EXIT_VERIFY == 3 and e.value.path == SHARD2
    got = e.value.message.split("sha256:")[1][:12]
    assert got != want
    assert e.value.message == (f"hf:imgtool-test/tiny-llm@main: {SHARD2}: its bytes do not match its sha256 "
                               f"(sha256:{got} read, {want} expected); nothing was placed")
    repo = tmp_path / "models--imgtool-test--tiny-llm"
    assert sorted(p.name for p in repo.iterdir() if not p.name.startswith(STAGING_PREFIX)) == []
    staged = [p for p in repo.iterdir() if p.name.startswith(STAGING_PREFIX)]
    assert len(staged) == 1 and not (staged[0] / "partial").exists()  # the damaged copy is not kept
    assert not (staged[0] / "tree" / SHARD2).exists()  # never taken for a checked file by a rerun
