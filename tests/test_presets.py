"""docker run presets: `imgtool presets`, `imgtool run-flags`, `imgtool run` through the real CLI.

The golden commands are what an operator pastes on an Ascend host; `imgtool run` is exercised
against the test dockerd with a busybox image built here (no NPU needed: --allow-missing-devices).
"""

import io
import json
import os
import shlex
import subprocess
import sys
import tarfile

import pytest

from imgtool import presets as P
from imgtool.runtimes.docker import explain_run_error
from imgtool.errors import ImgtoolError
from tests.support import zygote
from tests.support.images import static_busybox
from tests.support.terminal import session_on_a_terminal

DEAD_DOCKER = "unix:///nonexistent/imgtool-test-docker.sock"
PRIVILEGED_ASKED = (
    "warning: --privileged: it gives the container every host device and all kernel capabilities and turns off "
    "its seccomp/AppArmor confinement; use it only with an image you trust (vllm-ascend FAQ 20)"
)
PLACEHOLDER_NOTE = ("warning: no quay.io/ascend/vllm-ascend image for preset {} is loaded here; "
                    "replace <version> in the command or pass --image")


def imgtool(*args, home, docker_host=DEAD_DOCKER, extra_env=None, timeout=120, code=None):
    """Run the real CLI in a clean environment: no user presets/mirrors unless given.

    `code` runs the CLI through that Python source instead of `-m imgtool` (it sees the
    arguments in sys.argv[1:]), for a host fact injected the way the in-process tests do.
    """
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("DOCKER_", "IMGTOOL_PRESETS", "IMGTOOL_MIRRORS"))}
    env["HOME"] = str(home)
    env["DOCKER_HOST"] = docker_host
    env.update(extra_env or {})
    if args[:1] in (("run",), ("run-flags",)) and not {"--runtime", "--format"} & set(args):
        # Docker's syntax by name: auto (the default) would render Podman's on a host where Podman answers
        # (test_run_flags_chooses_the_runtime_as_load_does holds the default)
        args = (args[0], "--runtime", "docker") + args[1:]
    if code is None:
        return zygote.run(args, env=env, timeout=timeout)
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, timeout=timeout)


@pytest.fixture
def home(tmp_path):
    h = tmp_path / "home"
    h.mkdir()
    return h


GOLDEN = {
    "a2": """\
docker run --rm -it --name vllm-ascend --shm-size=1g \\
    --device /dev/davinci0 \\
    --device /dev/davinci1 \\
    --device /dev/davinci2 \\
    --device /dev/davinci3 \\
    --device /dev/davinci4 \\
    --device /dev/davinci5 \\
    --device /dev/davinci6 \\
    --device /dev/davinci7 \\
    --device /dev/davinci_manager \\
    --device /dev/devmm_svm \\
    --device /dev/hisi_hdc \\
    -v /usr/local/dcmi:/usr/local/dcmi \\
    -v /usr/local/bin/npu-smi:/usr/local/bin/npu-smi \\
    -v /usr/local/Ascend/driver/lib64/:/usr/local/Ascend/driver/lib64/ \\
    -v /usr/local/Ascend/driver/version.info:/usr/local/Ascend/driver/version.info \\
    -v /etc/ascend_install.info:/etc/ascend_install.info \\
    -v /root/.cache:/root/.cache \\
    -p 8000:8000 \\
    'quay.io/ascend/vllm-ascend:<version>'""",
    "a3": """\
docker run --rm -it --name vllm-ascend --shm-size=1g \\
    --device /dev/davinci0 \\
    --device /dev/davinci1 \\
    --device /dev/davinci2 \\
    --device /dev/davinci3 \\
    --device /dev/davinci4 \\
    --device /dev/davinci5 \\
    --device /dev/davinci6 \\
    --device /dev/davinci7 \\
    --device /dev/davinci8 \\
    --device /dev/davinci9 \\
    --device /dev/davinci10 \\
    --device /dev/davinci11 \\
    --device /dev/davinci12 \\
    --device /dev/davinci13 \\
    --device /dev/davinci14 \\
    --device /dev/davinci15 \\
    --device /dev/davinci_manager \\
    --device /dev/devmm_svm \\
    --device /dev/hisi_hdc \\
    -v /usr/local/dcmi:/usr/local/dcmi \\
    -v /usr/local/bin/npu-smi:/usr/local/bin/npu-smi \\
    -v /usr/local/Ascend/driver/lib64/:/usr/local/Ascend/driver/lib64/ \\
    -v /usr/local/Ascend/driver/version.info:/usr/local/Ascend/driver/version.info \\
    -v /etc/ascend_install.info:/etc/ascend_install.info \\
    -v /root/.cache:/root/.cache \\
    -p 8000:8000 \\
    'quay.io/ascend/vllm-ascend:<version>-a3'""",
    "300i-duo": """\
docker run --rm -it --name vllm-ascend --shm-size=1g \\
    --device /dev/davinci0 \\
    --device /dev/davinci1 \\
    --device /dev/davinci2 \\
    --device /dev/davinci3 \\
    --device /dev/davinci4 \\
    --device /dev/davinci5 \\
    --device /dev/davinci6 \\
    --device /dev/davinci7 \\
    --device /dev/davinci8 \\
    --device /dev/davinci9 \\
    --device /dev/davinci10 \\
    --device /dev/davinci11 \\
    --device /dev/davinci12 \\
    --device /dev/davinci13 \\
    --device /dev/davinci14 \\
    --device /dev/davinci15 \\
    --device /dev/davinci_manager \\
    --device /dev/devmm_svm \\
    --device /dev/hisi_hdc \\
    -v /usr/local/dcmi:/usr/local/dcmi \\
    -v /usr/local/bin/npu-smi:/usr/local/bin/npu-smi \\
    -v /usr/local/Ascend/driver/lib64/:/usr/local/Ascend/driver/lib64/ \\
    -v /usr/local/Ascend/driver/version.info:/usr/local/Ascend/driver/version.info \\
    -v /etc/ascend_install.info:/etc/ascend_install.info \\
    -v /root/.cache:/root/.cache \\
    -p 8000:8000 \\
    'quay.io/ascend/vllm-ascend:<version>-310p'""",
    "200i-pro": """\
docker run --rm -it --name vllm-ascend --privileged --shm-size=10g \\
    --device /dev/davinci0 \\
    --device /dev/davinci_manager \\
    --device /dev/ascend_manager \\
    --device /dev/user_config \\
    -v /etc/sys_version.conf:/etc/sys_version.conf \\
    -v /etc/ld.so.conf.d/mind_so.conf:/etc/ld.so.conf.d/mind_so.conf \\
    -v /etc/hdcBasic.cfg:/etc/hdcBasic.cfg \\
    -v /var/dmp_daemon:/var/dmp_daemon \\
    -v /usr/lib64/libmmpa.so:/usr/lib64/libmmpa.so \\
    -v /usr/lib64/libcrypto.so.1.1:/usr/lib64/libcrypto.so.1.1 \\
    -v /usr/local/sbin/npu-smi:/usr/local/sbin/npu-smi \\
    -v /usr/lib64/libstackcore.so:/usr/lib64/libstackcore.so \\
    -v /usr/lib/aarch64-linux-gnu/libyaml-0.so.2:/usr/lib64/libyaml-0.so.2 \\
    -v /etc/slog.conf:/etc/slog.conf \\
    -v /var/slogd:/var/slogd \\
    -v /usr/local/Ascend/driver/lib64:/usr/local/Ascend/driver/lib64 \\
    -v /usr/lib64/libtensorflow.so:/usr/lib64/libtensorflow.so \\
    -v /root/.cache:/root/.cache \\
    -p 8000:8000 \\
    'quay.io/ascend/vllm-ascend:<version>-310p'""",
    "200i-pro-openeuler": """\
docker run --rm -it --name vllm-ascend --privileged --shm-size=10g \\
    --device /dev/davinci0 \\
    --device /dev/davinci_manager \\
    --device /dev/ascend_manager \\
    --device /dev/user_config \\
    -v /etc/sys_version.conf:/etc/sys_version.conf \\
    -v /etc/ld.so.conf.d/mind_so.conf:/etc/ld.so.conf.d/mind_so.conf \\
    -v /etc/hdcBasic.cfg:/etc/hdcBasic.cfg \\
    -v /var/dmp_daemon:/var/dmp_daemon \\
    -v /usr/lib64/libsemanage.so.2:/usr/lib64/libsemanage.so.2 \\
    -v /usr/lib64/libmmpa.so:/usr/lib64/libmmpa.so \\
    -v /usr/lib64/libcrypto.so.1.1:/usr/lib64/libcrypto.so.1.1 \\
    -v /usr/lib64/libyaml-0.so.2.0.9:/usr/lib64/libyaml-0.so.2 \\
    -v /usr/local/sbin/npu-smi:/usr/local/sbin/npu-smi \\
    -v /usr/lib64/libstackcore.so:/usr/lib64/libstackcore.so \\
    -v /etc/slog.conf:/etc/slog.conf \\
    -v /var/slogd:/var/slogd \\
    -v /usr/local/Ascend/driver/lib64:/usr/local/Ascend/driver/lib64 \\
    -v /usr/lib64/libtensorflow.so:/usr/lib64/libtensorflow.so \\
    -v /root/.cache:/root/.cache \\
    -p 8000:8000 \\
    'quay.io/ascend/vllm-ascend:<version>-310p'""",
    "a5": """\
docker run --rm -it --name vllm-ascend --net=host --shm-size=1g \\
    --device /dev/davinci0 \\
    --device /dev/davinci1 \\
    --device /dev/davinci2 \\
    --device /dev/davinci3 \\
    --device /dev/davinci4 \\
    --device /dev/davinci5 \\
    --device /dev/davinci6 \\
    --device /dev/davinci7 \\
    --device /dev/davinci_manager \\
    --device /dev/devmm_svm \\
    --device /dev/hisi_hdc \\
    -v /usr/local/dcmi:/usr/local/dcmi \\
    -v /usr/local/Ascend/driver/tools/hccn_tool:/usr/local/Ascend/driver/tools/hccn_tool \\
    -v /usr/local/bin/npu-smi:/usr/local/bin/npu-smi \\
    -v /usr/local/Ascend/driver/lib64/:/usr/local/Ascend/driver/lib64/ \\
    -v /usr/local/Ascend/driver/version.info:/usr/local/Ascend/driver/version.info \\
    -v /etc/ascend_install.info:/etc/ascend_install.info \\
    -v /root/.cache:/root/.cache \\
    'quay.io/ascend/vllm-ascend:<version>-a5'""",
}


