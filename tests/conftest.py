"""Fixtures over the real services started by scripts/services.sh (run everything via scripts/test.sh).

services        Services (registries host:port, dockerd socket, TLS CA, token issuer settings); in a test
                marked @pytest.mark.engines, docker_host is the socket of the engine it runs on (the
                test runs once per engine: 20.10, 26.1, 26.1-containerd, 28.5; see scripts/services.sh)
engine          the name of that engine (None in unmarked tests, which use UNMARKED_ENGINE, 26.1)
node            in a test marked @pytest.mark.runtimes (run once per Docker engine, then on containerd 1.6,
                1.7 and 2.1 and Podman 4.3; marked runtimes(proof=True), a verb's proof, on Podman 5.8
                too): tests.support.runtimes.Node, the env for imgtool
                (node.env), what the runtime holds, the ID it gives an image, a container run, cleanup
factory         ImageFactory seeded from the test's node id (stable per test, distinct across tests)
uniq            a fresh repository namespace, e.g. "t3f9a0c1d", so tests never share repositories
docker_cli      DockerCLI: docker_cli("image", "inspect", ref) against the test dockerd
docker_cleanup  DaemonCleanup: .image(ref_or_id) / .container(name) are removed after the test
registry        registry("plain"|"mirror"|"tls"|"token") -> RegistryClient with the right auth
token_issuer    the TokenIssuer on IMGTOOL_TEST_TOKEN_PORT, its counters and policy reset per test
mirrored        mirrored(image, tag="v1") -> MirrorSet: quay.io / DaoCloud / NJU stand-ins
"""

import hashlib
import os
import secrets
import subprocess

import pytest

from tests.support.daemon import DaemonCleanup, DockerCLI
from tests.support.runtimes import PROOF_RUNTIMES, RUNTIMES, Node, node_for
from tests.support.images import ImageFactory
from tests.support.registry import RegistryClient, publish_mirrored
from tests.support.services import Services, ServicesNotRunning, worker_environment
from tests.support.tokenissuer import TokenIssuer

ENGINES = ("20.10", "26.1", "26.1-containerd", "28.5")  # scripts/services.sh starts each; CI runs them all
# `engines(stores=True)` / `runtimes(stores=True)`: a test of one more case of a verb (a hostile input, an edge of a
# format) runs on one engine per image store and one per runtime kind; the proof that each verb works on each
# engine (load, load.sh, the pyz, inventory, delta, doctor, export, run) keeps the whole matrix. Each engine more
# multiplied every case: the suite went over its budget when 28.5 and containerd 2.1 joined (issue 49)
STORE_ENGINES = ("20.10", "26.1-containerd")  # the graphdriver Docker of Kylin hosts, the containerd store
STORE_RUNTIMES = ("containerd-1.7", "podman-4.3")
# The Docker of a test with no engine marker (its subject is not the engine: a fetch, a registry, a bundle's
# format). 26.1, not 20.10: 20.10 starts itself again for every layer it unpacks (docker-untar), ~70 ms of CPU
# a layer against 26.1's ~10 (measured, a 5-layer load: 0.39 against 0.05 CPU s), and those tests' dockerd work
# was the largest single share of the services tier's CPU; every verb's proof still runs on 20.10 (the matrix).
UNMARKED_ENGINE = "26.1"


def pytest_configure(config):
    # a pytest-xdist worker reaches its own set of services (scripts/test.sh starts one per worker), never
    # another worker's: set before any fixture or helper reads the IMGTOOL_TEST_* variables
    try:
        os.environ.update(worker_environment())
    except (ServicesNotRunning, OSError) as e:
        raise pytest.UsageError(str(e)) from None
    config.addinivalue_line("markers", "engines(stores=False): run the test once on every Docker engine of the matrix "
                                       "(stores=True: once per image store)")
    config.addinivalue_line("markers", "runtimes(stores=False, proof=False): run the test once on every Docker engine, "
                                       "containerd and Podman (stores=True: once per image store and runtime kind; "
                                       "proof=True: its verb's proof, on Podman 5.8 too)")
    config.addinivalue_line("markers", "services: reaches a registry, dockerd, containerd or Podman (set from the fixtures "
                                       "it uses; scripts/test.sh runs the others first, before the services start)")


def pytest_collection_modifyitems(config, items):
    # The two tiers of scripts/test.sh: a test that reaches a service (anything built on `_services`: a
    # registry, a dockerd, containerd, Podman) is marked `services`; the rest run first, before any starts.
    for item in items:
        if "_services" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.services)


def pytest_generate_tests(metafunc):
    runtimes, engines = (metafunc.definition.get_closest_marker(m) for m in ("runtimes", "engines"))
    if runtimes:
        proof = PROOF_RUNTIMES if runtimes.kwargs.get("proof") else ()
        stores = runtimes.kwargs.get("stores")
        metafunc.parametrize("engine", (STORE_ENGINES + STORE_RUNTIMES if stores else ENGINES + RUNTIMES) + proof,
                             indirect=True)
    elif engines:
        metafunc.parametrize("engine", STORE_ENGINES if engines.kwargs.get("stores") else ENGINES, indirect=True)


