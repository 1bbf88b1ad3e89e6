"""`imgtool run --runtime podman` and `run-flags --runtime podman` against the private podman 4.3 (and 5.8: PODMANS).

The image is a factory image with a static busybox (runnable=True), put into the private podman's
storage with `podman load -i`; no NPU here, so every run passes --allow-missing-devices, as the
Docker run tests do, and --net none (the test services have no container network).
"""

import json
import os
import select
import shlex
import signal
import stat
import subprocess
import sys
import time

import pytest

from tests.support.images import host_arch, write_docker_archive
from tests.test_presets import DEAD_DOCKER, NO_CARDS, imgtool
from tests.support.terminal import session_on_a_terminal

PODMANS = ["4.3", "5.8"]  # the proofs of run and run-flags: Podman 5.8 too (tests/support/runtimes.py PROOF_RUNTIMES)
NOT_INSTALLED = ["error: cannot use Podman: the podman command is not installed (not in PATH)",
                 "hint: install Podman (dnf install podman; Debian/Ubuntu: apt-get install podman), "
                 "or choose another runtime with --runtime"]


@pytest.fixture
def home(tmp_path):
    h = tmp_path / "home"
    h.mkdir()
    return h


class Podman:
    """The private podman of the test services (4.3, or `version`), run as the tests' own tool."""

    def __init__(self, services, version: str = ""):
        self.env = services.podman_env(version=version)
        # what imgtool needs to find that podman (its PATH first, its configuration)
        self.cli_env = {k: self.env[k] for k in ("PATH", "CONTAINERS_STORAGE_CONF", "CONTAINERS_CONF")}
        self.containers = []

    def __call__(self, *args, check=True):
        return subprocess.run(["podman", *args], env=self.env, capture_output=True, text=True, timeout=120,
                              check=check)

    def container_gone(self, name) -> bool:
        return self("container", "exists", name, check=False).returncode == 1


@pytest.fixture
def podman(services, request):
    """Podman 4.3; the run and run-flags proofs are parametrized over PODMANS (Podman 5.8 too)."""
    p = Podman(services, getattr(request, "param", ""))
    yield p
    for name in p.containers:
        p("rm", "-f", "-t", "0", name, check=False)


@pytest.fixture
def pod_image(podman, factory, uniq, tmp_path):
    """A runnable image loaded into the private podman with `podman load -i`."""
    name = f"example.test/{uniq}/pod:v1"
    archive = write_docker_archive(factory.image(layers=1, layer_size=20_000, runnable=True),
                                   tmp_path / "image.tar", name)
    podman("load", "-i", archive)
    yield name
    podman("rmi", "-f", name, check=False)


def run_on_podman(podman, *args, home, extra_env=None, **kw):
    # DOCKER_HOST stays the dead socket of imgtool(): nothing here may ask Docker
    return imgtool("run", "--runtime", "podman", *args, home=home, extra_env={**podman.cli_env, **(extra_env or {})},
                   **kw)


@pytest.mark.parametrize("podman", PODMANS, indirect=True)
def test_run_streams_output_and_exits_with_the_containers_code(podman, pod_image, uniq, home):
    name = f"imgtool-{uniq}"
    podman.containers.append(name)  # only if the run goes wrong
    r = run_on_podman(podman, "a3", pod_image, "--allow-missing-devices", "-q", "--net", "none", "--name", name,
                      "--env-preset", "deterministic",
                      "--", "sh", "-c", "echo out; echo err >&2; echo $HCCL_DETERMINISTIC; exit 7", home=home)
    assert r.returncode == 7
    assert r.stdout == "out\ntrue\n"
    assert r.stderr == "err\n"
    assert podman.container_gone(name)  # --rm is the default