@pytest.mark.parametrize("preset", sorted(GOLDEN))
def test_run_flags_golden(preset, home):
    # No daemon to ask for a local image: the placeholder tag, with a warning saying so.
    r = imgtool("run-flags", preset, home=home)
    assert r.returncode == 0, r.stderr
    assert r.stdout == GOLDEN[preset] + "\n"
    assert PLACEHOLDER_NOTE.format(preset) in r.stderr.splitlines()


def test_every_builtin_preset_has_a_golden():
    assert sorted(P.load_presets().names()) == sorted(GOLDEN)


def test_one_line_is_the_same_command(home):
    r = imgtool("run-flags", "a3", "--one-line", home=home)
    assert r.returncode == 0
    assert r.stdout == GOLDEN["a3"].replace(" \\\n    ", " ") + "\n"
    # pasted into a real shell, both forms give docker the same words
    for command in (r.stdout, GOLDEN["a3"]):
        words = subprocess.run(["bash", "-c", 'docker() { printf "%s\\0" "$@"; }\n' + command],
                               capture_output=True, text=True, check=True).stdout.split("\0")[:-1]
        assert words == shlex.split(r.stdout)[1:]


def test_a3_has_all_cards_management_devices_and_mounts_and_no_privileged(home):
    r = imgtool("run-flags", "a3", "--image", "v0.11.0rc1-a3", "--one-line", home=home)
    assert r.returncode == 0
    argv = shlex.split(r.stdout)
    devices = [argv[i + 1] for i, a in enumerate(argv) if a == "--device"]
    assert devices == [f"/dev/davinci{n}" for n in range(16)] + [
        "/dev/davinci_manager", "/dev/devmm_svm", "/dev/hisi_hdc"]
    mounts = [argv[i + 1] for i, a in enumerate(argv) if a == "-v"]
    for path in ("/usr/local/dcmi", "/usr/local/bin/npu-smi", "/usr/local/Ascend/driver/lib64/",
                 "/usr/local/Ascend/driver/version.info", "/etc/ascend_install.info", "/root/.cache"):
        assert f"{path}:{path}" in mounts
    assert "--privileged" not in argv
    assert "privileged" not in r.stderr
    assert argv[-1] == "quay.io/ascend/vllm-ascend:v0.11.0rc1-a3"
    assert r.stderr == ""


def test_privileged_only_when_asked_and_then_warned(home):
    r = imgtool("run-flags", "a3", "--image", "v0.11.0rc1-a3", "--privileged", home=home)
    assert r.returncode == 0
    assert "--privileged" in shlex.split(r.stdout)
    assert r.stderr.splitlines() == [PRIVILEGED_ASKED]
    # --json too: the warning goes to stderr, stdout stays JSON
    r = imgtool("run-flags", "a3", "--image", "v0.11.0rc1-a3", "--privileged", "--json", home=home)
    assert json.loads(r.stdout)["privileged"] is True
    assert r.stderr.splitlines() == [PRIVILEGED_ASKED]


def test_preset_that_requires_privileged_says_so(home):
    r = imgtool("run-flags", "200i-pro", "--image", "v0.11.0rc1-310p", home=home)
    assert r.returncode == 0
    assert r.stderr.splitlines() == [
        "warning: preset 200i-pro runs with --privileged, as the vllm-ascend docs do for this hardware: it gives "
        "the container every host device and all kernel capabilities and turns off its seccomp/AppArmor "
        "confinement; use it only with an image you trust (vllm-ascend FAQ 20)"]


