"""The models placed on this host, read back (imgtool/placed.py): `run-flags`/`run --model` serve one (a read-only
mount of it, the offline environment, `vllm serve PATH`), and `doctor` lists them with their size and what is wrong
with them. The models are placed by the real placer (imgtool/placer.py) under a test's own caches."""

import json
import os
import shlex
import stat
import subprocess

import pytest

from imgtool.model import format_size
from imgtool.placement import MARKER
from imgtool.placer import place_model
from tests.support.bundles import imgtool as imgtool_cli
from tests.support.models import small_model, two_revisions
from tests.test_placement import DOTTED, SHARD1, SHARD2, reader, snapshot_of
from tests import test_presets
from tests.test_presets import GOLDEN, TRANSPORTS, imgtool, run_in_docker

busybox_rootfs = test_presets.busybox_rootfs  # fixtures: a busybox image with a shell, in the test's dockerd
busybox_image = test_presets.busybox_image

REPO = "imgtool-test/tiny-llm"
IMAGE = "quay.io/ascend/vllm-ascend:v0.11.0rc1"


@pytest.fixture
def home(tmp_path):
    h = tmp_path / "home"
    h.mkdir()
    return h


@pytest.fixture
def caches(tmp_path):
    """A Hugging Face cache and a ModelScope cache of this test's own, empty, and the environment naming them."""
    hf, ms = tmp_path / "hf", tmp_path / "ms"
    return hf, ms, {"HF_HUB_CACHE": str(hf), "MODELSCOPE_CACHE": str(ms)}


def flags(*args, home, env):
    return imgtool("run-flags", "a2", "--image", "v0.11.0rc1", *args, home=home, extra_env=env)


def place_hf(model, root, revision="main"):
    return place_model(snapshot_of(model, revision), "hf", root, reader(model.resolve(revision)))


def place_ms(model, root, target="modelscope"):
    return place_model(snapshot_of(model, "master", hub="modelscope", git_oids=False), target, root,
                       reader(model.head), revision="master")


def golden_a2(mount, env, serve):
    """The a2 golden with the model's mount, environment and `vllm serve` line added where run-flags puts them."""
    text = GOLDEN["a2"].replace("'quay.io/ascend/vllm-ascend:<version>'", IMAGE)
    text = text.replace("    -v /root/.cache:/root/.cache \\\n",
                        "    -v /root/.cache:/root/.cache \\\n" + f"    -v {mount} \\\n" +
                        "".join(f"    -e {e} \\\n" for e in env))
    return text + " \\\n    " + serve + "\n"


