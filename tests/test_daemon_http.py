"""daemon_http: the stdlib Docker client imgtool.pyz uses on Python 3.7/3.8, against the real dockerds.

Each test asks the same daemon through both transports (docker-py and the stdlib client) behind
the same `Daemon` methods and expects the same answers: the old-Python path is not a second
product. tests/test_selfbundle.py runs it for real under pyenv's 3.7 and 3.8.
"""

import pytest

from imgtool.load import load_bundle
from imgtool.runtimes.docker import Daemon, connect, default_transport, open_daemon
from imgtool.errors import DaemonError, UsageError
from imgtool.progress import Progress
from tests.support.bundles import canonical_tar, fetch_from_registry


def both(services, monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", services.docker_host)
    return Daemon(connect(transport="docker-py")), Daemon(connect(transport="http"))


def test_the_stdlib_client_is_the_default_only_below_python_3_9():
    assert default_transport() == "docker-py"  # this venv: 3.9+


@pytest.mark.engines
def test_facts_and_inventory_are_the_same_through_both_transports(services, factory, mirrored, tmp_path,
                                                                     monkeypatch, docker_cli, docker_cleanup):
    out, image, ref, _ = fetch_from_registry(services, factory, mirrored, tmp_path)
    docker_cleanup.image(ref, image.config_digest)
    py, std = both(services, monkeypatch)
    with py, std:
        assert std.info() == py.info()
        load_bundle(out, std, progress=Progress())
        assert docker_cli.holds(ref, image)
        # the daemon lists images with equal creation times in no fixed order (the test images all
        # share one): the same set, compared by ID
        assert sorted(std.inventory(), key=lambda im: im.id) == sorted(py.inventory(), key=lambda im: im.id)
        assert std.image_info(ref) == py.image_info(ref)
        assert std.local_tags(ref.rsplit(":", 1)[0]) == py.local_tags(ref.rsplit(":", 1)[0]) == ["v0.22.1rc1"]
        assert std.image_info("quay.io/none/such:v0") is None
        std.tag(docker_cli.bundle_id(image), ref + "-again")
        assert py.local_tags(ref.rsplit(":", 1)[0]) == ["v0.22.1rc1", "v0.22.1rc1-again"]
        saved = b"".join(std.save(ref + "-again"))
        assert saved[257:263] == b"ustar\x00"  # a tar: docker save's answer streamed whole
        std.remove_image(docker_cli.bundle_id(image))
        assert std.image_info(ref) is None and docker_cli.find(image) is None
        std.remove_image(docker_cli.bundle_id(image))  # already gone: nothing to do, like docker-py's path


@pytest.mark.engines(stores=True)
def test_a_load_that_docker_refuses_after_http_200_is_a_failure(services, factory, mirrored, tmp_path, monkeypatch,
                                                                  docker_cli, docker_cleanup):
    out, image, ref, _ = fetch_from_registry(services, factory, mirrored, tmp_path)
    docker_cleanup.image(ref, image.config_digest)
    tar = canonical_tar(out)
    _, std = both(services, monkeypatch)
    with std, pytest.raises(DaemonError) as failed:
        # a layer cut short: Docker answers 200, then an errorDetail in the stream
        std.load_archive(iter([tar[: len(tar) // 2]]))
    assert failed.value.message.startswith("docker load failed: ")
    assert not docker_cli.holds(ref, image)
    seen = []
    with std:
        lines = std.load_archive(iter([tar[i:i + 65536] for i in range(0, len(tar), 65536)]), on_message=seen.append)
    assert lines and seen and docker_cli.find(image) is not None


def test_an_unreachable_daemon_and_an_unsupported_host_are_said_plainly(tmp_path, monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/none.sock")
    with pytest.raises(DaemonError) as e:
        connect(transport="http")
    assert e.value.message == f"cannot reach the Docker daemon at unix://{tmp_path}/none.sock: " \
                              "the socket does not exist (dockerd is not running)"
    monkeypatch.setenv("DOCKER_HOST", "ssh://kylin-host")
    with pytest.raises(UsageError) as e:
        connect(transport="http")
    assert e.value.message == "DOCKER_HOST ssh://kylin-host: on this Python imgtool speaks to Docker over unix:// " \
                              "or plain tcp:// only"


@pytest.mark.parametrize("transport", ["docker-py", "http"])
def test_the_host_is_a_parameter_that_wins_over_docker_host(services, tmp_path, monkeypatch, transport):
    # cli.py reads $DOCKER_HOST once (config.docker_host) and hands the host on: the room reads no variable
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/env.sock")
    with Daemon(connect(transport=transport, host=services.docker_host), services.docker_host) as daemon:
        assert daemon.info().host == services.docker_host
    with open_daemon(timeout=30, host=services.docker_host) as daemon:
        assert daemon.info().host == services.docker_host
    monkeypatch.setenv("DOCKER_HOST", services.docker_host)
    with pytest.raises(DaemonError) as e:
        connect(transport=transport, host=f"unix://{tmp_path}/given.sock")
    assert e.value.message == f"cannot reach the Docker daemon at unix://{tmp_path}/given.sock: " \
                              "the socket does not exist (dockerd is not running)"