def test_options_change_the_command(home):
    r = imgtool("run-flags", "a2", "--image", "registry.local:5000/team/vllm-ascend:v0.11.0rc1",
                "--devices", "0,2-3", "--shm-size", "1.5g", "--name", "serve-1",
                "--env-preset", "deterministic", "--env-preset", "expandable-segments", "-e", "VLLM_USE_MODELSCOPE=True",
                "-v", "/data/models:/models:ro", "-p", "127.0.0.1:8080:8000", "--no-rm", "-d",
                "--", "vllm", "serve", "/models/Qwen3 8B", home=home)
    assert r.returncode == 0, r.stderr
    assert r.stdout == """\
docker run -it -d --name serve-1 --shm-size=1536m \\
    --device /dev/davinci0 \\
    --device /dev/davinci2 \\
    --device /dev/davinci3 \\
    --device /dev/davinci_manager \\
    --device /dev/devmm_svm \\
    --device /dev/hisi_hdc \\
    -v /usr/local/dcmi:/usr/local/dcmi \\
    -v /usr/local/bin/npu-smi:/usr/local/bin/npu-smi \\
    -v /usr/local/Ascend/driver/lib64/:/usr/local/Ascend/driver/lib64/ \\
    -v /usr/local/Ascend/driver/version.info:/usr/local/Ascend/driver/version.info \\
    -v /etc/ascend_install.info:/etc/ascend_install.info \\
    -v /root/.cache:/root/.cache \\
    -v /data/models:/models:ro \\
    -e LCCL_DETERMINISTIC=1 \\
    -e HCCL_DETERMINISTIC=true \\
    -e ATB_MATMUL_SHUFFLE_K_ENABLE=0 \\
    -e ATB_LLM_LCOC_ENABLE=0 \\
    -e PYTORCH_NPU_ALLOC_CONF=expandable_segments:True \\
    -e VLLM_USE_MODELSCOPE=True \\
    -p 127.0.0.1:8080:8000 \\
    registry.local:5000/team/vllm-ascend:v0.11.0rc1 vllm serve '/models/Qwen3 8B'
"""
    assert r.stderr == ""


def test_multi_node_uses_host_network_and_hccn_tool(home):
    r = imgtool("run-flags", "a3", "--multi-node", "--image", "v0.11.0rc1-a3", "--one-line", home=home)
    assert r.returncode == 0
    argv = shlex.split(r.stdout)
    assert "--net=host" in argv and "-p" not in argv
    hccn = "/usr/local/Ascend/driver/tools/hccn_tool"
    assert argv[argv.index(f"{hccn}:{hccn}") - 1] == "-v"
    assert [a for a in argv if a.startswith("/dev/davinci")][:16] == [f"/dev/davinci{n}" for n in range(16)]
    # a5 already has both; --multi-node adds no second hccn_tool mount
    r = imgtool("run-flags", "a5", "--multi-node", "--image", "v0.11.0rc1-a5", "--one-line", home=home)
    assert shlex.split(r.stdout).count(f"{hccn}:{hccn}") == 1
    # --net host on its own drops the published port too
    r = imgtool("run-flags", "a2", "--net", "host", "--image", "v0.11.0rc1", "--one-line", home=home)
    assert "--net=host" in r.stdout and " -p " not in r.stdout


def test_json_flags(home):
    r = imgtool("run-flags", "a2", "--image", "v0.11.0rc1", "--devices", "0", "--env-preset", "deterministic",
                "--json", home=home)
    assert r.returncode == 0, r.stderr
    spec = json.loads(r.stdout)
    assert spec["preset"] == "a2"
    assert spec["image"] == "quay.io/ascend/vllm-ascend:v0.11.0rc1"
    assert spec["image_is_placeholder"] is False
    assert spec["devices"] == ["/dev/davinci0", "/dev/davinci_manager", "/dev/devmm_svm", "/dev/hisi_hdc"]
    assert spec["shm_size"] == "1g" and spec["shm_size_bytes"] == 1 << 30
    assert spec["env"] == {"LCCL_DETERMINISTIC": "1", "HCCL_DETERMINISTIC": "true",
                           "ATB_MATMUL_SHUFFLE_K_ENABLE": "0", "ATB_LLM_LCOC_ENABLE": "0"}
    assert spec["ports"] == ["8000:8000"] and spec["network"] is None and spec["privileged"] is False
    assert {"host": "/root/.cache", "container": "/root/.cache", "readonly": False, "create": True} in spec["mounts"]
    assert spec["argv"] == shlex.split(spec["command_line"])
    assert spec["argv"][:2] == ["docker", "run"]


# --- the same presets for Podman (--runtime podman) ----------------------------------------

# Podman 4.3 takes every flag of the Docker command in the same syntax (--net is its alias of
# --network); --pull=never is added: `podman run` pulls a missing image by default, and an offline
# host must get "image not known" instead of a pull (or a short-name prompt).
PODMAN_GOLDEN = {
    "a2": """\
podman run --rm -it --pull=never --name vllm-ascend --shm-size=1g \\
    --device /dev/davinci0 \\
    --device /dev/davinci1 \\
    --device /dev/davinci2 \\
    --device /dev/davinci3 \\
    --device /dev/davinci4 \\
    --device /dev/davinci5 \\
    --device /dev/davinci6 \\
    --device /dev/davinci7 \\
    --device /dev/davinci_manager \\
    --device /dev/devmm_svm \\
    --device /dev/hisi_hdc \\
    -v /usr/local/dcmi:/usr/local/dcmi \\
    -v /usr/local/bin/npu-smi:/usr/local/bin/npu-smi \\
    -v /usr/local/Ascend/driver/lib64/:/usr/local/Ascend/driver/lib64/ \\
    -v /usr/local/Ascend/driver/version.info:/usr/local/Ascend/driver/version.info \\
    -v /etc/ascend_install.info:/etc/ascend_install.info \\
    -v /root/.cache:/root/.cache \\
    -p 8000:8000 \\
    'quay.io/ascend/vllm-ascend:<version>'""",
}


@pytest.mark.parametrize("preset", sorted(PODMAN_GOLDEN))
def test_run_flags_podman_golden(preset, home):
    # PATH without podman: run-flags needs no runtime, it prints the placeholder and says so
    r = imgtool("run-flags", preset, "--runtime", "podman", home=home, extra_env={"PATH": "/nonexistent"})
    assert r.returncode == 0, r.stderr
    assert r.stdout == PODMAN_GOLDEN[preset] + "\n"
    assert PLACEHOLDER_NOTE.format(preset) in r.stderr.splitlines()


@pytest.mark.parametrize("preset", sorted(GOLDEN))
def test_podman_gets_every_presets_docker_flags_and_never_pulls(preset, home):
    r = imgtool("run-flags", preset, "--runtime", "podman", home=home, extra_env={"PATH": "/nonexistent"})
    assert r.returncode == 0, r.stderr
    docker_words = shlex.split(GOLDEN[preset])
    podman_words = shlex.split(r.stdout)
    assert docker_words[:4] == ["docker", "run", "--rm", "-it"]
    assert podman_words == ["podman", "run", "--rm", "-it", "--pull=never", *docker_words[4:]]
    # --runtime docker is the default, word for word
    r = imgtool("run-flags", preset, "--runtime", "docker", home=home)
    assert (r.returncode, r.stdout) == (0, GOLDEN[preset] + "\n")


