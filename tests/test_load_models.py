"""`imgtool load` of a bundle that carries models (issue 48): each model placed from the same forward read as the images,
every file checked, nothing visible before the whole bundle was checked; the runtime is sent the images only.

Service-free, but for the one test that loads an image and a model into the test dockerd (Docker 20.10)."""

import json
import os
import shutil
import stat
from pathlib import Path

import pytest

from imgtool.bundle.layout import bundle_members
from imgtool.bundle.reader import read_index
from imgtool.placer import place_model
from tests.support.bundles import BlobDir, damage_member, imgtool, parts_of, put_model, write
from tests.support.hubclients import run_clients
from tests.support.images import host_arch
from tests.support.models import small_model

REPO = "quay.io/ascend/vllm-ascend"
MODEL = "imgtool-test/tiny-llm"
HF_DIR = "models--imgtool-test--tiny-llm"
SHARD2 = "model-00002-of-00002.safetensors"


def err_lines(r):
    return [line for line in r.stderr.splitlines() if line.startswith(("error:", "hint:", "  - "))]


@pytest.fixture
def store(tmp_path):
    return BlobDir(tmp_path / "blobs")


@pytest.fixture
def model():
    return small_model(seed=4801)


@pytest.fixture
def model_bundle(tmp_path, store, model):
    """A bundle of one model and no image, in several parts (the shards span part boundaries)."""
    out = tmp_path / "model-bundle"
    write(out, [], store, models=[put_model(store, model)], chunk_size=24 << 10)
    assert len(parts_of(out)) >= 3
    return out


def hf_env(tmp_path):
    return {"HF_HUB_CACHE": str(tmp_path / "hf"), "HOME": str(tmp_path / "home")}


def files_under(root: Path):
    """path -> (size, mode) of every regular file and link target under root."""
    out = {}
    for here, _, names in os.walk(str(root)):
        for name in names:
            p = Path(here, name)
            st = os.lstat(str(p))
            out[p.relative_to(root).as_posix()] = ("-> " + os.readlink(str(p))) if stat.S_ISLNK(st.st_mode) \
                else (st.st_size, stat.S_IMODE(st.st_mode), st.st_mtime_ns)
    return out


def test_a_model_only_bundle_loads_without_a_runtime_where_huggingface_hub_finds_it_offline(tmp_path, model,
                                                                                          model_bundle):
    env = dict(hf_env(tmp_path), DOCKER_HOST="unix:///nonexistent/imgtool-test/docker.sock")
    r = imgtool("load", str(model_bundle), env=env)
    assert r.returncode == 0, r.stderr
    commit = model.head.commit
    snapshot = tmp_path / "hf" / HF_DIR / "snapshots" / commit
    assert r.stdout.splitlines() == [f"placed hf:{MODEL}@main (commit {commit[:12]}) in {snapshot} (9 files, 85.2 KiB)"]
    found = run_clients([("hf_snapshot_download", {"repo_id": MODEL, "cache_dir": str(tmp_path / "hf"),
                                                   "local_files_only": True}),
                         ("hf_hub_download", {"repo_id": MODEL, "filename": SHARD2, "cache_dir": str(tmp_path / "hf"),
                                              "local_files_only": True})],
                        {"HF_HUB_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9"}, tmp_path)
    assert found == [str(snapshot), str(snapshot / SHARD2)]
    assert (snapshot / SHARD2).read_bytes() == model.head.files[SHARD2].read()


def test_a_second_load_of_an_unchanged_model_writes_nothing(tmp_path, model, model_bundle):
    env = hf_env(tmp_path)
    assert imgtool("load", str(model_bundle), env=env).returncode == 0
    before = files_under(tmp_path / "hf")
    r = imgtool("load", str(model_bundle), "--json", env=env)
    assert r.returncode == 0, r.stderr
    snapshot = tmp_path / "hf" / HF_DIR / "snapshots" / model.head.commit
    [placed] = json.loads(r.stdout)["models"]
    assert (placed["unchanged"], placed["written"], placed["path"]) == (True, 0, str(snapshot))
    assert files_under(tmp_path / "hf") == before
    again = imgtool("load", str(model_bundle), env=env)
    assert again.stdout.splitlines() == [f"hf:{MODEL}@main is placed already in {snapshot} (9 files, 85.2 KiB): "
                                         "nothing to do"]


