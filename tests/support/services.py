"""The real services started by scripts/services.sh, as described by its IMGTOOL_TEST_* variables."""

import os
import shlex
import socket
from dataclasses import dataclass, replace
from typing import Dict, Mapping, Optional, Tuple

NOT_RUNNING = (
    'test services are not running: run scripts/test.sh (or eval "$(scripts/services.sh env)")'
)

ENV_VARS = (
    "IMGTOOL_TEST_SERVICES_DIR",
    "IMGTOOL_TEST_DOCKER_HOST",
    "IMGTOOL_TEST_ENGINES",
    "IMGTOOL_TEST_DOCKER_NETWORK",
    "IMGTOOL_TEST_REGISTRY_PLAIN",
    "IMGTOOL_TEST_REGISTRY_MIRROR",
    "IMGTOOL_TEST_REGISTRY_TLS",
    "IMGTOOL_TEST_TLS_CA",
    "IMGTOOL_TEST_TLS_USER",
    "IMGTOOL_TEST_TLS_PASSWORD",
    "IMGTOOL_TEST_REGISTRY_TOKEN",
    "IMGTOOL_TEST_TOKEN_PORT",
    "IMGTOOL_TEST_TOKEN_KEY",
    "IMGTOOL_TEST_TOKEN_CERT",
    "IMGTOOL_TEST_TOKEN_SERVICE",
    "IMGTOOL_TEST_TOKEN_ISSUER",
)


class ServicesNotRunning(RuntimeError):
    """The IMGTOOL_TEST_* variables are missing or the services do not answer."""


@dataclass(frozen=True)
class Services:
    """Where everything is; registries are `host:port` strings."""

    dir: str
    docker_host: str  # unix:///.../docker.sock of the engine a test runs against (IMGTOOL_TEST_DOCKER_HOST,
    # the first, by default; conftest gives a test with no engine marker UNMARKED_ENGINE)
    engines: Tuple[Tuple[str, str], ...]  # (name, docker host) of every engine: 20.10, 26.1, 26.1-containerd
    docker_network: str  # what `docker run --network` must be (no bridge in the test daemon)
    plain: str  # HTTP, no auth: stands in for quay.io
    mirror: str  # HTTP, no auth: stands in for DaoCloud (prefix) and NJU (host swap)
    tls: str  # HTTPS (tls_ca) + Basic auth (tls_user / tls_password)
    tls_ca: str
    tls_user: str
    tls_password: str
    token: str  # HTTP + bearer token auth from the issuer on token_port
    token_port: int
    token_key: str
    token_cert: str
    token_service: str
    token_issuer: str
    # runtimes beside Docker (IMGTOOL_SERVICES_RUNTIMES may leave them out: then empty)
    containerds: Tuple[Tuple[str, str], ...] = ()  # (version, socket path): 1.6, 1.7
    podman: str = ""  # the private podman 4.3's directory (storage.conf, containers.conf, bin/podman)
    podmans: Tuple[Tuple[str, str], ...] = ()  # (version, directory) of every private podman: 4.3, 5.8

    @classmethod
    def from_env(cls, environ: Optional[Mapping[str, str]] = None) -> "Services":
        """Read the IMGTOOL_TEST_* variables; raises ServicesNotRunning naming the missing ones."""
        env = os.environ if environ is None else environ
        missing = [name for name in ENV_VARS if not env.get(name)]
        if missing:
            raise ServicesNotRunning(f"{NOT_RUNNING}; missing: {', '.join(missing)}")
        v = lambda name: env[name]  # noqa: E731
        return cls(
            dir=v("IMGTOOL_TEST_SERVICES_DIR"),
            docker_host=v("IMGTOOL_TEST_DOCKER_HOST"),
            engines=tuple(tuple(item.split("=", 1)) for item in v("IMGTOOL_TEST_ENGINES").split()),  # type: ignore
            docker_network=v("IMGTOOL_TEST_DOCKER_NETWORK"),
            plain=v("IMGTOOL_TEST_REGISTRY_PLAIN"),
            mirror=v("IMGTOOL_TEST_REGISTRY_MIRROR"),
            tls=v("IMGTOOL_TEST_REGISTRY_TLS"),
            tls_ca=v("IMGTOOL_TEST_TLS_CA"),
            tls_user=v("IMGTOOL_TEST_TLS_USER"),
            tls_password=v("IMGTOOL_TEST_TLS_PASSWORD"),
            token=v("IMGTOOL_TEST_REGISTRY_TOKEN"),
            token_port=int(v("IMGTOOL_TEST_TOKEN_PORT")),
            token_key=v("IMGTOOL_TEST_TOKEN_KEY"),
            token_cert=v("IMGTOOL_TEST_TOKEN_CERT"),
            token_service=v("IMGTOOL_TEST_TOKEN_SERVICE"),
            token_issuer=v("IMGTOOL_TEST_TOKEN_ISSUER"),
            containerds=tuple(tuple(item.split("=", 1))  # type: ignore
                              for item in env.get("IMGTOOL_TEST_CONTAINERDS", "").split()),
            podman=env.get("IMGTOOL_TEST_PODMAN", ""),
            podmans=tuple(tuple(item.split("=", 1))  # type: ignore
                          for item in env.get("IMGTOOL_TEST_PODMANS", "").split()),
        )

    def on(self, engine: str) -> "Services":
        """The same services, with `docker_host` the socket of this engine."""
        hosts = dict(self.engines)
        if engine not in hosts:
            raise ServicesNotRunning(f"engine {engine} is not running (IMGTOOL_TEST_ENGINES: "
                                     f"{', '.join(hosts) or 'none'}); scripts/test.sh starts every engine")
        return replace(self, docker_host=hosts[engine])

    def containerd(self, version: str) -> str:
        """The socket of the private containerd of this version (1.6, 1.7)."""
        sockets = dict(self.containerds)
        if version not in sockets:
            raise ServicesNotRunning(f"containerd {version} is not running (IMGTOOL_TEST_CONTAINERDS: "
                                     f"{', '.join(sockets) or 'none'}); scripts/test.sh starts every runtime")
        return sockets[version]

    def podman_env(self, base: Optional[Mapping[str, str]] = None, version: str = "") -> Dict[str, str]:
        """`base` (os.environ by default) with the private podman (4.3, or `version`) first in PATH and its
        configuration."""
        directory = dict(self.podmans).get(version, "") if version else self.podman
        if not directory:
            raise ServicesNotRunning(f"podman {version or '4.3'} is not set up (IMGTOOL_TEST_PODMANS: "
                                     f"{' '.join(v for v, _ in self.podmans) or 'none'}); "
                                     "scripts/test.sh sets up every runtime")
        env = dict(os.environ if base is None else base)
        env["PATH"] = os.path.join(directory, "bin") + os.pathsep + env.get("PATH", "/usr/bin:/bin")
        env["CONTAINERS_STORAGE_CONF"] = os.path.join(directory, "storage.conf")
        env["CONTAINERS_CONF"] = os.path.join(directory, "containers.conf")
        return env

    @property
    def tls_auth(self):
        return (self.tls_user, self.tls_password)

    @property
    def token_realm(self) -> str:
        return f"http://127.0.0.1:{self.token_port}/token"

    def url(self, name: str) -> str:
        """Base URL of a registry by name: plain, mirror, tls or token."""
        scheme = "https" if name == "tls" else "http"
        return f"{scheme}://{getattr(self, name)}"

    def check(self) -> None:
        """Raise ServicesNotRunning unless dockerd and every registry accept connections."""
        dead = []
        for name in ("plain", "mirror", "tls", "token"):
            host, port = getattr(self, name).rsplit(":", 1)
            try:
                socket.create_connection((host, int(port)), timeout=2).close()
            except OSError as e:
                dead.append(f"registry {name} at {getattr(self, name)} ({e})")
        sockets = [(f"dockerd {engine}", host[len("unix://"):])
                   for engine, host in self.engines or (("docker", self.docker_host),)]
        sockets += [(f"containerd {version}", path) for version, path in self.containerds]
        for what, path in sockets:
            s = socket.socket(socket.AF_UNIX)
            try:
                s.settimeout(2)
                s.connect(path)
            except OSError as e:
                dead.append(f"{what} at {path} ({e})")
            finally:
                s.close()
        if dead:
            raise ServicesNotRunning(
                "test services are not answering: " + "; ".join(dead)
                + ": run scripts/test.sh (or scripts/services.sh up)"
            )


