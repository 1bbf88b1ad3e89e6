"""The Docker daemon adapter: the only module that imports docker (docker-py).

Everything the product asks of a local Docker goes through here: version and storage
facts, load, image inspection, inventory, save, and container runs.
"""

from typing import Optional

from .errors import DaemonError


def connect(timeout: int = 600):
    """A docker-py client from the environment (DOCKER_HOST etc.); raises DaemonError."""
    try:
        import docker
        from docker.errors import DockerException
    except ImportError as e:  # pragma: no cover - only in a broken install
        raise DaemonError(f"the docker Python package is not available: {e}", hint="pip install docker")
    try:
        client = docker.from_env(timeout=timeout)
        client.ping()
        return client
    except DockerException as e:
        raise DaemonError(f"cannot reach the Docker daemon: {_short(e)}",
                          hint="is dockerd running? check DOCKER_HOST and permissions on the socket")
    except Exception as e:  # requests/urllib3 connection errors surface raw here
        raise DaemonError(f"cannot reach the Docker daemon: {_short(e)}",
                          hint="is dockerd running? check DOCKER_HOST and permissions on the socket")


def _short(e: Exception, limit: int = 300) -> str:
    """One line of an exception's text, without secrets or newlines."""
    text = " ".join(str(e).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
