"""The test harness is real: images load into the real dockerd, registries speak TLS, Basic and
bearer-token auth, skopeo agrees with our manifests, and the mirror stand-ins serve one digest."""

import gzip
import io
import json
import os
import subprocess
import sys
import tarfile

import pytest
import requests

from tests.support.runtimes import containerd_path
from tests.support.images import (
    DOCKER_MANIFEST, DOCKER_MANIFEST_LIST, OCI_INDEX, OCI_MANIFEST, SEED_ENV, ImageFactory,
    sha256_digest, write_docker_archive,
)
from tests.support.registry import RegistryClient, parse_challenge, push_image
from tests.support.services import NOT_RUNNING, Services
from tests.support.tokenissuer import TokenIssuer


# -- the factory itself -------------------------------------------------------------------------


def test_factory_images_are_real_shaped_and_deterministic(monkeypatch):
    f = ImageFactory(seed="shape")
    base = f.layers(2)
    idx = f.multiarch(layers=1, base=base, media="oci")
    amd, arm = idx.image("amd64"), idx.image("linux/arm64")

    assert idx.platforms == ["linux/amd64", "linux/arm64/v8"]
    assert arm.config["variant"] == "v8" and arm.config["architecture"] == "arm64"
    assert amd.layers[:2] == arm.layers[:2] == tuple(base)  # shared base blobs
    assert amd.layers[2].digest != arm.layers[2].digest
    assert amd.config_digest != arm.config_digest
    for image in idx.images:
        assert image.manifest["mediaType"] == OCI_MANIFEST
        assert image.config["rootfs"]["diff_ids"] == [
            sha256_digest(gzip.decompress(layer.blob)) for layer in image.layers]
        assert len(image.config["history"]) == len(image.layers)
        for layer in image.layers:
            assert layer.digest == sha256_digest(layer.blob) and layer.size == len(layer.blob)
            with tarfile.open(fileobj=io.BytesIO(layer.blob), mode="r:gz") as tar:
                members = tar.getmembers()
            assert any(m.isfile() and m.size > 0 for m in members)
            # docker load refuses a layer that holds one path twice (a file and a directory)
            assert len({m.name for m in members}) == len(members)
    assert json.loads(idx.manifest_bytes)["manifests"][1]["platform"] == {
        "architecture": "arm64", "os": "linux", "variant": "v8"}
    # small by default: 3 layers of ~1 MiB compressed (a little more, never less), generated
    # files that compress like real ones (~2.4x here, 2.1-2.6x per layer over many seeds)
    assert all(1 << 20 <= layer.size < 1.3 * (1 << 20) for layer in amd.layers)
    total = sum(layer.size for layer in amd.layers)
    assert 1.8 * total < sum(layer.uncompressed_size for layer in amd.layers) < 3.2 * total

    g = ImageFactory(seed="shape")  # the same calls in the same order give the same bytes
    again = g.multiarch(layers=1, base=g.layers(2))
    assert again.manifest_digest == idx.manifest_digest
    assert ImageFactory(seed="other").layer().digest != base[0].digest
    # $IMGTOOL_TEST_SEED is mixed into every seed: the same test, other bytes of the same shape
    monkeypatch.setenv(SEED_ENV, "another suite seed")
    h = ImageFactory(seed="shape")
    other = h.multiarch(layers=1, base=h.layers(2))
    assert other.manifest_digest != idx.manifest_digest
    assert [layer.size >= 1 << 20 for layer in other.image("amd64").layers] == [True] * 3


# -- the daemon ---------------------------------------------------------------------------------


@pytest.mark.engines
def test_docker_load_image_id_is_the_config_digest_except_in_the_containerd_store(factory, uniq, tmp_path,
                                                                                docker_cli, docker_cleanup):
    image = factory.image("amd64", layers=3)
    tag = f"example.test/{uniq}/app:v1"
    archive = write_docker_archive(image, tmp_path / "image.tar", tag)
    docker_cleanup.image(tag, image.id)

    out = docker_cli.load(archive).stdout
    assert f"Loaded image: {tag}" in out

    info = docker_cli.inspect_image(tag)
    if docker_cli.containerd_store:  # the ID of a manifest Docker made for the docker-archive, not the config's
        assert info["Id"].startswith("sha256:") and info["Id"] != image.config_digest
    else:
        assert info["Id"] == image.config_digest
    assert tag in info["RepoTags"]
    assert info["RootFS"]["Layers"] == image.diff_ids
    assert info["Architecture"] == "amd64"