def test_run_gives_the_container_the_shm_size_and_keeps_it_with_no_rm(podman, pod_image, uniq, home):
    name = f"imgtool-{uniq}"
    podman.containers.append(name)
    r = run_on_podman(podman, "a2", pod_image, "--allow-missing-devices", "--shm-size", "256m", "--no-rm",
                      "--net", "none", "--name", name, "--", "df", "-k", "/dev/shm", home=home)
    assert r.returncode == 0, r.stderr
    shm = [ln.split() for ln in r.stdout.splitlines() if ln.endswith("/dev/shm")]
    assert len(shm) == 1 and shm[0][1] == str(256 * 1024), r.stdout  # 1K-blocks
    assert r.stderr.startswith("--allow-missing-devices: leaving out ")
    state = json.loads(podman("container", "inspect", name).stdout)[0]
    assert state["HostConfig"]["ShmSize"] == 256 << 20
    assert state["HostConfig"]["Privileged"] is False
    assert [(m["Source"], m["Destination"]) for m in state["Mounts"]] == [("/root/.cache", "/root/.cache")]
    # the name is taken now: imgtool's own error, before podman is asked to run anything
    r = run_on_podman(podman, "a2", pod_image, "--allow-missing-devices", "-q", "--net", "none", "--name", name,
                      "--", "true", home=home)
    assert r.returncode == 5
    assert r.stderr.splitlines() == [f"error: a container named {name} already exists",
                                     f"hint: pass --name NEW_NAME, or remove the old one: podman rm -f {name}"]


def test_run_passes_devices_and_mounts_and_creates_the_cache_directory(podman, pod_image, uniq, home, tmp_path):
    """A preset's device nodes and mounts reach the container; its `create` directory is made first
    (podman, unlike Docker, refuses a missing bind-mount source)."""
    device = f"/dev/imgtool-test-{uniq}"  # presets take devices under /dev/ only; this test's own /dev/null
    os.mknod(device, 0o600 | stat.S_IFCHR, os.makedev(1, 3))
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "hello").write_text("hello from the host\n")
    cache = tmp_path / "no" / "cache"
    presets = tmp_path / "presets.toml"
    presets.write_text(f'[presets.probe]\nextends = "a2"\ndescription = "a2 with this test\'s device and directories"\n'
                       f'devices = ["{device}"]\nmounts = ["{tmp_path / "data"}:/data:ro", '
                       f'{{ host = "{cache}", container = "/cache", create = true }}]\n')
    name = f"imgtool-{uniq}"
    podman.containers.append(name)
    try:
        r = run_on_podman(podman, "probe", pod_image, "--presets", str(presets), "--allow-missing-devices", "-q",
                          "--net", "none", "--name", name, "-e", "GREETING=hi",
                          "--", "sh", "-c", f"test -c {device} && echo device; cat /data/hello; "
                                            "echo $GREETING > /cache/x; echo no > /data/x || echo read-only",
                          home=home)
    finally:
        os.unlink(device)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "device\nhello from the host\nread-only\n"
    assert (cache / "x").read_text() == "hi\n"
    assert not (tmp_path / "data" / "x").exists()


def test_run_privileged_only_when_asked(podman, pod_image, uniq, home):
    name = f"imgtool-{uniq}"
    podman.containers.append(name)
    r = run_on_podman(podman, "a2", pod_image, "--allow-missing-devices", "-q", "--privileged", "--no-rm",
                      "--net", "none", "--name", name, "--", "true", home=home)
    assert r.returncode == 0, r.stderr
    assert json.loads(podman("container", "inspect", name).stdout)[0]["HostConfig"]["Privileged"] is True
    assert r.stderr.splitlines() == [
        "warning: --privileged: it gives the container every host device and all kernel capabilities and turns off "
        "its seccomp/AppArmor confinement; use it only with an image you trust (vllm-ascend FAQ 20)"]


