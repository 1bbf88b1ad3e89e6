"""`imgtool doctor [DIR]`: the offline host checklist, against the real test daemon."""

import json
import os

import pytest

from imgtool.doctor import os_check, run_checks
from imgtool.runtimes.choice import Choice
from tests.support.bundles import BlobDir, imgtool, parts_of, write
from tests.support.images import host_arch

REPO = "quay.io/ascend/vllm-ascend"


def rows(r):
    return {line[6:18].strip(): line for line in r.stdout.splitlines() if line[:5].strip() in
            ("OK", "INFO", "WARN", "FAIL")}


@pytest.fixture
def bundle(factory, tmp_path):
    def make(arch):
        store = BlobDir(tmp_path / f"blobs-{arch}")
        out = tmp_path / f"b-{arch}"
        write(out, [store.pulled(factory.image(arch, layers=1), f"{REPO}:v1")], store, chunk_size=400 * 1024)
        return out
    return make


@pytest.mark.runtimes(proof=True)
def test_healthy_host_with_a_fitting_bundle(node, engine, bundle):
    out = bundle(host_arch())
    r = imgtool("doctor", str(out), "--runtime", node.kind, env=node.env)
    assert r.returncode == 0, r.stdout + r.stderr
    by = rows(r)
    if node.kind == "docker":
        assert by["docker"].startswith(f"OK    docker       Docker {engine.split('-')[0]}.")
        assert by["docker"].endswith(f"at {node.env['DOCKER_HOST']}")
        if engine.endswith("containerd"):
            assert by["storage"].startswith("OK    storage      the containerd image store (overlayfs snapshotter) under ")
        else:
            assert by["storage"].startswith("OK    storage      overlay2 under ")
            assert by["storage"].endswith(" (graphdriver image store)")
    elif node.kind == "containerd":
        sock = node.env["CONTAINERD_ADDRESS"]
        assert by["containerd"].startswith(f"OK    containerd   containerd {engine.split('-')[1]}.")
        assert by["containerd"].endswith(f" at {sock}, namespace k8s.io")
        assert by["storage"] == (f"OK    storage      containerd's content store and overlayfs snapshotter under "
                                 f"{os.path.dirname(sock)}/root, namespace k8s.io: image IDs are manifest digests")
    else:
        assert by["podman"] == {"podman-4.3": "OK    podman       Podman 4.3.1", "podman-5.8": "OK    podman       Podman 5.8.6"}[engine]
        assert by["storage"] == ("OK    storage      containers-storage (overlay) under "
                                 f"{os.path.dirname(node.env['CONTAINERS_STORAGE_CONF'])}/storage")
    assert by["space"].startswith("OK    space        ") and "the bundle needs about" in by["space"]
    assert by["arch"] == f"OK    arch         linux/{host_arch()}, as the bundle's images"
    assert by["bundle"].startswith(f"OK    bundle       {REPO}:v1: ")
    assert by["pigz"].startswith("OK    pigz         unpigz at ")
    checks = json.loads(imgtool("doctor", "--json", "--runtime", node.kind, env=node.env).stdout)
    assert {c["name"] for c in checks} == {node.kind, "storage", "space", "arch", "pigz", "os", "models"}


def test_auto_names_every_runtime_found_and_the_one_load_uses(services, bundle):
    """A host with Docker, containerd and Podman: each is named with its storage and space; load uses Docker.
    Without Docker, Docker's line is information (not a failure) and load uses containerd."""
    sock = services.containerd("1.7")
    r = imgtool("doctor", docker_host=services.docker_host, env={"CONTAINERD_ADDRESS": sock})
    assert r.returncode == 0, r.stdout + r.stderr
    names = [line[6:18].strip() for line in r.stdout.splitlines() if not line.startswith(" ")]
    assert names == ["docker", "storage", "space", "containerd", "storage", "space", "podman", "storage", "space",
                     "runtime", "arch", "pigz", "os", "models"]
    assert rows(r)["runtime"].startswith("OK    runtime      imgtool load uses Docker ")
    nodocker = imgtool("doctor", docker_host=f"unix://{sock}.none", env={"CONTAINERD_ADDRESS": sock})
    assert nodocker.returncode == 0, nodocker.stdout
    assert rows(nodocker)["docker"] == (f"INFO  docker       cannot reach the Docker daemon at unix://{sock}.none: "
                                        "the socket does not exist (dockerd is not running)")
    assert rows(nodocker)["runtime"].startswith("OK    runtime      imgtool load uses containerd 1.7.")