def test_run_flags_model_mounts_the_hf_snapshot_read_only_and_serves_it_offline(caches, home):
    hf, ms, env = caches
    model = small_model(seed=48)
    placed = place_hf(model, hf)
    folder = hf / "models--imgtool-test--tiny-llm"
    r = flags("--model", REPO, home=home, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout == golden_a2(f"{folder}:{folder}:ro", ["HF_HUB_OFFLINE=1", "TRANSFORMERS_OFFLINE=1"],
                                 f"vllm serve {placed.path} --served-model-name {REPO}")
    assert r.stderr.splitlines() == [
        f"model: hf:{REPO}@main (commit {model.head.commit[:12]}): 9 files, 85.2 KiB in {placed.path}, "
        f"from the Hugging Face cache"]
    # the snapshot's links climb to ../../blobs: what is mounted holds them
    link = os.readlink(placed.path / SHARD1)
    assert (placed.path / link).resolve().parent == folder / "blobs"
    # one line: the same words; and the JSON names the model
    one = flags("--model", f"hf:{REPO}", "--one-line", home=home, env=env)
    assert shlex.split(one.stdout) == shlex.split(r.stdout.replace("\\\n", ""))
    spec = json.loads(flags("--model", REPO, "--json", home=home, env=env).stdout)
    assert spec["model"] == {"name": REPO, "target": "hf", "folder": str(folder), "path": str(placed.path)}
    assert spec["env"] == {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    assert spec["mounts"][-1] == {"host": str(folder), "container": str(folder), "readonly": True, "create": False}
    assert spec["command"] == ["vllm", "serve", str(placed.path), "--served-model-name", REPO]


def test_words_after_dashes_add_options_to_vllm_serve_or_replace_it_with_a_command(caches, home):
    hf, ms, env = caches
    placed = place_hf(small_model(seed=48), hf)
    r = flags("--model", REPO, "--one-line", "--", "--tensor-parallel-size", "2", home=home, env=env)
    assert shlex.split(r.stdout)[-8:] == [IMAGE, "vllm", "serve", str(placed.path), "--served-model-name", REPO,
                                          "--tensor-parallel-size", "2"]
    r = flags("--model", REPO, "--one-line", "-e", "HF_HUB_OFFLINE=0", "--", "bash", home=home, env=env)
    argv = shlex.split(r.stdout)
    assert argv[-2:] == [IMAGE, "bash"]
    assert "HF_HUB_OFFLINE=0" in argv and "HF_HUB_OFFLINE=1" not in argv  # -e wins over the model's environment


def test_run_flags_model_from_modelscope_sets_vllm_use_modelscope_true(caches, home):
    hf, ms, env = caches
    model = small_model(seed=48, repo_id=DOTTED)
    placed = place_ms(model, ms)
    name = ms / "models" / "imgtool-test" / "tiny-llm-0___5B"
    assert placed.path == name
    r = flags("--model", f"modelscope:{DOTTED}", home=home, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout == golden_a2(f"{name}:{name}:ro", ["VLLM_USE_MODELSCOPE=true"],
                                 f"vllm serve {name} --served-model-name {DOTTED}")
    assert r.stderr.splitlines() == [
        f"model: modelscope:{DOTTED}@master (commit {model.head.commit[:12]}): 9 files, "
        f"{format_size(placed.size)} in {name}, from the ModelScope cache"]
    # unpinned, it is found in ModelScope's cache when the Hugging Face cache does not hold it; @master is its revision
    again = flags("--model", f"{DOTTED}@master", home=home, env=env)
    assert again.stdout == r.stdout


def test_a_model_in_both_caches_is_served_from_hf_and_the_other_is_named(caches, home):
    hf, ms, env = caches
    model = small_model(seed=48)
    on_hf, on_ms = place_hf(model, hf), place_ms(model, ms)
    r = flags("--model", REPO, "--one-line", home=home, env=env)
    assert shlex.split(r.stdout)[-4:] == ["serve", str(on_hf.path), "--served-model-name", REPO]
    assert r.stderr.splitlines()[1] == (f"{REPO} is placed in the ModelScope cache too ({on_ms.path}): "
                                        "--models modelscope serves that one")
    r = flags("--model", REPO, "--models", "modelscope", "--one-line", home=home, env=env)
    assert shlex.split(r.stdout)[-4:] == ["serve", str(on_ms.path), "--served-model-name", REPO]
    assert "VLLM_USE_MODELSCOPE=true" in shlex.split(r.stdout)
    r = flags("--model", f"hf:{REPO}", "--models", "modelscope", home=home, env=env)
    assert (r.returncode, r.stderr.splitlines()) == (2, [
        f"error: --model hf:{REPO} is a hf model and --models modelscope names the other cache: give one"])


def test_a_revision_picks_its_snapshot_in_the_hf_cache(caches, home):
    hf, ms, env = caches
    model = two_revisions(seed=48)
    old, new = place_hf(model, hf, "v1"), place_hf(model, hf, "main")
    assert old.path != new.path
    for asked, served in ((REPO, new), (f"{REPO}@v1", old), (f"{REPO}@{model.refs['v1']}", old),
                          (f"hf:{REPO}@main", new)):
        r = flags("--model", asked, "--one-line", home=home, env=env)
        assert r.returncode == 0, r.stderr
        assert shlex.split(r.stdout)[-3] == str(served.path), asked
    folder = hf / "models--imgtool-test--tiny-llm"
    r = flags("--model", f"{REPO}@v2", home=home, env=env)
    assert (r.returncode, r.stderr.splitlines()[0]) == (2, (
        f"error: {REPO}@v2 is not placed on this host: looked in {folder} (no refs/v2; it holds "
        f"{', '.join(sorted(['main', 'v1'], key=lambda ref: model.refs[ref]))}); "
        f"{ms / 'models' / 'imgtool-test' / 'tiny-llm'} (not there)"))
    # two snapshots and no refs/main: which one is the user's to say
    os.chmod(folder / "refs", 0o755)
    os.chmod(folder / "refs" / "main", 0o644)
    (folder / "refs" / "main").unlink()
    r = flags("--model", REPO, home=home, env=env)
    assert r.returncode == 2
    assert r.stderr.splitlines()[0].startswith(f"error: {folder} holds 2 snapshots and no refs/main: name one with "
                                               f"--model {REPO}@REVISION (")


def test_a_model_not_placed_is_one_line_and_exit_2_naming_where_it_looked(caches, home):
    hf, ms, env = caches
    r = flags("--model", "imgtool-test/absent", home=home, env=env)
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr.splitlines() == [
        f"error: imgtool-test/absent is not placed on this host: looked in {hf}/models--imgtool-test--absent "
        f"(not there); {ms}/models/imgtool-test/absent (not there)",
        "hint: imgtool load BUNDLE places the models a bundle holds (imgtool fetch TAG hf:ORG/NAME makes one); "
        "HF_HUB_CACHE, MODELSCOPE_CACHE or --models-dir DIR say where else to look"]
    r = imgtool("run", "a2", "v0.11.0rc1", "--allow-missing-devices", "--model", "hf:imgtool-test/absent",
                home=home, extra_env=env)
    assert (r.returncode, r.stderr.splitlines()[0]) == (
        2, f"error: hf:imgtool-test/absent is not placed on this host: looked in {hf}/models--imgtool-test--absent "
           f"(not there)")


@pytest.mark.parametrize("args, message", [
    (["--model", "Qwen3-8B"], "invalid --model 'Qwen3-8B': use ORG/NAME[@REVISION], hf:ORG/NAME[@REVISION] or "
                              "modelscope:ORG/NAME[@REVISION]"),
    (["--model", "dir:a/b"], "invalid --model 'dir:a/b': use ORG/NAME[@REVISION], hf:ORG/NAME[@REVISION] or "
                             "modelscope:ORG/NAME[@REVISION]"),
    (["--models", "hf"], "--models applies with --model: it says where to look for the model"),
    (["--model", REPO, "--models", "hf", "--models-dir", "/x"],
     "give --models or --models-dir, not both: --models-dir DIR looks in DIR/ORG/NAME"),
    (["--model", REPO, "--format", "k8s", "--k8s-version", "1.36.x"],
     "invalid --k8s-version '1.36.x': expected the cluster's Kubernetes version, like 1.35"),
    (["--model", REPO, "--k8s-version", "1.36"], "--k8s-version applies to --format k8s"),
])
def test_bad_model_options_are_one_line_and_exit_2(args, message, caches, home):
    hf, ms, env = caches
    place_hf(small_model(seed=48), hf)
    r = flags(*args, home=home, env=env)
    assert (r.returncode, r.stdout, r.stderr.splitlines()) == (2, "", [f"error: {message}"])


def test_models_dir_serves_the_plain_directory(tmp_path, caches, home):
    hf, ms, env = caches
    model = small_model(seed=48)
    placed = place_ms(model, tmp_path / "models", target="dir")
    r = flags("--model", REPO, "--models-dir", str(tmp_path / "models"), "--one-line", home=home, env=env)
    assert r.returncode == 0, r.stderr
    argv = shlex.split(r.stdout)
    assert f"{placed.path}:{placed.path}:ro" in argv
    assert "HF_HUB_OFFLINE=1" in argv and "TRANSFORMERS_OFFLINE=1" in argv
    assert argv[-5:] == ["vllm", "serve", str(placed.path), "--served-model-name", REPO]


# --- doctor ------------------------------------------------------------------------------------------------------

def model_lines(r):
    lines = r.stdout.splitlines()
    return [line for i, line in enumerate(lines) if line[6:18].strip() in ("model", "models") or
            (line.startswith(" " * 18 + "->") and lines[i - 1][6:18].strip() in ("model", "models"))]


def doctor(env, *args):
    return imgtool_cli("doctor", "--runtime", "docker", *args, docker_host="unix:///nonexistent/imgtool-test.sock",
                       env=env)


def test_doctor_lists_the_placed_models_with_revision_commit_and_size(tmp_path, caches):
    hf, ms, env = caches
    assert model_lines(doctor(env)) == [
        f"INFO  models       none placed in the Hugging Face cache ({hf}), the ModelScope cache ({ms})",
        "                  -> imgtool load BUNDLE places the models a bundle holds"]
    model = two_revisions(seed=48)
    old, new = place_hf(model, hf, "v1"), place_hf(model, hf, "main")
    dotted = small_model(seed=48, repo_id=DOTTED)
    on_ms = place_ms(dotted, ms)
    in_dir = place_ms(model, tmp_path / "models", target="dir")
    size = format_size(new.size)
    snapshots = sorted([(model.refs["v1"], "v1", old), (model.refs["main"], "main", new)])
    assert model_lines(doctor(env, "--models-dir", str(tmp_path / "models"))) == [
        f"OK    model        hf:{REPO}@{ref} (commit {commit[:12]}): 9 files, {format_size(p.size)} in {p.path}"
        for commit, ref, p in snapshots] + [
        f"OK    model        modelscope:{DOTTED}@master (commit {dotted.head.commit[:12]}): 9 files, "
        f"{format_size(on_ms.size)} in {on_ms.path}",
        f"OK    model        dir:{REPO}@master (commit {model.head.commit[:12]}): 9 files, {size} in {in_dir.path}"]


def test_doctor_fails_an_incomplete_model_and_warns_about_one_that_is_not_read_only(caches, home):
    hf, ms, env = caches
    model = small_model(seed=48)
    on_hf, on_ms = place_hf(model, hf), place_ms(model, ms)
    blob = (on_hf.path / SHARD2).resolve()
    os.chmod(blob, 0o644)
    os.chmod(on_ms.path, 0o755)
    (on_ms.path / SHARD1).unlink()
    r = doctor(env)
    assert r.returncode == 1
    assert model_lines(r) == [
        f"WARN  model        hf:{REPO}@main (commit {model.head.commit[:12]}): 9 files, 85.2 KiB in {on_hf.path}: "
        f"not read-only: 1 file may be written (first: {SHARD2}, mode 644)",
        f"                  -> chmod -R a-w {hf / 'models--imgtool-test--tiny-llm'} (a file that can be written can "
        "change under the server unnoticed); imgtool load places models read-only",
        f"FAIL  model        modelscope:{REPO}@master (commit {model.head.commit[:12]}): 9 files, 85.2 KiB in "
        f"{on_ms.path}: incomplete: 1 of 9 files missing (first: {SHARD1}); not read-only: 1 directory may be written "
        "(first: ., mode 755)",
        f"                  -> place it again: imgtool load BUNDLE (a bundle that holds modelscope:{REPO}@master)"]
    # run-flags serves it still, and says what is wrong
    r = imgtool("run-flags", "a2", "--image", "v0.11.0rc1", "--model", f"modelscope:{REPO}", home=home,
                extra_env=env)
    assert r.returncode == 0
    assert r.stderr.splitlines()[1:] == [
        f"warning: modelscope:{REPO}@master: incomplete: 1 of 9 files missing (first: {SHARD1}) (imgtool doctor lists "
        "the placed models)",
        f"warning: modelscope:{REPO}@master: not read-only: 1 directory may be written (first: ., mode 755) (imgtool "
        "doctor lists the placed models)"]
    assert stat.S_IMODE(os.stat(on_hf.path / SHARD1).st_mode) == 0o444


def test_doctor_reads_an_edited_markers_names_as_data_and_never_looks_outside_the_model(tmp_path, caches):
    """A user-writable --models-dir's marker names a file outside the model, of the size it has: root's doctor
    says so, and neither counts it as the model's file nor reports its mode."""
    hf, ms, env = caches
    in_dir = place_ms(small_model(seed=48), tmp_path / "models", target="dir")
    outside = tmp_path / "models" / "outside.bin"
    outside.write_bytes(b"12345")
    os.chmod(outside, 0o666)
    marker_path = in_dir.path / MARKER
    os.chmod(in_dir.path, 0o755)
    os.chmod(marker_path, 0o644)
    doc = json.loads(marker_path.read_text())
    escape = "../" * len(in_dir.path.relative_to(tmp_path / "models").parts) + "outside.bin"
    doc["files"][escape] = {"size": 5}
    marker_path.write_text(json.dumps(doc))
    os.chmod(marker_path, 0o444)
    os.chmod(in_dir.path, 0o555)
    r = doctor(env, "--models-dir", str(tmp_path / "models"))
    assert r.returncode == 1
    assert model_lines(r)[0] == (
        f"FAIL  model        dir:{REPO}@master (commit {in_dir.commit[:12]}): 10 files, 85.2 KiB in {in_dir.path}: "
        f"the listing names 1 path outside the model (first: {escape!r}: a `.`, `..` or empty component)")


# --- imgtool run, against the real dockerd ---------------------------------------------------------------------

@pytest.mark.engines(stores=True)
@pytest.mark.parametrize("transport", sorted(TRANSPORTS))
def test_run_model_mounts_it_read_only_where_the_container_reads_it(transport, services, busybox_image, caches, uniq,
                                                                    home):
    hf, ms, env = caches
    model = small_model(seed=48)
    placed = place_hf(model, hf)
    r = run_in_docker(services, "run", "a2", busybox_image, "--allow-missing-devices", "-q", "--net",
                      services.docker_network, "--name", f"imgtool-{uniq}", "--model", REPO, "--",
                      "sh", "-c", f"cat {placed.path}/config.json; echo HF_HUB_OFFLINE=$HF_HUB_OFFLINE; "
                                  f"(echo x > {placed.path}/../../x) 2>&1 || echo refused",
                      home=home, transport=transport, extra_env=env)
    assert r.returncode == 0, r.stderr
    config = model.head.files["config.json"].read().decode()
    assert r.stdout.startswith(config)
    rest = r.stdout[len(config):].splitlines()
    assert rest[0] == "HF_HUB_OFFLINE=1"
    assert rest[-1] == "refused" and "Read-only file system" in rest[-2]
    assert not (placed.path.parent.parent / "x").exists()


@pytest.mark.parametrize("engine", ["28.5-containerd"], indirect=True)
@pytest.mark.parametrize("transport", sorted(TRANSPORTS))
def test_run_model_mounts_its_modelcar_image_on_docker_28_with_the_containerd_store(transport, services, engine,
                                                                                    busybox_image, caches, uniq,
                                                                                    home, tmp_path):
    """Issue 49 on Docker: 28.0+ with the containerd image store mounts an image (`--mount type=image`, API 1.48):
    a placed model whose modelcar `load --models image` imported is served from that image, read-only, through
    docker-py and through the pyz's stdlib client alike; the container reads every file with bundle.json's sha256.
    (The graphdriver store cannot mount an image: the test above gets the placed folder there.)"""
    from tests.support.modelcars import assert_read_every_file, modelcar_bundle, read_every_file

    hf, ms, env = caches
    model = small_model(seed=4932)
    place_hf(model, hf)
    bundle, car = modelcar_bundle(tmp_path, model)
    try:
        r = run_in_docker(services, "load", str(bundle), "--models", "image", home=home, extra_env=env)
        assert r.returncode == 0, r.stderr
        r = run_in_docker(services, "run", "a2", busybox_image, "--allow-missing-devices", "-q", "--net",
                          services.docker_network, "--name", f"imgtool-{uniq}", "--model", REPO, "--", "sh", "-c",
                          read_every_file("/mnt/modelcar/models", "/bin/busybox"),
                          home=home, transport=transport, extra_env=env)
        assert r.returncode == 0, r.stderr
        assert_read_every_file(r.stdout, bundle)
    finally:
        subprocess.run(["docker", "-H", services.docker_host, "rmi", "-f", car], capture_output=True)


def test_a_cache_path_that_would_split_the_mount_is_refused(tmp_path, home):
    hf = tmp_path / "a:rw,b"
    place_hf(small_model(seed=48), hf)
    r = flags("--model", REPO, home=home, env={"HF_HUB_CACHE": str(hf), "MODELSCOPE_CACHE": str(tmp_path / "ms")})
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr.splitlines()[-2:] == [
        f"error: cannot mount {hf}/models--imgtool-test--tiny-llm: a ':' or ',' in the path",
        "hint: place the model under a path without them (--models-dir DIR, HF_HUB_CACHE)"]