def test_podman_options_change_the_command(home):
    """Every option renders for podman as for docker (the words after `podman run` are docker's, with
    --pull=never after -it/-d): the docker golden of these options is test_options_change_the_command's."""
    options = ["a2", "--image", "registry.local:5000/team/vllm-ascend:v0.11.0rc1",
               "--devices", "0,2-3", "--shm-size", "1.5g", "--name", "serve-1", "--privileged",
               "--env-preset", "deterministic", "-e", "VLLM_USE_MODELSCOPE=True",
               "-v", "/data/models:/models:ro", "-p", "127.0.0.1:8080:8000", "--no-rm", "-d",
               "--", "vllm", "serve", "/models/Qwen3 8B"]
    r = imgtool("run-flags", options[0], "--runtime", "podman", *options[1:], home=home,
                extra_env={"PATH": "/nonexistent"})
    docker = imgtool("run-flags", options[0], "--runtime", "docker", *options[1:], home=home,
                     extra_env={"PATH": "/nonexistent"})
    assert r.returncode == 0 and docker.returncode == 0, r.stderr + docker.stderr
    assert r.stdout.splitlines()[0] == \
        "podman run -it -d --pull=never --name serve-1 --privileged --shm-size=1536m \\"
    assert docker.stdout.splitlines()[0] == "docker run -it -d --name serve-1 --privileged --shm-size=1536m \\"
    assert r.stdout.splitlines()[1:] == docker.stdout.splitlines()[1:]
    assert "    -v /data/models:/models:ro \\" in r.stdout.splitlines()
    assert r.stdout.splitlines()[-1] == "    registry.local:5000/team/vllm-ascend:v0.11.0rc1 vllm serve '/models/Qwen3 8B'"
    assert r.stderr.splitlines() == [PRIVILEGED_ASKED]
    r = imgtool("run-flags", "a3", "--runtime", "podman", "--multi-node", "--image", "v0.11.0rc1-a3", "--one-line",
                home=home, extra_env={"PATH": "/nonexistent"})
    argv = shlex.split(r.stdout)
    assert argv[:5] == ["podman", "run", "--rm", "-it", "--pull=never"] and "--net=host" in argv and "-p" not in argv


def test_podman_json_flags(home):
    r = imgtool("run-flags", "a2", "--runtime", "podman", "--image", "v0.11.0rc1", "--devices", "0", "--json",
                home=home, extra_env={"PATH": "/nonexistent"})
    assert r.returncode == 0, r.stderr
    spec = json.loads(r.stdout)
    docker = json.loads(imgtool("run-flags", "a2", "--image", "v0.11.0rc1", "--devices", "0", "--json",
                                home=home).stdout)
    assert spec["argv"][:5] == ["podman", "run", "--rm", "-it", "--pull=never"]
    assert spec["argv"][5:] == docker["argv"][4:]
    assert spec["command_line"] == shlex.join(spec["argv"])
    assert {k: v for k, v in spec.items() if k not in ("argv", "command_line")} == \
        {k: v for k, v in docker.items() if k not in ("argv", "command_line")}


def test_unknown_runtime_is_bad_usage(home):
    r = imgtool("run-flags", "a2", "--runtime", "isula", home=home)
    assert r.returncode == 2
    assert r.stderr.splitlines()[0] == ("error: invalid value for '--runtime': 'isula' is not one of 'auto', 'docker', "
                                        "'containerd', 'podman'")


def test_run_flags_chooses_the_runtime_as_load_does(home):
    """Issue 37: run-flags defaulted to docker while load defaults to auto. Now both choose alike: with Docker's
    socket dead and Podman here, Podman's `run`; with no runtime answering, Docker's syntax (run-flags needs none);
    containerd, which has no `run` of its own (the kubelet starts its containers), gets a Pod; `run` refuses it."""
    r = imgtool("run-flags", "a2", "--runtime", "auto", "--image", "v1", "--one-line", home=home)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("podman run --rm -it --pull=never --name vllm-ascend ")
    nothing = imgtool("run-flags", "a2", "--runtime", "auto", "--image", "v1", "--one-line", home=home,
                      extra_env={"PATH": "/nonexistent"})
    assert nothing.returncode == 0, nothing.stderr
    assert nothing.stdout.startswith("docker run --rm -it --name vllm-ascend ")
    pod = imgtool("run-flags", "a2", "--runtime", "containerd", "--image", "v1", home=home,
                  extra_env={"PATH": "/nonexistent"})
    assert pod.returncode == 0, pod.stderr
    assert "kind: Pod\n" in pod.stdout and "image: quay.io/ascend/vllm-ascend:v1\n" in pod.stdout
    run = imgtool("run", "a2", "v1", "--runtime", "containerd", "--allow-missing-devices", home=home)
    assert run.returncode == 2
    assert run.stderr.splitlines()[-2:] == [
        "error: imgtool run starts containers through Docker or Podman; containerd has no `run` of its own (on a "
        "Kubernetes node the kubelet starts its containers)",
        "hint: write a Pod for it: imgtool run-flags PRESET --format k8s > pod.yaml, then kubectl apply -f pod.yaml; "
        "or choose another runtime with --runtime"]


def test_presets_lists_every_preset_with_a_description(home):
    r = imgtool("presets", home=home)
    assert r.returncode == 0
    lines = r.stdout.splitlines()
    assert lines[0].split()[:4] == ["PRESET", "CARDS", "IMAGE", "TAG"]
    for p in P.load_presets().presets:
        row = next(ln for ln in lines if ln.split()[0] == p.name)
        assert row.endswith(p.description)
    assert "--multi-node applies to: a2, a3, a5" in lines
    assert "--env-preset deterministic: bit-for-bit repeatable results (FAQ 15), at some speed cost" in lines
    r = imgtool("presets", "--json", home=home)
    data = json.loads(r.stdout)
    assert [p["name"] for p in data["presets"]] == ["a2", "a3", "300i-duo", "200i-pro", "200i-pro-openeuler", "a5"]
    a3 = data["presets"][1]
    assert a3["cards"] == "0-15" and a3["min_cards"] == 2 and a3["tag_suffixes"] == ["-a3", "-a3-openeuler"]
    assert data["multi_node"]["network"] == "host"
    assert [e["name"] for e in data["env_presets"]] == ["deterministic", "expandable-segments"]


# --- bad input: one line, exit 2 ---------------------------------------------------


