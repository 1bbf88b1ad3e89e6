"""`imgtool run --runtime podman`: the rendered `podman run` run as a program, and what `run` and
`run-flags` ask of Podman first (the local tags of an image, whether an image or a container name
exists, an image's platform against the host's).

Podman has no daemon to talk to: `podman` is run as a program, with a timeout on every call but
the container's own run, which lasts as long as the user wants it to (Ctrl-C and SIGTERM stop it,
as the Docker path does). Decisions are made on exit status, never on podman's words. Python 3.7:
imgtool.pyz runs `run` on Kylin's python3. To be folded into the Podman room (podman.py).
"""

import json
import os
import subprocess
import sys
from dataclasses import replace
from typing import TYPE_CHECKING, List, Optional, Tuple

from .errors import DaemonError, ImgtoolError, UsageError, one_line
from .model import familiar, foreign_arch_warning
from .presets.run import render_argv

if TYPE_CHECKING:
    from .presets.run import RunSpec

PODMAN = "podman"  # found through PATH, as a shell would
QUERY_TIMEOUT = 60.0  # `podman images`, `image exists`, `info`: a few hundred ms on a busy host
START_TIMEOUT = 600.0  # `podman run -d` returns once the container is created and started
STOP_GRACE = 10  # seconds `podman stop` gives the container before SIGKILL, as the Docker path does
INSTALL_HINT = ("install Podman (dnf install podman; Debian/Ubuntu: apt-get install podman), "
                "or run with --runtime docker")


def cannot_run(e: OSError) -> DaemonError:
    """The DaemonError for a podman that cannot be started (by the OS error's type)."""
    if isinstance(e, FileNotFoundError):
        return DaemonError("cannot run podman: it is not installed here (no podman in PATH)", hint=INSTALL_HINT)
    if isinstance(e, PermissionError):
        return DaemonError("cannot run podman: permission denied", hint="check the podman found in PATH")
    return DaemonError(f"cannot run podman: {(e.strerror or str(e)).lower()}", hint=INSTALL_HINT)