def worker_environment(environ: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """The IMGTOOL_TEST_* variables of this pytest-xdist worker's own set of services ({} outside a worker or
    where no services were started).

    scripts/test.sh starts one set per worker and names their env files in IMGTOOL_TEST_SERVICE_SETS;
    worker gwN takes set N, so no two workers share a dockerd, containerd, Podman storage or registry.
    Raises ServicesNotRunning when the worker has no set of its own."""
    env = os.environ if environ is None else environ
    worker = env.get("PYTEST_XDIST_WORKER", "")
    sets = env.get("IMGTOOL_TEST_SERVICE_SETS", "").split()
    if not worker:
        return {}  # one process: the services exported, whichever they are
    if not sets:
        count = env.get("PYTEST_XDIST_WORKER_COUNT", "1")
        if env.get("IMGTOOL_TEST_SERVICES_DIR") and count != "1":
            # the workers would share every runtime, and each would bind the one token issuer's port
            raise ServicesNotRunning(f"{count} pytest-xdist workers on one set of services: start a set per worker "
                                     f"(IMGTOOL_TEST_WORKERS={count} scripts/test.sh -n {count} ...)")
        return {}  # no services at all (the fast tier): nothing to choose
    index = int(worker[2:]) if worker[:2] == "gw" and worker[2:].isdigit() else -1
    if not 0 <= index < len(sets):
        raise ServicesNotRunning(f"pytest-xdist worker {worker} has no set of services of its own "
                                 f"(IMGTOOL_TEST_SERVICE_SETS names {len(sets)}): run scripts/test.sh, "
                                 "or give IMGTOOL_TEST_WORKERS as many sets as -n workers")
    found = {}
    with open(sets[index], encoding="utf-8") as f:
        for line in f:
            words = shlex.split(line)
            if len(words) == 2 and words[0] == "export" and "=" in words[1]:
                name, value = words[1].split("=", 1)
                found[name] = value
    return found