@pytest.mark.parametrize("args, message", [
    (["run-flags", "a4"],
     "error: unknown preset 'a4'; known presets: a2, a3, 300i-duo, 200i-pro, 200i-pro-openeuler, a5"),
    (["run-flags", "a2", "--devices", "0-8"],
     "error: invalid --devices '0-8': card 8 is outside preset a2's range 0-7"),
    (["run-flags", "a2", "--devices", "one"],
     "error: invalid --devices 'one': expected card numbers like 0,1 or 0-7, or all"),
    (["run-flags", "a3", "--devices", "5"],
     "error: invalid --devices '5': preset a3 needs at least 2 cards"),
    (["run-flags", "a2", "--shm-size", "lots"],
     "error: invalid --shm-size 'lots': use a number with an optional unit K, M, G, T (binary), e.g. 4G or 700M"),
    (["run-flags", "a2", "--shm-size", "0"],
     "error: invalid --shm-size '0': must be greater than zero"),
    (["run-flags", "300i-duo", "--multi-node"],
     "error: --multi-node does not apply to preset 300i-duo; it applies to: a2, a3, a5"),
    (["run-flags", "a2", "--env-preset", "fast"],
     "error: unknown --env-preset 'fast'; known: deterministic, expandable-segments"),
    (["run-flags", "a2", "-e", "NOVALUE"], "error: invalid --env 'NOVALUE': expected NAME=VALUE"),
    # issue 35: names ending in a newline passed (a regex `$` matches before a final newline)
    (["run-flags", "a2", "--name", "vllm\n"],
     "error: invalid --name 'vllm\\n': letters, digits, '_', '.', '-', starting with a letter or digit"),
    (["run-flags", "a2", "--net", "host\n"],
     "error: invalid --net 'host\\n': expected host, bridge, none or a network name"),
    (["run-flags", "a2", "-e", "HOME\n=/x"], "error: invalid --env 'HOME\\n=/x': expected NAME=VALUE"),
    (["run-flags", "a2", "-v", "models:/models"],
     "error: invalid --volume 'models:/models': host and container paths must be absolute, without spaces"),
    (["run-flags", "a2", "-p", "http"],
     "error: invalid --publish 'http': expected [IP:]HOST:CONTAINER[/tcp|udp], e.g. 8000:8000"),
    (["run", "a4", "busybox"],
     "error: unknown preset 'a4'; known presets: a2, a3, 300i-duo, 200i-pro, 200i-pro-openeuler, a5"),
    (["run", "a2", "busybox", "--devices", "9"],
     "error: invalid --devices '9': card 9 is outside preset a2's range 0-7"),
    (["run", "a2", "busybox", "--shm-size", "1x"],
     "error: invalid --shm-size '1x': use a number with an optional unit K, M, G, T (binary), e.g. 4G or 700M"),
])
def test_bad_input_is_one_line_and_exit_2(args, message, home):
    r = imgtool(*args, home=home)
    assert r.returncode == 2
    assert r.stdout == ""
    assert r.stderr.splitlines() == [message]


# The real CLI on a host without Ascend cards, whatever this host has: fit_to_host sees no
# /dev/davinciN (the injection the tests below use), everything else as it is.
NO_CARDS = """
import functools, os, re, sys
import imgtool.presets as P
cards = re.compile(r"/dev/davinci[0-9]+")
P.fit_to_host = functools.partial(P.fit_to_host, exists=lambda p: not cards.fullmatch(p) and os.path.exists(p))
from imgtool.cli import main
main(sys.argv[1:])
"""


def test_no_devices_on_this_host(home):
    # `run` must refuse before talking to Docker (DOCKER_HOST is a dead socket here); the same
    # on an Ascend host, where the suite must pass too.
    r = imgtool("run", "a2", "busybox", home=home, code=NO_CARDS)
    assert r.returncode == 1
    assert r.stderr.splitlines() == [
        "error: no Ascend cards found on this host: none of /dev/davinci[0-7] exist",
        "hint: is the Ascend driver installed (npu-smi info)? --allow-missing-devices starts the container "
        "without what is absent",
    ]
    r = imgtool("run", "a3", "busybox", "--devices", "2,3", home=home, code=NO_CARDS)
    assert r.returncode == 1
    assert r.stderr.splitlines()[0] == "error: no Ascend cards found on this host: none of /dev/davinci[2-3] exist"


# --- the host check, with a fake /dev ----------------------------------------------


def _spec(preset, **options):
    pset = P.load_presets()
    return pset, P.build_spec(pset, preset, P.RunOptions(**options), "img")


def _exists(*present):
    return lambda path: path in present


A2_FILES = ("/dev/davinci_manager", "/dev/devmm_svm", "/dev/hisi_hdc", "/usr/local/dcmi", "/usr/local/bin/npu-smi",
            "/usr/local/Ascend/driver/lib64/", "/usr/local/Ascend/driver/version.info", "/etc/ascend_install.info")


def test_run_uses_the_cards_present_within_the_range():
    pset, spec = _spec("a2")
    fitted, left_out = P.fit_to_host(spec, pset, False, False, _exists("/dev/davinci2", "/dev/davinci5", *A2_FILES))
    assert fitted.cards == (2, 5) and left_out == []
    assert fitted.device_paths == ("/dev/davinci2", "/dev/davinci5", "/dev/davinci_manager", "/dev/devmm_svm",
                                   "/dev/hisi_hdc")


def test_explicit_cards_must_exist():
    pset, spec = _spec("a2", devices="0,1")
    with pytest.raises(ImgtoolError) as e:
        P.fit_to_host(spec, pset, True, False, _exists("/dev/davinci0", *A2_FILES))
    assert e.value.message == "not found on this host: /dev/davinci1"


def test_missing_management_devices_and_driver_files_are_named():
    pset, spec = _spec("a2")
    with pytest.raises(ImgtoolError) as e:
        P.fit_to_host(spec, pset, False, False, _exists("/dev/davinci0", "/dev/davinci_manager", "/dev/devmm_svm"))
    assert e.value.message == (
        "not found on this host: /dev/hisi_hdc, /usr/local/dcmi, /usr/local/bin/npu-smi, /usr/local/Ascend/driver/lib64/, "
        "/usr/local/Ascend/driver/version.info, /etc/ascend_install.info")


def test_a3_needs_two_cards_on_the_host():
    pset, spec = _spec("a3")
    with pytest.raises(ImgtoolError) as e:
        P.fit_to_host(spec, pset, False, False, _exists("/dev/davinci0", *A2_FILES))
    assert e.value.message == "preset a3 needs at least 2 cards; this host has 1: /dev/davinci0"


def test_allow_missing_drops_what_is_absent_but_keeps_caches_and_volumes():
    pset, spec = _spec("a2", volumes=("/tmp:/scratch",))
    fitted, left_out = P.fit_to_host(spec, pset, False, True, _exists("/dev/davinci3", "/tmp"))
    assert fitted.cards == (3,) and fitted.devices == ()
    assert [m.spec for m in fitted.mounts] == ["/root/.cache:/root/.cache", "/tmp:/scratch"]
    assert left_out[:2] == ["/dev/davinci0", "/dev/davinci1"] and "/usr/local/dcmi" in left_out
    pset, spec = _spec("a2", volumes=("/no/such/models:/models",))
    with pytest.raises(ImgtoolError) as e:
        P.fit_to_host(spec, pset, False, True, _exists())
    assert e.value.message == "--volume host path not found: /no/such/models"