@pytest.mark.engines(stores=True)
def test_docker_load_skips_layers_the_daemon_already_has(factory, uniq, tmp_path, docker_cli,
                                                          docker_cleanup):
    # CONTEXT.md: an archive may omit layer files whose chain exists already (delta bundles). The
    # containerd store reads only the docker-archive side of such an archive that has no index.json,
    # and needs every layer file there; through an OCI index.json it takes the blobs it already has
    # from its content store (test_delta.py loads imgtool's delta bundles on every engine).
    base = factory.layers(2)
    old = factory.image("amd64", layers=1, base=base)
    new = factory.image("amd64", layers=1, base=base)
    docker_cleanup.image(old.id, new.id)
    docker_cli.load(write_docker_archive(old, tmp_path / "old.tar", f"{uniq}/app:old"))
    delta = write_docker_archive(new, tmp_path / "delta.tar", f"{uniq}/app:new",
                                 omit_layers=[layer.digest for layer in base])
    with tarfile.open(delta) as tar:
        assert len([n for n in tar.getnames() if n.endswith("layer.tar")]) == 1
    if docker_cli.containerd_store:
        refused = docker_cli("load", "-i", delta, check=False)
        assert refused.returncode == 1
        assert refused.stderr.startswith('failed to resolve layers: layer "') and \
            refused.stderr.rstrip().endswith('/layer.tar" not found')
        return
    docker_cli.load(delta)
    assert docker_cli.inspect_image(f"{uniq}/app:new")["Id"] == new.id


@pytest.mark.engines(stores=True)
def test_docker_run_with_shm_size_in_the_test_network_mode(services, factory, uniq, tmp_path,
                                                           docker_cli, docker_cleanup):
    image = factory.image(layers=1, layer_size=100_000, runnable=True)
    tag = f"{uniq}/runnable:v1"
    docker_cleanup.image(tag, image.id)
    docker_cli.load(write_docker_archive(image, tmp_path / "run.tar", tag))

    out = docker_cli("run", "--rm", "--network", services.docker_network, "--shm-size", "256m",
                     tag, "df", "-k", "/dev/shm").stdout
    fields = out.strip().splitlines()[-1].split()
    assert fields[-1] == "/dev/shm" and fields[1] == str(256 * 1024)


# -- the runtimes of nodes without Docker: containerd (Kubernetes) and Podman ------------------------


@pytest.mark.parametrize("version", ["1.6", "1.7", "2.1"])
def test_private_containerd_imports_unpacks_and_runs_like_a_node(version, services, factory, uniq, tmp_path):
    """Each private containerd is a node's: the CRI plugin marks what is imported into k8s.io as
    the kubelet's, the image unpacks into the default snapshotter, and a container runs from it
    with runc's state under the services dir (2.1: with its own ctr, through the transfer service)."""
    sock = services.containerd(version)
    path = containerd_path(sock)
    image = factory.image(layers=1, layer_size=50_000, runnable=True)
    name = f"example.test/{uniq}/node:v1"
    archive = write_docker_archive(image, tmp_path / "image.tar", name)

    def ctr(*args, check=True):
        return subprocess.run(["ctr", "--address", sock, "-n", "k8s.io", *args], capture_output=True,
                              text=True, timeout=120, check=check, env=dict(os.environ, PATH=path))

    server = subprocess.run(["ctr", "--address", sock, "version"], capture_output=True, text=True,
                            timeout=30, check=True, env=dict(os.environ, PATH=path)).stdout
    assert f"Version:  {version}." in server.split("Server:", 1)[1]
    try:
        ctr("images", "import", archive)
        listed = [line.split() for line in ctr("images", "ls").stdout.splitlines()[1:]]
        row = next(r for r in listed if r[0] == name)
        assert row[-1] == "io.cri-containerd.image=managed"
        out = ctr("run", "--rm", "--runc-root", os.path.join(os.path.dirname(sock), "runc", "k8s.io"),
                  name, f"t{uniq}", "echo", "ran-on-containerd").stdout
        assert out.strip() == "ran-on-containerd"
    finally:
        ctr("images", "rm", name, check=False)