def test_run_detached(podman, pod_image, uniq, home):
    name = f"imgtool-{uniq}"
    podman.containers.append(name)
    r = run_on_podman(podman, "a2", pod_image, "--allow-missing-devices", "-q", "-d", "--net", "none",
                      "--name", name, "--", "sleep", "60", home=home)
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"{name}\n"
    state = json.loads(podman("container", "inspect", name).stdout)[0]
    assert state["State"]["Running"] is True
    assert state["HostConfig"]["AutoRemove"] is True
    podman("rm", "-f", "-t", "0", name)  # now, not with the image's removal (10 s of stop grace)


def test_run_refuses_an_image_that_is_not_loaded(podman, uniq, home):
    r = run_on_podman(podman, "a2", f"example.test/{uniq}/absent:v1", "--allow-missing-devices", "-q",
                      "--net", "none", home=home)
    assert r.returncode == 2
    assert r.stderr.splitlines() == [
        f"error: image example.test/{uniq}/absent:v1 is not loaded in Podman",
        "hint: load it first (imgtool load BUNDLE_DIR), or check the name with `podman images`"]


@pytest.fixture
def local_vllm(podman, pod_image, uniq, tmp_path):
    """A mirrors.toml whose default image is private to this test, with some of its tags in podman."""
    default_image = f"localhost/{uniq}/vllm-ascend"
    mirrors = tmp_path / "mirrors.toml"
    mirrors.write_text(f'default_image = "{default_image}"\n\n[[mirrors]]\nname = "quay"\nregistry = "quay.io"\n'
                       f'url = "https://quay.io"\n')
    tags = [f"{default_image}:{t}" for t in ("v0.9.0-a3", "v0.10.0rc1-a3", "v0.10.0-a3-openeuler", "v0.10.0-a3",
                                             "v0.9.9", "main")]
    podman("tag", pod_image, *tags)
    yield default_image, {"IMGTOOL_MIRRORS": str(mirrors)}
    podman("rmi", "-f", *tags, check=False)


@pytest.mark.parametrize("podman", PODMANS, indirect=True)
def test_run_flags_picks_the_newest_image_in_podman(podman, local_vllm, home):
    default_image, env = local_vllm
    flags = ("run-flags", "--runtime", "podman", "--one-line")
    r = imgtool(*flags, "a3", home=home, extra_env={**podman.cli_env, **env})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[-1] == f"{default_image}:v0.10.0-a3"
    assert r.stderr == ""
    r = imgtool(*flags, "a2", home=home, extra_env={**podman.cli_env, **env})
    assert r.stdout.split()[-1] == f"{default_image}:v0.9.9"
    # Docker's images are not Podman's: the same run-flags for Docker (unreachable here) has none
    r = imgtool("run-flags", "a3", "--one-line", home=home, extra_env={**podman.cli_env, **env})
    assert r.stdout.split()[-1] == f"'{default_image}:<version>-a3'"