def test_a_damaged_part_spanning_a_weight_file_places_nothing_and_a_good_copy_resumes(tmp_path, model, model_bundle):
    env = hf_env(tmp_path)
    shard = model.head.files[SHARD2]
    good = {p.name: p.read_bytes() for p in parts_of(model_bundle)}
    spans = damage_member(model_bundle, "sha256:" + shard.sha256)
    r = imgtool("load", str(model_bundle), env=env)
    assert r.returncode == 3, r.stderr
    assert err_lines(r)[0] == f"error: refusing to load: {model_bundle}: 1 problem; nothing was loaded"
    label = parts_of(model_bundle)[spans[0]].name.rsplit("part", 1)[1]
    assert any(line.startswith(f"  - part {label}") for line in err_lines(r)), r.stderr
    repo = tmp_path / "hf" / HF_DIR
    assert not (repo / "snapshots").exists() and not (repo / "refs").exists() and not (repo / "blobs").exists()
    assert [p.name for p in repo.iterdir() if not p.name.startswith(".imgtool-")] == []
    for name, data in good.items():  # the part copied again: the next load resumes what was staged and checked
        (model_bundle / name).write_bytes(data)
    again = imgtool("load", str(model_bundle), env=env)
    assert again.returncode == 0, again.stderr
    assert "resumed the placement pid" in again.stderr
    assert (repo / "snapshots" / model.head.commit / SHARD2).read_bytes() == shard.read()


def test_damage_after_every_file_was_staged_still_places_nothing(tmp_path, model, model_bundle):
    """The model's files all check out, but its artifact's manifest (after them in the archive) is damaged: the whole
    bundle is checked before any model is renamed to its name, so nothing is placed."""
    doc = json.loads((model_bundle / "bundle.json").read_text())
    damage_member(model_bundle, doc["models"][0]["manifest_digest"])
    r = imgtool("load", str(model_bundle), env=hf_env(tmp_path))
    assert r.returncode == 3, r.stderr
    assert err_lines(r)[0] == f"error: refusing to load: {model_bundle}: 1 problem; nothing was loaded"
    repo = tmp_path / "hf" / HF_DIR
    assert [p.name for p in repo.iterdir() if not p.name.startswith(".imgtool-")] == []


def test_models_dir_places_what_the_placers_dir_target_writes(tmp_path, store, model, model_bundle):
    r = imgtool("load", str(model_bundle), "--models-dir", str(tmp_path / "plain"))
    assert r.returncode == 0, r.stderr
    placed = tmp_path / "plain" / MODEL
    assert r.stdout.splitlines() == [f"placed hf:{MODEL}@main (commit {model.head.commit[:12]}) in {placed} "
                                     "(9 files, 85.2 KiB)"]
    snapshot = put_model(store, model).snapshot()
    place_model(snapshot, "dir", tmp_path / "by-placer",
                lambda f: iter([model.head.files[f.path].read()]), revision="main")
    ours = {k: v[:2] for k, v in files_under(tmp_path / "plain").items()}
    theirs = {k: v[:2] for k, v in files_under(tmp_path / "by-placer").items()}
    assert ours == theirs and all(mode == 0o444 for _, mode in ours.values())
    assert (placed / ".imgtool-model.json").read_bytes() == (tmp_path / "by-placer" / MODEL / ".imgtool-model.json"
                                                               ).read_bytes()


def test_models_modelscope_places_into_modelscope_cache_and_no_models_places_nothing(tmp_path, model_bundle):
    env = {"MODELSCOPE_CACHE": str(tmp_path / "ms"), "HF_HUB_CACHE": str(tmp_path / "hf")}
    none = imgtool("load", str(model_bundle), "--no-models", env=env)
    assert (none.returncode, none.stdout) == (0, f"nothing placed from {model_bundle}: --no-models\n"), none.stderr
    assert not (tmp_path / "ms").exists() and not (tmp_path / "hf").exists()
    r = imgtool("load", str(model_bundle), "--models", "modelscope", env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"placed hf:{MODEL}@main (commit ") and f" in {tmp_path / 'ms'}/models/{MODEL} " in r.stdout
    assert not (tmp_path / "hf").exists()


def test_contradicting_model_options_are_refused(tmp_path, model_bundle):
    for args, said in ((("--no-models", "--models-only"),
                        "error: --no-models places no model: it cannot go with --models-only, --models or --models-dir"),
                       (("--models", "hf", "--models-dir", str(tmp_path)),
                        "error: --models and --models-dir both say where the models go: choose one")):
        r = imgtool("load", str(model_bundle), *args)
        assert (r.returncode, err_lines(r)[0]) == (2, said)