def test_private_podman_loads_and_runs_in_its_own_storage(services, factory, uniq, tmp_path):
    """The private podman keeps its images under the services dir, never in the machine's
    /var/lib/containers (its blob-info cache included), and runs a container.

    The blob-info cache is checked where it must land (DIR/varlib, bound over /var/lib/containers
    in podman's own mount namespace), not by the machine's copy staying unchanged: skopeo, run
    by other tests at the same time, writes the machine's copy."""
    env = services.podman_env()
    image = factory.image(layers=1, layer_size=50_000, runnable=True)
    name = f"example.test/{uniq}/pod:v1"
    archive = write_docker_archive(image, tmp_path / "image.tar", name)
    private_cache = os.path.join(services.podman, "varlib", "cache", "blob-info-cache-v1.boltdb")
    if os.path.exists(private_cache):
        os.unlink(private_cache)

    def podman(*args, check=True):
        return subprocess.run(["podman", *args], env=env, capture_output=True, text=True, timeout=120,
                              check=check)

    assert podman("info", "--format", "{{.Store.GraphRoot}}").stdout.strip() == \
        os.path.join(services.podman, "storage")
    try:
        assert f"Loaded image: {name}" in podman("load", "-i", archive).stdout
        assert podman("image", "inspect", name, "--format", "{{.Id}}").stdout.strip() == \
            image.config_digest.split(":", 1)[1]
        out = podman("run", "--rm", name, "echo", "ran-on-podman").stdout
        assert out.strip() == "ran-on-podman"
    finally:
        podman("rmi", "-f", name, check=False)
    assert os.path.getsize(private_cache) > 0


# -- the TLS registry (Basic auth) ----------------------------------------------------------------


@pytest.mark.parametrize("media, index_type, child_type", [
    ("oci", OCI_INDEX, OCI_MANIFEST),
    ("docker", DOCKER_MANIFEST_LIST, DOCKER_MANIFEST),
])
def test_tls_registry_with_basic_auth_serves_what_was_pushed(services, factory, uniq, media,
                                                             index_type, child_type):
    idx = factory.multiarch(layers=2, layer_size=200_000, media=media)
    repo = f"{uniq}/vllm-ascend"
    assert push_image(services.tls, repo, "v1", idx, scheme="https", auth=services.tls_auth,
                      verify=services.tls_ca) == idx.manifest_digest

    with requests.Session() as s:
        s.verify = services.tls_ca  # verified against our CA: the server cert is real
        s.trust_env = False
        r = s.get(f"https://{services.tls}/v2/")
        assert r.status_code == 401
        assert parse_challenge(r.headers["WWW-Authenticate"])[0] == "basic"

        s.auth = services.tls_auth
        r = s.get(f"https://{services.tls}/v2/{repo}/manifests/v1",
                  headers={"Accept": f"{OCI_INDEX}, {DOCKER_MANIFEST_LIST}"})
        assert r.status_code == 200
        assert r.headers["Content-Type"] == index_type
        assert sha256_digest(r.content) == idx.manifest_digest == r.headers["Docker-Content-Digest"]

        arm = idx.image("arm64")
        r = s.get(f"https://{services.tls}/v2/{repo}/manifests/{arm.manifest_digest}",
                  headers={"Accept": child_type})
        assert r.headers["Content-Type"] == child_type
        assert r.content == arm.manifest_bytes
        r = s.get(f"https://{services.tls}/v2/{repo}/blobs/{arm.layers[-1].digest}")
        assert r.content == arm.layers[-1].blob

        s.auth = (services.tls_user, "wrong")
        assert s.get(f"https://{services.tls}/v2/").status_code == 401

    with pytest.raises(requests.exceptions.SSLError):  # not trusted without our CA
        requests.get(f"https://{services.tls}/v2/", verify=True, timeout=10)


# -- the token registry (bearer tokens from our issuer) -------------------------------------------