@pytest.mark.engines(stores=True)
def test_wrong_arch_and_missing_part_fail_with_advice(services, bundle):
    other = "arm64" if host_arch() == "amd64" else "amd64"
    out = bundle(other)
    parts_of(out)[1].unlink()
    r = imgtool("doctor", str(out), docker_host=services.docker_host)
    assert r.returncode == 1
    lines = r.stdout.splitlines()
    arch = next(i for i, line in enumerate(lines) if line.startswith("FAIL  arch"))
    assert lines[arch].startswith(f"FAIL  arch         this host is linux/{host_arch()}; {REPO}:v1 is linux/{other}")
    assert lines[arch + 1] == f"                  -> fetch the images again with --arch {host_arch()}"
    assert rows(r)["bundle"].startswith("FAIL  bundle       part 002 (")
    assert "is missing; copy part 002 from the source medium" in rows(r)["bundle"]


def test_unreachable_docker_fails(tmp_path):
    r = imgtool("doctor", "--runtime", "docker", docker_host=f"unix://{tmp_path}/none.sock")
    assert r.returncode == 1
    lines = r.stdout.splitlines()
    i = next(i for i, line in enumerate(lines) if line.startswith("FAIL  docker"))
    assert "cannot reach the Docker daemon" in lines[i]
    assert lines[i + 1] == ("                  -> start it (systemctl start docker), check DOCKER_HOST, and run as "
                            "root or a member of the docker group")


def test_kylin_gets_the_faq_19_advice(tmp_path):
    rel = tmp_path / "os-release"
    rel.write_text('NAME="Kylin Linux Advanced Server"\nVERSION="V10 (Sword)"\nID="kylin"\n'
                   'PRETTY_NAME="Kylin Linux Advanced Server V10 (Sword)"\n')
    check = os_check(rel)
    assert (check.status, check.detail) == ("info", "Kylin Linux Advanced Server V10 (Sword) (Kylin)")
    assert check.advice.startswith("vllm-ascend FAQ 19: if Docker says `invalid tar header`, it met a "
                                   "zstd-compressed layer, which Docker reads only from 23.0 on")
    assert check.advice.endswith("a wrong architecture shows only at `docker run`, as `exec format error`")
    rel.write_text('PRETTY_NAME="Ubuntu 22.04.4 LTS"\nID=ubuntu\n')
    assert os_check(rel).status == "ok"


def test_checks_without_a_daemon_do_not_raise(monkeypatch, tmp_path):
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/none.sock")
    checks = run_checks(str(tmp_path / "no-bundle"), choice=Choice(runtime="docker"))
    assert [c.name for c in checks][:2] == ["bundle", "docker"]
    assert checks[0].status == "fail" and checks[0].detail == f"no such bundle directory: {tmp_path / 'no-bundle'}"