def test_run_without_image_uses_the_newest_in_podman(podman, local_vllm, uniq, home):
    default_image, env = local_vllm
    name = f"imgtool-{uniq}"
    podman.containers.append(name)
    r = run_on_podman(podman, "a3", "--allow-missing-devices", "-q", "--net", "none", "--name", name,
                      "--", "echo", "hello", home=home, extra_env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "hello\n"
    r = run_on_podman(podman, "a5", "--allow-missing-devices", "-q", "--net", "none", home=home, extra_env=env)
    assert r.returncode == 2
    assert r.stderr.splitlines() == [
        f"error: no {default_image} image for preset a5 is loaded in Podman (looked for tags vX.Y.Z-a5, "
        "vX.Y.Z-a5-openeuler, vX.Y.Z-950dt, vX.Y.Z-950dt-openeuler)",
        "hint: name one: imgtool run a5 IMAGE, or load a bundle first: imgtool load DIR"]


def test_run_flags_warns_about_an_image_for_another_architecture(podman, factory, uniq, tmp_path, home):
    other = "arm64" if host_arch() == "amd64" else "amd64"
    image = factory.image(other, layers=1)  # podman reports no variant (linux/arm64, not linux/arm64/v8)
    ref = f"example.test/{uniq}/vllm-ascend:v0.11.0"
    podman("load", "-i", write_docker_archive(image, tmp_path / "in.tar", ref))
    try:
        r = imgtool("run-flags", "a2", "--runtime", "podman", "--image", ref, "--one-line", home=home,
                    extra_env=podman.cli_env)
    finally:
        podman("rmi", "-f", ref, check=False)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[-1] == ref  # still printed: the user may carry it elsewhere
    assert r.stderr.splitlines() == [
        f"warning: {ref} is for linux/{other} but this Podman host is linux/{host_arch()}: its containers "
        f"will not start (exec format error); fetch it with --arch {host_arch()}"]


def test_run_without_podman_is_one_line_and_exit_5(home, tmp_path):
    r = imgtool("run", "a2", "example.test/any/image:v1", "--runtime", "podman", "--allow-missing-devices",
                "-q", home=home, extra_env={"PATH": str(tmp_path)})
    assert r.returncode == 5
    assert r.stdout == ""
    assert r.stderr.splitlines() == NOT_INSTALLED
    # run-flags needs no runtime: the placeholder, as without Docker
    r = imgtool("run-flags", "a2", "--runtime", "podman", home=home, extra_env={"PATH": str(tmp_path)})
    assert r.returncode == 0 and r.stdout.startswith("podman run ")


def test_no_devices_on_this_host_is_refused_before_podman(home, tmp_path):
    r = imgtool("run", "a2", "busybox", "--runtime", "podman", home=home, code=NO_CARDS,
                extra_env={"PATH": str(tmp_path)})
    assert r.returncode == 1
    assert r.stderr.splitlines() == [
        "error: no Ascend cards found on this host: none of /dev/davinci[0-7] exist",
        "hint: is the Ascend driver installed (npu-smi info)? --allow-missing-devices starts the container "
        "without what is absent",
    ]


def _read_until(stream, marker: bytes, deadline: float) -> bytes:
    out = b""
    while marker not in out:
        assert time.monotonic() < deadline, f"no {marker!r} in time; got {out!r}"
        ready, _, _ = select.select([stream], [], [], 0.2)
        if ready:
            chunk = os.read(stream.fileno(), 4096)
            assert chunk, f"output ended before {marker!r}: {out!r}"
            out += chunk
    return out


def test_sigterm_stops_and_removes_the_container(podman, pod_image, uniq, home):
    """SIGTERM (and Ctrl-C) while following: the container is stopped, removed (--rm), and imgtool exits 130."""
    name = f"imgtool-{uniq}"
    podman.containers.append(name)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DOCKER_", "IMGTOOL_PRESETS", "IMGTOOL_MIRRORS"))}
    env.update(podman.cli_env, HOME=str(home), DOCKER_HOST=DEAD_DOCKER)
    proc = subprocess.Popen(
        [sys.executable, "-m", "imgtool", "run", "a2", pod_image, "--runtime", "podman", "--allow-missing-devices",
         "-q", "--net", "none", "--name", name, "--",
         "sh", "-c", "trap 'echo stopping; exit 0' TERM; echo ready; sleep 300 & wait"],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        out = _read_until(proc.stdout, b"ready\n", time.monotonic() + 60)
        proc.send_signal(signal.SIGTERM)
        rest, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130
    assert out + rest == b"ready\nstopping\n"
    # click's words for an interrupted verb (its empty line first), the same as on Docker; podman's own
    # log lines (its --rm cleanup racing the stop, in this sandbox) are podman's, not imgtool's
    assert [line for line in err.decode().splitlines() if not line.startswith("time=")] == ["", "error: interrupted"]
    assert podman.container_gone(name)


@pytest.mark.parametrize("runner", ["module", "pyz-3.7"])
def test_run_is_interactive_on_a_terminal(runner, podman, pod_image, uniq, home, tmp_path):
    """On a terminal `imgtool run --runtime podman` is `podman run -it`: as installed, and as Kylin runs
    it (imgtool.pyz on python3 3.7, nothing installed)."""

    from imgtool import selfbundle
    from tests.test_selfbundle import old_python

    name = f"imgtool-{uniq}"
    podman.containers.append(name)  # only if the session below goes wrong
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DOCKER_", "IMGTOOL_PRESETS", "IMGTOOL_MIRRORS"))}
    env.update(podman.cli_env, HOME=str(home), TERM="xterm", DOCKER_HOST=DEAD_DOCKER)
    argv = [sys.executable, "-m", "imgtool"]
    if runner == "pyz-3.7":
        selfbundle.build(tmp_path / "imgtool.pyz")
        argv = [*old_python("3.7"), str(tmp_path / "imgtool.pyz")]
        env = {"PATH": podman.cli_env["PATH"].split(os.pathsep)[0] + ":/usr/sbin:/usr/bin:/sbin:/bin",
               "HOME": str(home), "LANG": "C.UTF-8", "TERM": "xterm",
               "CONTAINERS_STORAGE_CONF": podman.cli_env["CONTAINERS_STORAGE_CONF"],
               "CONTAINERS_CONF": podman.cli_env["CONTAINERS_CONF"], "DOCKER_HOST": DEAD_DOCKER}
    argv += ["run", "a2", pod_image, "--runtime", "podman", "-q", "--allow-missing-devices", "--net", "none",
             "--name", name, "--", "sh"]
    out, sent, code = session_on_a_terminal(argv, env)
    assert sent, out
    assert code == 3, out
    assert b"/dev/pts/" in out and b"\r\n42\r\n" in out
    assert podman.container_gone(name)


@pytest.mark.parametrize("podman", PODMANS, indirect=True)
def test_run_model_mounts_its_modelcar_image_where_the_container_reads_every_file(podman, pod_image, uniq, home,
                                                                                   tmp_path):
    """Issue 49 on Podman (5.8 and 4.3): a model placed in the HF cache whose modelcar image `load --models image`
    imported is served from that image (`--mount type=image`, read-only), not the placed folder; the container reads
    every file at the path `vllm serve` is given, each sha256 the one bundle.json records."""
    from tests.support.modelcars import assert_read_every_file, modelcar_bundle, read_every_file
    from tests.support.models import small_model
    from tests.test_placed import REPO, place_hf

    model = small_model(seed=4931)
    place_hf(model, tmp_path / "hf")
    bundle, car = modelcar_bundle(tmp_path, model)
    env = {**podman.cli_env, "HF_HUB_CACHE": str(tmp_path / "hf"), "MODELSCOPE_CACHE": str(tmp_path / "ms")}
    try:
        r = imgtool("load", str(bundle), "--runtime", "podman", "--models", "image", home=home, extra_env=env)
        assert r.returncode == 0, r.stderr
        flags = imgtool("run-flags", "a3", "--runtime", "podman", "--image", pod_image, "--model", REPO, "--one-line",
                        home=home, extra_env=env)
        assert flags.returncode == 0, flags.stderr
        argv = shlex.split(flags.stdout)
        assert f"type=image,source={car},destination=/mnt/modelcar" in argv  # not the placed folder
        assert argv[-5:] == ["vllm", "serve", "/mnt/modelcar/models", "--served-model-name", REPO]
        name = f"imgtool-{uniq}"
        podman.containers.append(name)
        r = run_on_podman(podman, "a3", pod_image, "--allow-missing-devices", "-q", "--net", "none", "--name", name,
                          "--model", REPO, "--", "sh", "-c", read_every_file("/mnt/modelcar/models"), home=home,
                          extra_env=env)
        assert r.returncode == 0, r.stderr
        assert_read_every_file(r.stdout, bundle)
    finally:
        podman("rmi", "-f", car, check=False)