def test_token_registry_accepts_issuer_tokens(services, factory, uniq, token_issuer, registry):
    r = requests.get(f"http://{services.token}/v2/", timeout=10)
    kind, params = parse_challenge(r.headers["WWW-Authenticate"])
    assert r.status_code == 401 and kind == "bearer"
    assert params == {"realm": services.token_realm, "service": services.token_service}

    image = factory.image("arm64", layers=2, layer_size=200_000, media="oci")
    repo = f"{uniq}/vllm-ascend"
    client = registry("token")
    client.push(repo, "v1", image)
    # one token for HEAD/GET (pull), one for POST/PUT (pull,push), each reused for every blob
    pushes = token_issuer.count
    # (distribution's challenge says "pull,push" or "push,pull", in no fixed order)
    assert [sorted(r.granted[0]["actions"]) for r in token_issuer.requests] == [
        ["pull"], ["pull", "push"]]
    assert {r.granted[0]["name"] for r in token_issuer.requests} == {repo}

    reader = registry("token")
    got = reader.get_manifest(repo, "v1")
    assert got.body == image.manifest_bytes and got.media_type == OCI_MANIFEST
    assert reader.get_blob(repo, image.config_digest) == image.config_bytes
    assert token_issuer.count == pushes + 1  # one pull token, reused for the blob
    assert token_issuer.requests[-1].granted == [
        {"type": "repository", "name": repo, "actions": ["pull"]}]


def test_token_registry_rejects_tokens_it_should_not_accept(services, factory, uniq,
                                                            token_issuer, tmp_path):
    image = factory.image(layers=1, layer_size=50_000)
    repo = f"{uniq}/app"
    RegistryClient.for_service(services, "token").push(repo, "v1", image)
    url = f"http://{services.token}/v2/{repo}/manifests/v1"
    accept = {"Accept": DOCKER_MANIFEST}

    good = token_issuer.make_token([{"type": "repository", "name": repo, "actions": ["pull"]}])
    assert requests.get(url, headers={**accept, "Authorization": f"Bearer {good}"}).status_code == 200

    other = token_issuer.make_token([{"type": "repository", "name": f"{uniq}/other",
                                      "actions": ["pull"]}])
    assert requests.get(url, headers={**accept, "Authorization": f"Bearer {other}"}).status_code == 401

    expired = token_issuer.make_token([{"type": "repository", "name": repo, "actions": ["pull"]}],
                                      lifetime=60, now=1_600_000_000)
    assert requests.get(url, headers={**accept, "Authorization": f"Bearer {expired}"}).status_code == 401

    forged = _forger(tmp_path, services).make_token(
        [{"type": "repository", "name": repo, "actions": ["pull"]}])
    assert requests.get(url, headers={**accept, "Authorization": f"Bearer {forged}"}).status_code == 401


def test_token_issuer_checks_credentials_when_asked(services, token_issuer):
    token_issuer.credentials = {"alice": "s3cret"}
    realm, scope = services.token_realm, {"service": services.token_service,
                                          "scope": "repository:a/b:pull,push"}
    assert requests.get(realm, params=scope, auth=("alice", "nope")).status_code == 401
    anon = requests.get(realm, params=scope)
    assert anon.status_code == 200 and token_issuer.requests[-1].granted[0]["actions"] == ["pull"]
    ok = requests.get(realm, params=scope, auth=("alice", "s3cret")).json()
    assert ok["token"] == ok["access_token"] and ok["expires_in"] == 300
    assert token_issuer.requests[-1].granted[0]["actions"] == ["pull", "push"]
    token_issuer.fail_next(503)
    assert requests.get(realm, params=scope).status_code == 503
    assert token_issuer.count == 4