@pytest.fixture(scope="session")
def _services() -> Services:
    # A missing service fails the tests that need it, never skips them: a green run must mean
    # the real registries and daemons were exercised.
    try:
        svc = Services.from_env()
        svc.check()
    except ServicesNotRunning as e:
        pytest.fail(str(e), pytrace=False)
    # services started with fewer engines (IMGTOOL_SERVICES_ENGINES) leave the unmarked tests the first
    return svc.on(UNMARKED_ENGINE) if UNMARKED_ENGINE in dict(svc.engines) else svc


@pytest.fixture
def engine(request):
    return getattr(request, "param", None)


@pytest.fixture
def services(_services, engine) -> Services:
    if engine is None or engine in RUNTIMES + PROOF_RUNTIMES:
        return _services
    try:
        return _services.on(engine)
    except ServicesNotRunning as e:
        pytest.fail(str(e), pytrace=False)


@pytest.fixture
def factory(request) -> ImageFactory:
    seed = hashlib.sha256(request.node.nodeid.encode()).hexdigest()[:16]
    return ImageFactory(seed)


@pytest.fixture
def uniq() -> str:
    return "t" + secrets.token_hex(4)


@pytest.fixture
def docker_cli(services) -> DockerCLI:
    try:
        return DockerCLI(services.docker_host)
    except RuntimeError as e:
        pytest.fail(str(e), pytrace=False)


@pytest.fixture
def node(_services, engine):
    """The runtime a @pytest.mark.runtimes test runs on; what the test asked it to remove goes after it."""
    try:
        n: Node = node_for(engine or ENGINES[0], _services)
    except (RuntimeError, ServicesNotRunning) as e:
        pytest.fail(str(e), pytrace=False)
    yield n
    errors = n.cleanup()
    if errors:
        pytest.fail(f"cleanup of {n.title} failed: " + "; ".join(errors), pytrace=False)


@pytest.fixture
def docker_cleanup(docker_cli):
    cleanup = DaemonCleanup(docker_cli)
    yield cleanup
    errors = cleanup.run()
    if errors:
        pytest.fail("cleanup of the test daemon failed: " + "; ".join(errors), pytrace=False)


@pytest.fixture
def registry(services):
    clients = []

    def make(name: str, auth=None) -> RegistryClient:
        client = RegistryClient.for_service(services, name, auth)
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()


@pytest.fixture(scope="session")
def _token_issuer_server(_services):
    services = _services
    issuer = TokenIssuer(services.token_key, services.token_cert, issuer=services.token_issuer,
                         service=services.token_service, port=services.token_port)
    try:
        issuer.start()
    except OSError as e:
        pytest.fail(f"cannot start the token issuer on 127.0.0.1:{services.token_port}: {e}",
                    pytrace=False)
    # the realm the token registry names must be answered by this issuer, not by whatever else
    import requests

    answer = requests.get(services.token_realm, params={"service": services.token_service}, timeout=10)
    if answer.status_code != 200 or "token" not in answer.text:
        issuer.stop()
        pytest.fail(f"the token realm {services.token_realm} is not answered by the test's issuer: "
                    f"HTTP {answer.status_code} {answer.text[:200]}", pytrace=False)
    issuer.reset()
    yield issuer
    issuer.stop()


@pytest.fixture(scope="session", autouse=True)
def _token_issuer_bound_first(request):
    """The issuer binds its port when the session starts, not when the first token test runs: until it
    does, the port services.sh reserved is free for anything to take (CI once saw Docker's 404 answer
    the realm). Runs without services (unit tests only) skip this; tests that need them fail alone."""
    try:
        Services.from_env()
    except ServicesNotRunning:
        return
    request.getfixturevalue("_token_issuer_server")


@pytest.fixture
def token_issuer(_token_issuer_server) -> TokenIssuer:
    _token_issuer_server.reset()
    yield _token_issuer_server
    _token_issuer_server.reset()


@pytest.fixture
def mirrored(services, uniq):
    """mirrored(image_or_index, tag="v1", targets=(...)) publishes under quay.io-style paths."""

    def publish(image_or_index, tag="v1", targets=("upstream", "daocloud", "nju"),
                name="vllm-ascend"):
        return publish_mirrored(services, uniq, tag, image_or_index, targets=targets, name=name)

    return publish


@pytest.fixture
def tiny_tmpfs(tmp_path):
    """A 1 MiB tmpfs (disk-full cases), unmounted after the test."""
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.fail(f"cannot mount a tmpfs (the suite runs as root): {r.stderr.strip()}", pytrace=False)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)