def test_two_models_sharing_files_are_each_placed_whole_from_bytes_the_archive_carries_once(tmp_path, store):
    """Files of the same bytes in two models are one archive member: the second model's copy comes from the first's
    staged file (the forward read is past it), in the HF cache and in a plain directory alike."""
    first, second = small_model(seed=4802), small_model(seed=4802, repo_id="imgtool-test/tiny-llm-copy")
    shared = {f.sha256 for f in first.head.files.values()} & {f.sha256 for f in second.head.files.values()}
    assert shared
    out = tmp_path / "two"
    write(out, [], store, models=[put_model(store, first), put_model(store, second)])
    carried = [m for m in bundle_members(read_index(out)[0]) if m.kind == "model"]
    assert len(carried) == len(first.head.files) + len(second.head.files) - len(shared)
    for args, where in (((), lambda m: tmp_path / "hf" / f"models--{m.repo_id.replace('/', '--')}" / "snapshots"
                         / m.head.commit),
                        (("--models-dir", str(tmp_path / "plain")), lambda m: tmp_path / "plain" / m.repo_id)):
        r = imgtool("load", str(out), *args, env=hf_env(tmp_path))
        assert r.returncode == 0, r.stderr
        for m in (first, second):
            for path, f in m.head.files.items():
                assert (where(m) / path).read_bytes() == f.read(), (m.repo_id, path)


def test_an_image_and_a_model_load_into_docker_and_no_model_byte_reaches_it(tmp_path, factory, store, model, services,
                                                                           docker_cli, docker_cleanup):
    from tests.support.daemon import DockerAPIRecorder

    image = factory.image(host_arch(), layers=2)
    out = tmp_path / "both"
    write(out, [store.pulled(image, f"{REPO}:withmodel")], store, models=[put_model(store, model)],
          chunk_size=200 << 10)
    docker_cleanup.image(f"{REPO}:withmodel", image.config_digest)
    recorder = DockerAPIRecorder(services.docker_host, keep=True)
    try:
        r = imgtool("load", str(out), "--json", env=dict(hf_env(tmp_path), DOCKER_HOST=f"tcp://{recorder.address}"))
    finally:
        recorder.close()
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout)
    assert docker_cli.holds(f"{REPO}:withmodel", image)
    [placed] = result["models"]
    snapshot = tmp_path / "hf" / HF_DIR / "snapshots" / model.head.commit
    assert placed["path"] == str(snapshot) and (snapshot / SHARD2).read_bytes() == model.head.files[SHARD2].read()
    sent = bytes(recorder.uploaded)
    assert image.layers[0].blob[1000:1064] in sent  # what went to Docker: the image
    for f in model.head.files.values():  # and none of the model's files
        data = f.read()
        assert data[len(data) // 2:len(data) // 2 + 64] not in sent, f.path
    bundle_json = json.loads((out / "bundle.json").read_text())
    assert result["bytes_sent"] < bundle_json["archive"]["size"] - sum(f.size for f in model.head.files.values())


def test_the_models_of_a_bundle_whose_images_docker_holds_are_placed_in_a_pass_of_their_own(
        tmp_path, factory, store, model, services, docker_cli, docker_cleanup):
    image = factory.image(host_arch(), layers=1)
    out = tmp_path / "both"
    write(out, [store.pulled(image, f"{REPO}:held")], store, models=[put_model(store, model)])
    docker_cleanup.image(f"{REPO}:held", image.config_digest)
    env = {"DOCKER_HOST": services.docker_host}
    assert imgtool("load", str(out), "--no-models", env=env).returncode == 0
    assert not (tmp_path / "hf").exists()
    r = imgtool("load", str(out), env=dict(hf_env(tmp_path), **env))
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1].startswith(f"placed hf:{MODEL}@main ")
    assert "already loaded: nothing sent to Docker" in r.stdout
    only = imgtool("load", str(out), "--models-only", "--models-dir", str(tmp_path / "plain"),
                   env={"DOCKER_HOST": "unix:///nonexistent/imgtool-test/docker.sock"})
    assert only.returncode == 0, only.stderr
    assert (tmp_path / "plain" / MODEL / SHARD2).is_file()
    shutil.rmtree(str(tmp_path / "plain"), ignore_errors=True)


def test_inventory_lists_the_placed_models_from_their_listings(tmp_path, store, model, model_bundle, services):
    """inventory's `models`: each placed model's reference, commit and files with their sha256, read from the HF cache's
    trees/<commit>.json and imgtool's markers (the ModelScope cache, --models-dir); a user's own copy without a
    marker, and a snapshot missing a file, are not listed."""
    env = {"HF_HUB_CACHE": str(tmp_path / "hf"), "MODELSCOPE_CACHE": str(tmp_path / "ms"),
           "DOCKER_HOST": services.docker_host}
    for args in ((), ("--models", "modelscope"), ("--models-dir", str(tmp_path / "plain"))):
        assert imgtool("load", str(model_bundle), *args, env=env).returncode == 0
    other = small_model(seed=4803, repo_id="imgtool-test/other")
    other_bundle = tmp_path / "other"
    write(other_bundle, [], store, models=[put_model(store, other)])
    assert imgtool("load", str(other_bundle), env=env).returncode == 0
    os.chmod(str(tmp_path / "hf" / "models--imgtool-test--other" / "blobs"), 0o755)
    [lfs] = [f for f in other.head.files.values() if f.lfs][:1]
    os.chmod(str(tmp_path / "hf" / "models--imgtool-test--other" / "blobs" / lfs.sha256), 0o644)
    os.remove(str(tmp_path / "hf" / "models--imgtool-test--other" / "blobs" / lfs.sha256))  # no longer whole
    (tmp_path / "plain" / "someone" / "own").mkdir(parents=True)
    (tmp_path / "plain" / "someone" / "own" / "config.json").write_text("{}")
    r = imgtool("inventory", "--models-dir", str(tmp_path / "plain"), env=env)
    assert r.returncode == 0, r.stderr
    files = sorted(({"path": p, "size": f.size, "sha256": "sha256:" + f.sha256} for p, f in model.head.files.items()),
                   key=lambda x: x["path"])
    commit = model.head.commit
    assert json.loads(r.stdout)["models"] == [
        {"ref": f"hf:{MODEL}@main", "commit": commit, "path": str(tmp_path / "hf" / HF_DIR / "snapshots" / commit),
         "files": files},
        {"ref": f"hf:{MODEL}@main", "commit": commit, "path": str(tmp_path / "ms" / "models" / MODEL), "files": files},
        {"ref": f"hf:{MODEL}@main", "commit": commit, "path": str(tmp_path / "plain" / MODEL), "files": files}]


