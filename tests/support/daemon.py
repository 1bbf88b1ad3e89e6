"""The `docker` CLI against the test dockerd, and cleanup of what a test put into it."""

import os
import shutil
import subprocess
from typing import List, Optional, Sequence, Union


class DockerCLIError(RuntimeError):
    def __init__(self, proc: subprocess.CompletedProcess):
        err = proc.stderr if isinstance(proc.stderr, str) else (proc.stderr or b"").decode(
            "utf-8", "replace")
        super().__init__(f"{' '.join(map(str, proc.args))} exited {proc.returncode}: {err.strip()}")
        self.proc = proc


class DockerCLI:
    """`docker -H <test daemon> ...`; call it like docker_cli("image", "inspect", ref)."""

    def __init__(self, docker_host: str, binary: Optional[str] = None):
        self.docker_host = docker_host
        self.binary = binary or os.environ.get("IMGTOOL_TEST_DOCKER_CLI") or shutil.which("docker")
        if not self.binary:
            raise RuntimeError("the docker CLI is not installed (apt-get install docker.io)")
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("DOCKER_")}  # no context/TLS/host from the developer's shell
        env["DOCKER_CLI_HINTS"] = "false"
        self.env = env

    def __call__(self, *args, check: bool = True, input: Union[bytes, str, None] = None,
                 timeout: float = 300, text: bool = True) -> subprocess.CompletedProcess:
        """Run docker; raises DockerCLIError (with stderr) on a nonzero exit when check."""
        if text and isinstance(input, bytes):
            text = False
        proc = subprocess.run(
            [self.binary, "-H", self.docker_host, *map(str, args)],
            input=input, capture_output=True, text=text, timeout=timeout, env=self.env,
        )
        if check and proc.returncode != 0:
            raise DockerCLIError(proc)
        return proc

    def image_ids(self) -> List[str]:
        out = self("image", "ls", "-a", "-q", "--no-trunc").stdout
        return sorted(set(out.split()))

    def inspect_image(self, ref: str) -> Optional[dict]:
        """`docker image inspect` as a dict, or None when the image is not there."""
        import json

        proc = self("image", "inspect", ref, check=False)
        if proc.returncode != 0:
            return None
        return json.loads(proc.stdout)[0]

    def load(self, archive_path: Union[str, os.PathLike]) -> subprocess.CompletedProcess:
        return self("load", "-i", os.fspath(archive_path))


class DaemonCleanup:
    """Collects images/containers a test created; removes them when the test ends."""

    def __init__(self, cli: DockerCLI):
        self.cli = cli
        self.images: List[str] = []
        self.containers: List[str] = []

    def image(self, *refs: str) -> None:
        """Remove these images (tags or IDs) at the end of the test."""
        self.images.extend(refs)

    add = image

    def container(self, *names: str) -> None:
        self.containers.extend(names)

    def loaded_since(self, before: Sequence[str]) -> List[str]:
        """Register every image ID that is new compared to `before` (cli.image_ids())."""
        new = sorted(set(self.cli.image_ids()) - set(before))
        self.images.extend(new)
        return new

    def run(self) -> List[str]:
        """Remove everything registered; returns error messages (removal is best effort)."""
        errors = []
        if self.containers:
            proc = self.cli("rm", "-f", *self.containers, check=False)
            if proc.returncode != 0 and "No such container" not in proc.stderr:
                errors.append(proc.stderr.strip())
        for ref in reversed(self.images):
            proc = self.cli("rmi", "-f", ref, check=False)
            if proc.returncode != 0 and "No such image" not in proc.stderr:
                errors.append(proc.stderr.strip())
        self.images.clear()
        self.containers.clear()
        return errors