def test_operation_not_permitted_explains_faq_20_instead_of_retrying():
    _, spec = _spec("a2", shm_size="64g")
    err = explain_run_error(
        'OCI runtime create failed: container_linux.go:380: starting container process caused: process_linux.go:545: '
        'container init caused: rootfs_linux.go:76: mounting "shm" to rootfs at "/dev/shm" caused: '
        'operation not permitted: unknown', spec)
    assert err.exit_code == 5
    assert err.message.startswith(
        "Docker refused to start the container: operation not permitted (with --shm-size=64g): OCI runtime create failed")
    assert err.hint == (
        "this is vllm-ascend FAQ 20: the runtime here will not give an unprivileged container that /dev/shm. "
        "Try a smaller --shm-size; or, only for an image you trust, add --privileged yourself "
        "(it grants every host device and capability); imgtool never adds it on its own")
    err = explain_run_error('Conflict. The container name "/vllm-ascend" is already in use by container "abc".', spec)
    assert err.message == "a container named vllm-ascend already exists"


# --- image choice --------------------------------------------------------------------


def test_highest_release_tag_wins():
    tags = ["v0.9.0-a3", "v0.10.0rc1-a3", "v0.10.0rc2-a3", "v0.10.0-a3-openeuler", "v0.10.0-a3", "v0.9.9",
            "main-a3", "v0.10.0.post1-310p", "latest", "v0.9.1-dev-a3"]
    assert P.pick_tag(tags, ("-a3", "-a3-openeuler")) == "v0.10.0-a3"
    assert P.pick_tag(tags, ("", "-openeuler")) == "v0.9.9"
    assert P.pick_tag(tags, ("-310p",)) == "v0.10.0.post1-310p"
    assert P.pick_tag(["v0.10.0rc1", "v0.10.0", "v0.10.0.post1", "v0.9.10"], ("",)) == "v0.10.0.post1"
    assert P.pick_tag(["v0.9.10", "v0.9.9"], ("",)) == "v0.9.10"
    assert P.pick_tag(tags, ("-a5",)) is None


def test_wrong_hardware_tag_is_warned_about(home):
    r = imgtool("run-flags", "a2", "--image", "v0.11.0rc1-a3", home=home)
    assert r.returncode == 0
    assert r.stderr.splitlines() == [
        "warning: image tag v0.11.0rc1-a3 does not look like one for preset a2 (expected vX.Y.Z or vX.Y.Z-openeuler)"]


# --- presets files ----------------------------------------------------------------------


def test_user_file_merges_over_builtin_presets(tmp_path, home):
    user = tmp_path / "mine.toml"
    user.write_text("""\
[presets.a2]
shm_size = "16g"

[presets.lab]
extends = "a3"
description = "the lab's A3 box"
cards = "0-7"
ports = ["8080:8000"]
env = { ASCEND_RT_VISIBLE_DEVICES = "0,1" }

[env_presets.deterministic]
env = { HCCL_DETERMINISTIC = "true" }
""")
    r = imgtool("run-flags", "a2", "--presets", str(user), "--image", "x/y:1", "--json", home=home)
    assert json.loads(r.stdout)["shm_size"] == "16g"
    r = imgtool("run-flags", "a3", "--presets", str(user), "--image", "x/y:1", "--json", home=home)
    assert json.loads(r.stdout)["shm_size"] == "1g"  # overriding a2 does not reach presets built on it
    r = imgtool("run-flags", "lab", "--image", "x/y:1", "--env-preset", "deterministic", "--json", home=home,
                extra_env={"IMGTOOL_PRESETS": str(user)})
    spec = json.loads(r.stdout)
    assert spec["devices"][:8] == [f"/dev/davinci{n}" for n in range(8)] and len(spec["devices"]) == 11
    assert spec["env"] == {"ASCEND_RT_VISIBLE_DEVICES": "0,1", "HCCL_DETERMINISTIC": "true"}
    assert spec["ports"] == ["8080:8000"]
    (home / ".config/imgtool").mkdir(parents=True)
    (home / ".config/imgtool/presets.toml").write_text(user.read_text())
    r = imgtool("presets", "--json", home=home)
    data = json.loads(r.stdout)
    assert data["files"][1] == str(home / ".config/imgtool/presets.toml")
    assert data["presets"][-1]["name"] == "lab"


@pytest.mark.parametrize("text, message", [
    ('[presets.a2]\nshm_size = "lots"\n',
     "{f}:2: presets.a2.shm_size: invalid size 'lots': use a number with an optional unit K, M, G, T (binary), "
     "e.g. 4G or 700M"),
    ('# mine\n\n[presets.a2]\ncolour = "red"\n',
     "{f}:4: presets.a2: unknown key 'colour' (expected description, extends, cards, min_cards, devices, mounts, "
     "shm_size, network, ports, env, tag_suffixes, privileged, multi_node, aliases, resource_name)"),
    ('[presets.new]\ndescription = "x"\ncards = "0-3"\n',
     "{f}:1: presets.new: missing min_cards, devices, mounts, shm_size, network, ports, env, tag_suffixes, "
     "privileged, multi_node (a new preset needs every key, or extends = \"a2\")"),
    ('[presets.x]\nextends = "y"\n[presets.y]\nextends = "x"\n',
     "{f}:4: presets.y.extends: loop x -> y -> x"),
    ('[presets.x]\nextends = "a9"\n', "{f}:2: presets.x.extends: unknown preset 'a9'"),
    ('[presets.a2]\nmounts = ["relative:/x"]\n',
     "{f}:2: presets.a2.mounts: invalid mount 'relative:/x': host and container paths must be absolute, without spaces"),
    ('[presets.a2]\ncards = "0-7"\nmin_cards = 9\n',
     "{f}:3: presets.a2.min_cards: must be between 0 and the number of cards (8)"),
    ('[presets.a2]\nprivileged = "no"\n', "{f}:2: presets.a2.privileged: must be true or false"),
    ('[presets.a2]\ndevices = ["davinci_manager"]\n',
     "{f}:2: presets.a2.devices: invalid device 'davinci_manager': expected a path under /dev/"),
    ('presets = 3\n', "{f}:1: presets must be a table ([presets...])"),
    ('[runs.a2]\n', "{f}:1: unknown key 'runs' (expected presets, multi_node, env_presets)"),
    ('[env_presets.deterministic]\nenv = { X = true }\n',
     "{f}:2: env_presets.deterministic.env: X must be a string (quote it: X = \"...\")"),
    ('[multi_node]\nnetwork = 1\n', "{f}:2: multi_node.network: must be a network name like \"host\""),
])
def test_bad_presets_file_names_file_line_and_key(text, message, tmp_path, home):
    f = tmp_path / "presets.toml"
    f.write_text(text)
    r = imgtool("presets", "--presets", str(f), home=home)
    assert r.returncode == 2
    assert r.stderr.splitlines() == ["error: " + message.format(f=f)]


def test_missing_presets_file(tmp_path, home):
    r = imgtool("run-flags", "a2", "--presets", str(tmp_path / "nope.toml"), home=home)
    assert r.returncode == 2
    assert r.stderr.splitlines() == [f"error: {tmp_path / 'nope.toml'}: file not found"]


# --- against the real dockerd -----------------------------------------------------------