def test_the_pyz_on_python_3_7_places_as_this_python_does(tmp_path, model, model_bundle):
    """Kylin's Python 3.7 runs imgtool.pyz: `load DIR` of a model bundle places the same trees (HF cache and
    --models-dir) as 3.11's imgtool, with no runtime, and a second load writes nothing."""
    import subprocess

    from tests.support.pythons import pyenv_python

    python = pyenv_python("3.7")
    assert python, "python3.7 is not under pyenv's versions: the pyz places models on Kylin's 3.7 (never a skip)"
    pyz = tmp_path / "imgtool.pyz"
    assert imgtool("self-bundle", "-o", str(pyz), "-q").returncode == 0

    def run37(*args, **env):
        given = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path / "home37"), "LANG": "C.UTF-8", **env}
        return subprocess.run(["env", "-i"] + [f"{k}={v}" for k, v in given.items()] + [python, "-I", str(pyz), *args],
                              capture_output=True, text=True, timeout=300)

    for args, env, where in (((), {"HF_HUB_CACHE": str(tmp_path / "hf37")}, "hf37"),
                             (("--models-dir", str(tmp_path / "plain37")), {}, "plain37")):
        r = run37("load", str(model_bundle), *args, **env)
        assert r.returncode == 0, r.stderr
        assert r.stdout.startswith(f"placed hf:{MODEL}@main (commit {model.head.commit[:12]}) in {tmp_path / where}")
        mine = where.replace("37", "311")
        here = {"HF_HUB_CACHE": str(tmp_path / mine)} if env else {}
        theirs_args = ("--models-dir", str(tmp_path / mine)) if args else ()
        assert imgtool("load", str(model_bundle), *theirs_args, env=here).returncode == 0
        assert {k: v[:2] if isinstance(v, tuple) else v for k, v in files_under(tmp_path / where).items()} == \
            {k: v[:2] if isinstance(v, tuple) else v for k, v in files_under(tmp_path / mine).items()}
    again = run37("load", str(model_bundle), HF_HUB_CACHE=str(tmp_path / "hf37"))
    assert again.returncode == 0 and again.stdout.endswith("(9 files, 85.2 KiB): nothing to do\n"), again.stderr


def test_no_models_reads_none_of_their_bytes_and_a_later_load_places_them_in_a_pass_of_their_own(
        tmp_path, factory, store, model, services, docker_cli, docker_cleanup):
    """A bundle whose model part is damaged: `--no-models` loads the image (the models' members are not read, so
    their damage stops nothing); a later load, Docker holding the image, reads the models in a pass of its own and
    refuses them (exit 3), placing nothing."""
    image = factory.image(host_arch(), layers=1)
    out = tmp_path / "both"
    write(out, [store.pulled(image, f"{REPO}:nomodels")], store, models=[put_model(store, model)])
    docker_cleanup.image(f"{REPO}:nomodels", image.config_digest)
    damage_member(out, "sha256:" + model.head.files[SHARD2].sha256)
    env = dict(hf_env(tmp_path), DOCKER_HOST=services.docker_host)
    r = imgtool("load", str(out), "--no-models", env=env)
    assert r.returncode == 0, r.stderr
    assert docker_cli.holds(f"{REPO}:nomodels", image)
    again = imgtool("load", str(out), env=env)
    assert again.returncode == 3, again.stderr
    assert err_lines(again)[0] == f"error: refusing to load: {out}: 1 problem; nothing was loaded"
    repo = tmp_path / "hf" / HF_DIR
    assert [p.name for p in repo.iterdir() if not p.name.startswith(".imgtool-")] == []