@pytest.mark.runtimes(stores=True)
def test_space_need_is_what_the_runtime_stages_and_keeps_less_the_layers_it_holds(node, engine, factory, tmp_path):
    """doctor's space line (load's refusal says the same): Docker's graphdriver unpacks the whole archive
    under <root>/tmp before it registers the layers (moby image/tarexport/load.go), the containerd store
    keeps the compressed blobs and unpacks them into snapshots, Podman loads from a copy of the archive;
    once the runtime holds the previous release, its layers are not counted as unpacked again."""
    from imgtool.bundle.format import BundleIndex
    from imgtool.model import format_size

    base = factory.layers(2)
    store = BlobDir(tmp_path / "blobs")
    v1, v2 = tmp_path / "v1", tmp_path / "v2"
    write(v1, [store.pulled(factory.image(host_arch(), layers=1, base=base), f"{REPO}:v1")], store)
    write(v2, [store.pulled(factory.image(host_arch(), layers=1, base=base), f"{REPO}:v2")], store)
    index = BundleIndex.from_bytes((v2 / "bundle.json").read_bytes())
    layers = index.images[0].layers
    title = {"docker": "Docker", "containerd": "containerd", "podman": "Podman"}[node.kind]

    def space() -> str:
        r = imgtool("doctor", str(v2), "--json", "--runtime", node.kind, env=node.env)
        return next(c["detail"] for c in json.loads(r.stdout) if c["name"] == "space")

    def how(fresh, held, detail) -> str:
        kept = sum(x.size for x in fresh)
        unpacked = sum(int(x.size * 2.5) if x.unpacked_size is None else x.unpacked_size for x in fresh)
        tail = f"; {held} layers {title} holds already are not unpacked again" if held else ""
        if node.kind == "containerd" or engine == "26.1-containerd":
            return (f"the bundle needs about {format_size(kept + unpacked)} ({format_size(kept)} of compressed layers "
                    f"kept in the content store + {format_size(unpacked)} unpacked into snapshots{tail})")
        if node.kind == "podman":
            return f"+ {format_size(unpacked)} unpacked{tail})"
        tar, root = index.archive.tar_size, detail.split(" free under ")[1].split("; ")[0]
        return (f"the bundle needs about {format_size(tar + unpacked)} ({format_size(tar)} for the archive Docker "
                f"unpacks into {root}/tmp before it registers the layers + {format_size(unpacked)} unpacked{tail})")

    before = space()
    assert how(layers, 0, before) in before, before
    r = imgtool("load", str(v1), env=node.env)
    assert r.returncode == 0, r.stderr
    node.remove_later(f"{REPO}:v1")
    after = space()
    assert how(layers[2:], 2, after) in after, after


@pytest.mark.parametrize("engine", ["podman-4.3"], indirect=True)
def test_doctor_creates_no_podman_storage(node, bundle, tmp_path):
    """Issue 35 case 10: `imgtool doctor` ran `podman info`, which made /var/lib/containers/storage on a host where
    Podman had never run (every podman command but --version opens, so makes, its storage). A storage.conf naming
    a storage not there yet: doctor says so, asks Podman only its version, measures the space where the storage
    will be, and leaves nothing behind."""
    fresh = tmp_path / "fresh"
    conf = tmp_path / "storage.conf"
    conf.write_text(f'[storage]\ndriver = "overlay"\ngraphroot = "{fresh}/storage"\nrunroot = "{fresh}/run"\n')
    env = dict(node.env, CONTAINERS_STORAGE_CONF=str(conf))
    out = bundle(host_arch())
    for runtime in ("podman", "auto"):
        r = imgtool("doctor", str(out), "--runtime", runtime, env=env)
        assert r.returncode == 0, r.stdout + r.stderr
        by = rows(r)
        assert by["podman"] == (f"OK    podman       Podman 4.3.1, no storage yet ({fresh}/storage): not asked more, "
                                "as `podman info` would create it")
        assert by["storage"] == (f"INFO  storage      containers-storage (overlay) under {fresh}/storage: not there yet "
                                 "(Podman makes it on first use)")
        assert by["space"].startswith("OK    space        ") and f" free under {tmp_path}; the bundle needs" in by["space"]
        assert not fresh.exists()
    r = imgtool("doctor", "--runtime", "podman", env=node.env)  # a storage that is there: asked as before
    assert rows(r)["storage"] == ("OK    storage      containers-storage (overlay) under "
                                  f"{os.path.dirname(node.env['CONTAINERS_STORAGE_CONF'])}/storage")