BUSYBOX_APPLETS = ("sh", "df", "echo", "cat", "sleep", "tty", "env")


@pytest.fixture(scope="session")
def busybox_rootfs(tmp_path_factory):
    """A rootfs tar: a static busybox and a few applet links."""
    # Debian's busybox-static at /bin/busybox, never whichever busybox PATH finds (a dynamic one
    # would not start in an image without its libraries)
    try:
        busybox = static_busybox()
    except RuntimeError as e:
        pytest.fail(str(e), pytrace=False)
    tar_path = tmp_path_factory.mktemp("busybox") / "rootfs.tar"
    with tarfile.open(tar_path, "w") as tar:
        binary = tarfile.TarInfo("bin/busybox")
        binary.size, binary.mode = len(busybox), 0o755
        tar.addfile(binary, io.BytesIO(busybox))
        for applet in BUSYBOX_APPLETS:
            link = tarfile.TarInfo(f"bin/{applet}")
            link.type, link.linkname = tarfile.SYMTYPE, "busybox"
            tar.addfile(link)
    return tar_path


@pytest.fixture
def busybox_image(busybox_rootfs, docker_cli, uniq):
    """That rootfs as an image in the test's Docker engine, made with `docker import`."""
    ref = f"imgtool-test/presets-busybox:{uniq}"
    docker_cli("import", "--change", "ENV PATH=/bin", str(busybox_rootfs), ref)
    yield ref
    docker_cli("rmi", "-f", ref, check=False)


# The Docker room's two transports: docker-py (Python 3.9+) and the stdlib client imgtool.pyz
# uses on Kylin's python3 3.7 (daemon_http.py); `imgtool run` must behave the same through both.
TRANSPORTS = {"docker-py": None, "http": """
import sys
import imgtool.runtimes.docker as D
D.default_transport = lambda: "http"
from imgtool.cli import main
main(sys.argv[1:])
"""}


def run_in_docker(services, *args, home, transport="docker-py", **kw):
    return imgtool(*args, home=home, docker_host=services.docker_host, code=TRANSPORTS[transport], **kw)


@pytest.mark.engines(stores=True)
@pytest.mark.parametrize("transport", sorted(TRANSPORTS))
def test_run_gives_the_container_the_shm_size(transport, services, busybox_image, docker_cli, uniq, home):
    name = f"imgtool-{uniq}"
    r = run_in_docker(services, "run", "a2", busybox_image, "--allow-missing-devices", "--shm-size", "256m",
                      "--net", services.docker_network, "--name", name, "--", "df", "-k", "/dev/shm",
                      home=home, transport=transport)
    assert r.returncode == 0, r.stderr
    shm = [ln.split() for ln in r.stdout.splitlines() if ln.endswith("/dev/shm")]
    assert len(shm) == 1 and shm[0][1] == str(256 * 1024), r.stdout  # 1K-blocks
    assert r.stderr.startswith("--allow-missing-devices: leaving out ")
    # --rm is the default: nothing is left behind
    assert docker_cli("ps", "-a", "-q", "--filter", f"name=^{name}$").stdout.strip() == ""


@pytest.mark.engines
@pytest.mark.parametrize("transport", sorted(TRANSPORTS))
def test_run_streams_output_and_exits_with_the_containers_code(transport, services, busybox_image, docker_cli, uniq,
                                                               home):
    name = f"imgtool-{uniq}"
    r = run_in_docker(services, "run", "a3", busybox_image, "--allow-missing-devices", "-q",
                      "--net", services.docker_network, "--name", name, "--env-preset", "deterministic",
                      "--", "sh", "-c", "echo out; echo err >&2; echo $HCCL_DETERMINISTIC; exit 7",
                      home=home, transport=transport)
    assert r.returncode == 7
    assert r.stdout == "out\ntrue\n"
    assert r.stderr == "err\n"
    assert docker_cli("ps", "-a", "-q", "--filter", f"name=^{name}$").stdout.strip() == ""


@pytest.mark.engines(stores=True)
@pytest.mark.parametrize("transport", sorted(TRANSPORTS))
def test_run_keeps_the_container_with_no_rm(transport, services, busybox_image, docker_cli, docker_cleanup, uniq,
                                            home):
    name = f"imgtool-{uniq}"
    docker_cleanup.container(name)
    r = run_in_docker(services, "run", "a2", busybox_image, "--allow-missing-devices", "-q", "--no-rm",
                      "--net", services.docker_network, "--name", name, "--", "sh", "-c", "exit 0",
                      home=home, transport=transport)
    assert r.returncode == 0, r.stderr
    state = json.loads(docker_cli("inspect", name).stdout)[0]
    assert state["HostConfig"]["ShmSize"] == 1 << 30
    assert state["HostConfig"]["Privileged"] is False
    assert state["HostConfig"]["Binds"] == ["/root/.cache:/root/.cache"]
    # the name is taken now: a clear error, not a traceback
    r = run_in_docker(services, "run", "a2", busybox_image, "--allow-missing-devices", "-q",
                      "--net", services.docker_network, "--name", name, "--", "true",
                      home=home, transport=transport)
    assert r.returncode == 5
    assert r.stderr.splitlines() == [f"error: a container named {name} already exists",
                                     f"hint: pass --name NEW_NAME, or remove the old one: docker rm -f {name}"]


@pytest.mark.engines(stores=True)
@pytest.mark.parametrize("transport", sorted(TRANSPORTS))
def test_run_detached(transport, services, busybox_image, docker_cli, docker_cleanup, uniq, home):
    name = f"imgtool-{uniq}"
    docker_cleanup.container(name)
    r = run_in_docker(services, "run", "a2", busybox_image, "--allow-missing-devices", "-q", "-d",
                      "--net", services.docker_network, "--name", name, "--", "sleep", "30",
                      home=home, transport=transport)
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"{name}\n"
    state = json.loads(docker_cli("inspect", name).stdout)[0]
    assert state["State"]["Running"] is True
    assert state["HostConfig"]["AutoRemove"] is True


@pytest.mark.parametrize("transport", sorted(TRANSPORTS))
def test_run_refuses_an_image_that_is_not_loaded(transport, services, uniq, home):
    r = run_in_docker(services, "run", "a2", f"imgtool-test/{uniq}:v1", "--allow-missing-devices", "-q",
                      "--net", services.docker_network,
                      home=home, transport=transport)
    assert r.returncode == 2
    assert r.stderr.splitlines() == [
        f"error: image imgtool-test/{uniq}:v1 is not loaded in this Docker daemon",
        "hint: load it first (imgtool load BUNDLE_DIR), or check the name with `docker images`"]


@pytest.fixture
def local_vllm(services, busybox_image, docker_cli, docker_cleanup, uniq, tmp_path):
    """A mirrors.toml whose default image is private to this test, with some of its tags loaded."""
    default_image = f"localhost/{uniq}/vllm-ascend"
    mirrors = tmp_path / "mirrors.toml"
    mirrors.write_text(f'default_image = "{default_image}"\n\n[[mirrors]]\nname = "quay"\nregistry = "quay.io"\n'
                       f'url = "https://quay.io"\n')
    for tag in ("v0.9.0-a3", "v0.10.0rc1-a3", "v0.10.0-a3-openeuler", "v0.10.0-a3", "v0.9.9", "main"):
        docker_cli("tag", busybox_image, f"{default_image}:{tag}")
        docker_cleanup.image(f"{default_image}:{tag}")
    return default_image, {"IMGTOOL_MIRRORS": str(mirrors)}