def _forger(tmp_path, services) -> TokenIssuer:
    """An issuer with the right names but its own key: the registry must not trust it."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID
    import datetime

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, services.token_issuer)])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=1)).sign(key, hashes.SHA256()))
    (tmp_path / "k.pem").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    (tmp_path / "c.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return TokenIssuer(str(tmp_path / "k.pem"), str(tmp_path / "c.pem"),
                       issuer=services.token_issuer, service=services.token_service)


# -- skopeo and the mirror stand-ins -------------------------------------------------------------


def _skopeo_inspect(*args) -> dict:
    proc = subprocess.run(["skopeo", "inspect", "--tls-verify=false", *args],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_skopeo_sees_what_we_pushed(services, factory, uniq):
    idx = factory.multiarch(layers=1, layer_size=100_000, media="oci", image_media="docker")
    ref = f"docker://{services.plain}/{uniq}/vllm-ascend:v1"
    push_image(services.plain, f"{uniq}/vllm-ascend", "v1", idx)

    arm = idx.image("arm64")
    info = _skopeo_inspect("--override-arch", "arm64", "--override-variant", "v8", ref)
    assert info["Architecture"] == "arm64"
    assert info["Layers"] == [layer.digest for layer in arm.layers]
    assert info["Digest"] == idx.manifest_digest

    raw = subprocess.run(["skopeo", "inspect", "--tls-verify=false", "--raw", ref],
                         capture_output=True, timeout=60, check=True).stdout
    assert sha256_digest(raw) == idx.manifest_digest

    amd = _skopeo_inspect("--override-arch", "amd64", ref)
    assert amd["Architecture"] == "amd64"
    assert amd["Layers"] == [layer.digest for layer in idx.image("amd64").layers]


def test_mirror_stand_ins_serve_one_digest(services, factory, mirrored, registry):
    idx = factory.multiarch(layers=1, layer_size=100_000)
    ms = mirrored(idx, tag="v0.9.1rc1")
    assert ms.upstream == (services.plain, f"{ms.namespace}/vllm-ascend")
    assert ms.daocloud == (services.mirror, f"quay.io/{ms.namespace}/vllm-ascend")
    assert ms.nju == (services.mirror, f"{ms.namespace}/vllm-ascend")
    assert ms.image_ref == f"quay.io/{ms.namespace}/vllm-ascend:v0.9.1rc1"
    for reg, path in (ms.upstream, ms.daocloud, ms.nju):
        name = "plain" if reg == services.plain else "mirror"
        assert registry(name).head_manifest(path, "v0.9.1rc1") == idx.manifest_digest
    assert 'prefix = "quay.io"' in ms.mirrors_toml()

    lagging = mirrored(factory.multiarch(layers=1, layer_size=50_000), tag="v1",
                       targets=("upstream",))
    assert registry("mirror").head_manifest(lagging.daocloud[1], "v1") is None


def test_moving_a_tag(services, factory, uniq, registry):
    client = registry("plain")
    repo = f"{uniq}/app"
    first, second = factory.image(layers=1, layer_size=50_000), factory.image(layers=1,
                                                                              layer_size=50_000)
    client.push(repo, "latest", first)
    client.push(repo, "latest", second)
    assert client.head_manifest(repo, "latest") == second.manifest_digest
    assert client.delete_tag(repo, "latest") == second.manifest_digest
    assert client.head_manifest(repo, "latest") is None
    assert client.get_manifest(repo, first.manifest_digest).body == first.manifest_bytes


# -- no services, no green run --------------------------------------------------------------------


def test_missing_services_fail_the_run_instead_of_skipping(services, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("IMGTOOL_TEST_")}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         f"{__file__}::test_tls_registry_with_basic_auth_serves_what_was_pushed"],
        capture_output=True, text=True, env=env, timeout=120,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    )
    assert proc.returncode == 1, proc.stdout
    assert NOT_RUNNING in proc.stdout
    assert "skipped" not in proc.stdout and "2 errors" in proc.stdout
    with pytest.raises(Exception, match="missing: IMGTOOL_TEST_SERVICES_DIR"):
        Services.from_env({})


# -- what the README says about the set-up ------------------------------------------------------

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_docs_list_exactly_the_packages_services_sh_installs():
    """Both languages (docs/testing.md, the Chinese manual) name the Debian packages `scripts/services.sh up`
    installs: the list in ensure_packages, no more, no fewer."""
    import re

    script = open(os.path.join(ROOT, "scripts", "services.sh"), encoding="utf-8").read()
    body = script.split("ensure_packages() {", 1)[1].split("done <<'EOF'\n", 1)[1].split("\nEOF\n", 1)[0]
    installed = sorted({line.split()[0] for line in body.splitlines() if line.strip()})
    docs = "".join(open(os.path.join(ROOT, "docs", name), encoding="utf-8").read()
                   for name in ("testing.md", "manual-zh.md"))
    lists = [sorted(m.split()) for m in re.findall(r"`(docker\.io docker-registry [^`]+)`", docs)]
    assert len(lists) == 2 and lists[0] == lists[1] == installed, (lists, installed)


@pytest.mark.services  # demo.sh starts a dockerd and registries of its own: not a test of the fast tier
def test_the_demo_runs_without_a_terminal_and_prints_no_colour(tmp_path):
    """scripts/demo.sh with stdout a pipe (a log, CI): the whole flow, and no ANSI escape in its output."""
    import tempfile

    state = tempfile.mkdtemp(prefix="idemo", dir="/tmp")  # short: unix socket paths
    env = {k: v for k, v in os.environ.items() if not k.startswith(("IMGTOOL_", "DOCKER_")) and k != "NO_COLOR"}
    # slot 7: a port range no set of the suite's workers draws from
    env.update(IMGTOOL_SERVICES_DIR=state, IMGTOOL_SERVICES_ENGINES="20.10", IMGTOOL_SERVICES_SLOT="7",
               DEMO_DIR=str(tmp_path / "demo"), IMGTOOL_VENV=sys.prefix)
    try:
        r = subprocess.run(["bash", os.path.join(ROOT, "scripts", "demo.sh")], env=env, stdin=subprocess.DEVNULL,
                           capture_output=True, text=True, timeout=900)
    finally:
        subprocess.run([os.path.join(ROOT, "scripts", "services.sh"), "down"], env=env, capture_output=True)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "\n$ imgtool verify vllm-ascend-v0.22.1rc1-" in r.stdout and "demo done:" in r.stdout
    assert "\x1b" not in r.stdout and "\x1b" not in r.stderr


def test_each_worker_reaches_its_own_set_of_services(tmp_path):
    """scripts/test.sh starts a set of services per pytest-xdist worker; worker gwN reads set N, never another's."""
    from tests.support.services import ServicesNotRunning, worker_environment

    files = []
    for n in range(2):
        f = tmp_path / f"env{n}.sh"
        f.write_text(f"export IMGTOOL_TEST_SERVICES_DIR=/tmp/imgtool-svc-{n}\n"
                     f"export IMGTOOL_TEST_REGISTRY_PLAIN=127.0.0.1:2{n}000\n")
        files.append(str(f))
    sets = " ".join(files)
    assert worker_environment({"PYTEST_XDIST_WORKER": "gw1", "IMGTOOL_TEST_SERVICE_SETS": sets}) == {
        "IMGTOOL_TEST_SERVICES_DIR": "/tmp/imgtool-svc-1", "IMGTOOL_TEST_REGISTRY_PLAIN": "127.0.0.1:21000"}
    assert worker_environment({"IMGTOOL_TEST_SERVICE_SETS": sets}) == {}  # not a worker: the first set, as exported
    assert worker_environment({"PYTEST_XDIST_WORKER": "gw0", "PYTEST_XDIST_WORKER_COUNT": "2"}) == {}  # the fast tier
    with pytest.raises(ServicesNotRunning) as e:  # `pytest -n 2` by hand on the one set `services.sh up` started
        worker_environment({"PYTEST_XDIST_WORKER": "gw0", "PYTEST_XDIST_WORKER_COUNT": "2",
                            "IMGTOOL_TEST_SERVICES_DIR": "/tmp/imgtool-svc"})
    assert str(e.value) == ("2 pytest-xdist workers on one set of services: start a set per worker "
                            "(IMGTOOL_TEST_WORKERS=2 scripts/test.sh -n 2 ...)")
    with pytest.raises(ServicesNotRunning) as e:
        worker_environment({"PYTEST_XDIST_WORKER": "gw2", "IMGTOOL_TEST_SERVICE_SETS": sets})
    assert str(e.value).startswith("pytest-xdist worker gw2 has no set of services of its own (IMGTOOL_TEST_SERVICE_SETS names 2)")