def _podman(args: List[str], timeout: float) -> "subprocess.CompletedProcess[bytes]":
    """podman ARGS with its output captured; raises DaemonError when it cannot run or does not finish."""
    try:
        return subprocess.run([PODMAN] + args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise DaemonError(f"podman {args[0]} did not finish within {timeout:.0f} s",
                          hint="check podman on this host: podman info") from None
    except OSError as e:
        raise cannot_run(e) from e


def _failed(args: List[str], result: "subprocess.CompletedProcess[bytes]") -> DaemonError:
    words = " ".join(a for a in args[:2] if not a.startswith("-"))
    return DaemonError(f"podman {words} failed (exit {result.returncode}): "
                       f"{one_line(result.stderr.decode('utf-8', 'replace')) or 'no message'}")


def _query(args: List[str], timeout: float = QUERY_TIMEOUT) -> bytes:
    """podman ARGS' stdout; raises DaemonError unless it exits 0."""
    result = _podman(args, timeout)
    if result.returncode != 0:
        raise _failed(args, result)
    return result.stdout


def _exists(args: List[str]) -> bool:
    """`podman image exists` / `container exists`: exit 0 yes, 1 no; raises DaemonError otherwise."""
    result = _podman(args, QUERY_TIMEOUT)
    if result.returncode not in (0, 1):
        raise _failed(args, result)
    return result.returncode == 0


def local_tags(repository: str, timeout: float = QUERY_TIMEOUT) -> list:
    """Tags of `repository` in Podman's local storage, sorted; raises DaemonError."""
    try:
        images = json.loads(_query(["images", "--format", "json"], timeout) or b"[]")
    except ValueError as e:
        raise DaemonError(f"podman images printed no JSON: {one_line(e)}") from e
    wanted = familiar(repository)
    tags = set()
    for image in images if isinstance(images, list) else []:
        for ref in (image.get("Names") or []) if isinstance(image, dict) else []:
            name, _, tag = str(ref).rpartition(":")
            if name and "/" not in tag and familiar(name) == wanted:
                tags.add(tag)
    return sorted(tags)


def arch_warning(ref: str, timeout: float = QUERY_TIMEOUT) -> Optional[str]:
    """The warning `run-flags`/`run` give when the local image `ref` is for another architecture than
    this host's podman; None when it fits or is not there. Raises DaemonError."""
    if not _exists(["image", "exists", ref]):
        return None
    try:
        found = json.loads(_query(["image", "inspect", "--format", "json", ref], timeout))
        image = found[0]
        host_arch = json.loads(_query(["info", "--format", "json"], timeout))["host"]["arch"]
    except (ValueError, LookupError, TypeError) as e:
        raise DaemonError(f"podman printed JSON imgtool cannot read: {one_line(e)}") from e
    if not image.get("Architecture"):
        return None
    platform = "/".join(p for p in (image.get("Os"), image.get("Architecture"), image.get("Variant")) if p)
    return foreign_arch_warning(ref, platform, host_arch, host="Podman")


def run_container(spec: "RunSpec") -> Tuple[int, str]:
    """Start `spec` with `podman run` and follow it: (its exit code, or 0 when detached; the container).

    The image must already be in Podman's storage (imgtool never pulls; the command says
    --pull=never too). Foreground: the terminal is podman's, so a session on a terminal is
    `podman run -it`, and podman's exit code is returned (the container's, or 125 when podman
    itself failed, after its `Error:` line). Raises UsageError when the image is not there,
    DaemonError when podman cannot run or refuses, ImgtoolError when a cache directory cannot be made.
    """
    if not _exists(["image", "exists", spec.image]):
        raise UsageError(f"image {spec.image} is not loaded in Podman",
                         hint="load it first (imgtool load BUNDLE_DIR), or check the name with `podman images`")
    if spec.name and _exists(["container", "exists", spec.name]):
        raise DaemonError(f"a container named {spec.name} already exists",
                          hint=f"pass --name NEW_NAME, or remove the old one: podman rm -f {spec.name}")
    _make_cache_dirs(spec)
    interactive = bool(spec.interactive and not spec.detach and sys.stdin.isatty() and sys.stdout.isatty())
    argv = render_argv(replace(spec, interactive=interactive))
    if spec.detach:
        result = _podman(argv[1:], START_TIMEOUT)
        if result.returncode != 0:
            raise DaemonError("Podman refused to start the container: "
                              f"{one_line(result.stderr.decode('utf-8', 'replace')) or 'no message'}")
        return 0, spec.name or result.stdout.decode("ascii", "replace").strip()[:12]
    return _follow(argv, spec.name), spec.name or ""


def _make_cache_dirs(spec: "RunSpec") -> None:
    """The preset's own directories (`create`: /root/.cache), made when absent: Docker makes a missing
    bind-mount source, podman refuses with `statfs ...: no such file or directory`."""
    for mount in spec.mounts:
        if mount.create and not os.path.lexists(mount.host):
            try:
                os.makedirs(mount.host, exist_ok=True)
            except OSError as e:
                raise ImgtoolError(f"cannot create {mount.host} for the container: {(e.strerror or str(e)).lower()}",
                                   hint=f"create it yourself (mkdir -p {mount.host}), or run as root") from e


def _follow(argv: List[str], name: Optional[str]) -> int:
    """podman run in the foreground with our stdin, stdout and stderr; its exit code. On Ctrl-C or
    SIGTERM the container is stopped (STOP_GRACE), podman is waited for, and KeyboardInterrupt re-raised."""
    import signal
    import threading

    sys.stdout.flush()
    sys.stderr.flush()
    try:
        proc = subprocess.Popen(argv)
    except OSError as e:
        raise cannot_run(e) from e
    old = None
    if threading.current_thread() is threading.main_thread():
        def on_term(signum, frame):
            raise KeyboardInterrupt

        old = signal.signal(signal.SIGTERM, on_term)
    try:
        return proc.wait()  # no timeout: the container runs as long as its user wants
    except KeyboardInterrupt:
        _stop(proc, name)
        raise
    finally:
        if old is not None:
            signal.signal(signal.SIGTERM, old)


def _stop(proc: "subprocess.Popen[bytes]", name: Optional[str]) -> None:
    """Stop the container of a foreground `podman run` (by name; else podman itself), then wait for podman."""
    try:
        if name:
            _podman(["stop", "-t", str(STOP_GRACE), name], STOP_GRACE + QUERY_TIMEOUT)
        else:
            proc.terminate()  # podman passes the signal on to the container (--sig-proxy)
        proc.wait(timeout=STOP_GRACE + QUERY_TIMEOUT)
    except (DaemonError, subprocess.TimeoutExpired):
        proc.kill()
        proc.wait()