@pytest.mark.engines
def test_run_flags_picks_the_newest_local_image_for_the_preset(services, local_vllm, home):
    default_image, env = local_vllm
    r = run_in_docker(services, "run-flags", "a3", "--one-line", home=home, extra_env=env)
    assert r.returncode == 0, r.stderr
    assert shlex.split(r.stdout)[-1] == f"{default_image}:v0.10.0-a3"
    assert r.stderr == ""
    r = run_in_docker(services, "run-flags", "a2", "--one-line", home=home, extra_env=env)
    assert shlex.split(r.stdout)[-1] == f"{default_image}:v0.9.9"
    r = run_in_docker(services, "run-flags", "300i-duo", "--one-line", home=home, extra_env=env)
    assert shlex.split(r.stdout)[-1] == f"{default_image}:<version>-310p"
    assert r.stderr.splitlines() == [f"warning: no {default_image} image for preset 300i-duo is loaded here; "
                                     "replace <version> in the command or pass --image"]


@pytest.mark.engines(stores=True)
def test_run_without_image_uses_the_newest_local_one(services, local_vllm, uniq, home):
    default_image, env = local_vllm
    r = run_in_docker(services, "run", "a3", "--allow-missing-devices", "-q", "--net", services.docker_network,
                      "--name", f"imgtool-{uniq}", "--", "echo", "hello", home=home, extra_env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "hello\n"
    r = run_in_docker(services, "run", "a5", "--allow-missing-devices", "-q", "--net", services.docker_network,
                      home=home, extra_env=env)
    assert r.returncode == 2
    assert r.stderr.splitlines() == [
        f"error: no {default_image} image for preset a5 is loaded in Docker (looked for tags vX.Y.Z-a5, "
        "vX.Y.Z-a5-openeuler, vX.Y.Z-950dt, vX.Y.Z-950dt-openeuler)",
        "hint: name one: imgtool run a5 IMAGE, or load a bundle first: imgtool load DIR"]


@pytest.mark.engines(stores=True)
@pytest.mark.parametrize("runner", ["docker-py", "http", "pyz-3.7"])
def test_run_is_interactive_on_a_terminal(runner, services, busybox_image, docker_cli, docker_cleanup, uniq, home,
                                          tmp_path):
    """`imgtool run` on a terminal is `docker run -it`: through docker-py, through the stdlib transport,
    and as Kylin runs it (imgtool.pyz on python3 3.7, nothing installed)."""

    from imgtool import selfbundle
    from tests.test_selfbundle import old_python

    name = f"imgtool-{uniq}"
    docker_cleanup.container(name)  # only if the session below goes wrong
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DOCKER_", "IMGTOOL_PRESETS", "IMGTOOL_MIRRORS"))}
    env.update(HOME=str(home), DOCKER_HOST=services.docker_host)
    if runner == "pyz-3.7":
        selfbundle.build(tmp_path / "imgtool.pyz")
        argv = [*old_python("3.7"), str(tmp_path / "imgtool.pyz")]
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": str(home), "LANG": "C.UTF-8", "TERM": "xterm",
               "DOCKER_HOST": services.docker_host}
    else:
        argv = [sys.executable, "-c", TRANSPORTS[runner]] if TRANSPORTS[runner] else [sys.executable, "-m", "imgtool"]
    argv += ["run", "a2", busybox_image, "-q", "--allow-missing-devices", "--net", services.docker_network,
             "--name", name, "--", "sh"]
    out, sent, code = session_on_a_terminal(argv, env)
    assert sent, out
    assert code == 3, out
    assert b"/dev/pts/" in out and b"\r\n42\r\n" in out
    assert docker_cli("ps", "-a", "-q", "--filter", f"name=^{name}$").stdout.strip() == ""


def test_950dt_is_an_alias_of_a5(home, tmp_path):
    """The 中文 README (and vllm-ascend's docs) call the A5 host 950DT: either name works."""
    a5 = imgtool("run-flags", "a5", "--image", "v0.11.0rc1-a5", "--one-line", home=home)
    for name in ("950dt", "950DT"):
        r = imgtool("run-flags", name, "--image", "v0.11.0rc1-a5", "--one-line", home=home)
        assert (r.returncode, r.stdout, r.stderr) == (0, a5.stdout, "")
    r = imgtool("presets", home=home)
    assert "aliases: 950dt = a5" in r.stdout.splitlines()
    # aliases are not passed on by extends, and cannot take another preset's name
    f = tmp_path / "p.toml"
    f.write_text('[presets.a5x]\nextends = "a5"\n')
    data = json.loads(imgtool("presets", "--presets", str(f), "--json", home=home).stdout)
    assert [p["aliases"] for p in data["presets"] if p["name"] in ("a5", "a5x")] == [["950dt"], []]
    f.write_text('[presets.a3]\naliases = ["a2"]\n')
    r = imgtool("presets", "--presets", str(f), home=home)
    assert (r.returncode, r.stderr.splitlines()[0]) == (2, f"error: {f}:2: presets.a3.aliases: 'a2' already names preset a2")


@pytest.mark.engines(stores=True)
def test_run_flags_warns_about_an_image_for_another_architecture(services, factory, docker_cli, docker_cleanup,
                                                                 uniq, tmp_path, home):
    """The newest local image for the preset may be the arm64 one on an amd64 host: say so, as load does."""
    from tests.support.images import host_arch, write_docker_archive

    other = "arm64" if host_arch() == "amd64" else "amd64"
    default_image = f"localhost/{uniq}/vllm-ascend"
    (tmp_path / "mirrors.toml").write_text(f'default_image = "{default_image}"\n\n[[mirrors]]\nname = "quay"\n'
                                           'registry = "quay.io"\nurl = "https://quay.io"\n')
    env = {"IMGTOOL_MIRRORS": str(tmp_path / "mirrors.toml")}
    image = factory.image(other, layers=1)
    ref = f"{default_image}:v0.11.0"
    write_docker_archive(image, tmp_path / "in.tar", ref)
    docker_cleanup.image(ref, image.config_digest)
    docker_cli("load", "-i", str(tmp_path / "in.tar"))
    warning = (f"warning: {ref} is for {image.platform} but this Docker host is linux/{host_arch()}: its containers "
               f"will not start (exec format error); fetch it with --arch {host_arch()}")
    r = run_in_docker(services, "run-flags", "a2", "--one-line", home=home, extra_env=env)
    assert r.returncode == 0, r.stderr
    assert shlex.split(r.stdout)[-1] == ref  # still printed: the user may carry it elsewhere
    assert r.stderr.splitlines() == [warning]
    r = run_in_docker(services, "run-flags", "a2", "--image", ref, "--one-line", home=home, extra_env=env)
    assert r.stderr.splitlines() == [warning]
