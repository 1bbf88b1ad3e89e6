"""The Docker daemon adapter: the only module that imports docker (docker-py).

Everything the product asks of a local Docker goes through here: version and storage
facts, load, image inspection, inventory, save, and container runs.
"""

from typing import Any, Callable, Dict, FrozenSet, Iterable, List, Optional, Sequence, Tuple, Type

from ..errors import DaemonError, UsageError, one_line
from ..model import Digest
from ..nodeconfig import HUB, Mirror, NodeFile, RuntimePart
from .base import Debris, ImageInfo, RunProgram, RuntimeInfo, Traits, Unfinished, version_tuple


class _DockerTraits(Traits):
    def describe(self, facts: RuntimeInfo) -> str:
        return f"Docker {facts.version} (API {facts.api_version}) at {facts.host}"

    def storage(self, facts: RuntimeInfo) -> Tuple[str, str, str]:
        if facts.containerd_store:
            return "ok", (f"the containerd image store ({facts.driver} snapshotter) under {facts.root_dir}: image IDs "
                          "are manifest digests; imgtool confirms loads by them"), ""
        where = f"{facts.driver} under {facts.root_dir} (graphdriver image store)"
        if facts.driver == "devicemapper":
            return "warn", where, ("devicemapper limits each container to dm.basesize (10 GB by default), less than a "
                                   "vllm-ascend image: raise dm.basesize or move to overlay2")
        if facts.driver == "vfs":
            return "warn", where, ("vfs copies every layer in full: expect several times the unpacked size on disk; "
                                   "overlay2 is the usual choice")
        return "ok", where, ""

    def space_advice(self, facts: RuntimeInfo) -> str:
        return SPACE_ADVICE

    def staged_words(self, facts: RuntimeInfo) -> str:
        return f"the archive Docker unpacks into {facts.root_dir or 'its root'}/tmp before it registers the layers"


# how to make room where Docker keeps images, in its own tools' words (load.sh says the same: bundle/loadsh.py)
SPACE_ADVICE = "free space there (docker image prune, docker system df), or move Docker's data-root"
# Docker's graphdriver store unpacks the whole upload under <root>/tmp before it registers a layer
# (image/tarexport/load.go: every member, even of layers it holds); its containerd store keeps blobs instead
IMAGE_MOUNTS_API = (1, 48)  # Docker 28.0: `--mount type=image` (the containerd image store only)
TRAITS = _DockerTraits(
    title="Docker", load_command="docker load", zstd_since="23.0",
    zstd_symptom=" (older ones fail with `invalid tar header`, vllm-ascend FAQ 19)", staged_copies=1,
    run_program=RunProgram("docker", "Docker"),
    absent_advice="start it (systemctl start docker), check DOCKER_HOST, and run as root or a member of the docker group")


def connect(timeout: Optional[int] = 600, transport: Optional[str] = None, host: Optional[str] = None):
    """A client for the daemon at `host` (default: config's $DOCKER_HOST); raises DaemonError, UsageError.

    DOCKER_API_VERSION pins the API version, as it does for the docker CLI (1.39 is Docker 18.09's,
    Kylin V10's engine); by default the client speaks the daemon's own version. `transport` is
    "docker-py" or "http" (docker_http's stdlib client); by default docker-py where it runs
    (Python 3.9+, the floor of its requests/urllib3) and the stdlib client on older Pythons.
    """
    from .. import config

    host = host or config.docker_host()
    version = config.docker_api_version()
    tls = config.docker_tls()  # docker-py's TLS variables, read by config, handed to the transport
    if (transport or default_transport()) == "http":
        from . import docker_http

        try:
            client = docker_http.Client(host, version=version, timeout=timeout, tls=bool(tls.get("DOCKER_TLS_VERIFY")))
            client.ping()
            return client
        except docker_http.BadHost as e:
            hint = "use the daemon's unix socket, e.g. DOCKER_HOST=unix:///var/run/docker.sock"
            raise UsageError(str(e), hint=hint) from e
        except docker_http.ERRORS as e:
            raise unreachable(e, host) from e
    try:
        import docker
    except ImportError as e:  # pragma: no cover - only in a broken install
        raise DaemonError(f"the docker Python package is not available: {e}", hint="pip install docker") from e
    try:
        # docker-py reads these from `environment` in place of os.environ: the host given, TLS as configured
        client = docker.from_env(version=version, timeout=timeout, environment={**tls, "DOCKER_HOST": host})
        client.ping()
        return client
    except docker_errors() as e:  # DockerException, and requests/urllib3 connection errors that surface raw
        raise unreachable(e, host) from e


def default_transport() -> str:
    """"docker-py" where docker 7 and requests 2.32 run (Python 3.9+), else "http" (stdlib only)."""
    import sys

    return "docker-py" if sys.version_info >= (3, 9) else "http"


def docker_errors() -> Tuple[Type[BaseException], ...]:
    """What docker-py and the HTTP stack under it raise: the errors this room turns into DaemonError."""
    import requests
    from docker.errors import DockerException

    return (DockerException, requests.exceptions.RequestException, OSError)


def unreachable(e: BaseException, host: str) -> DaemonError:
    """The DaemonError for a failed connection to `host`, in words: where, and why (by the OS error's type)."""
    import socket

    cause = _os_error(e)
    where = f"cannot reach the Docker daemon at {host}"
    start = "start it (systemctl start docker)"
    if isinstance(cause, FileNotFoundError):
        return DaemonError(f"{where}: the socket does not exist (dockerd is not running)",
                           hint=f"{start}, or point DOCKER_HOST at the daemon's socket")
    if isinstance(cause, PermissionError):
        return DaemonError(f"{where}: permission denied",
                           hint="run as root, or as a member of the docker group (usermod -aG docker USER, "
                                "then log in again)")
    if isinstance(cause, ConnectionRefusedError):
        return DaemonError(f"{where}: connection refused (dockerd is not running or not listening there)",
                           hint=f"{start}, or point DOCKER_HOST at where it listens")
    if isinstance(cause, (socket.timeout, TimeoutError)) or "timed out" in type(e).__name__.lower():
        return DaemonError(f"{where}: no answer (timed out)",
                           hint="the daemon may be overloaded or hung: check systemctl status docker")
    if isinstance(cause, socket.gaierror):
        return DaemonError(f"{where}: unknown host", hint="check the host name in DOCKER_HOST")
    if cause is not None and cause.strerror:
        return DaemonError(f"{where}: {cause.strerror.lower()}",
                           hint=f"is dockerd running? {start}, and check DOCKER_HOST")
    return DaemonError(f"{where}: {one_line(e)}", hint=f"is dockerd running? {start}, and check DOCKER_HOST")


def _os_error(e: Optional[BaseException], depth: int = 0) -> Optional[OSError]:
    """The OSError at the bottom of requests/urllib3 wrapping (cause, context, args), if any."""
    if depth > 8 or e is None:
        return None
    if isinstance(e, OSError) and type(e).__module__ == "builtins":
        return e
    for inner in (e.__cause__, e.__context__, *[a for a in getattr(e, "args", ()) if isinstance(a, BaseException)]):
        found = _os_error(inner, depth + 1)
        if found is not None:
            return found
    if isinstance(e, OSError):
        return e
    return None


# --- images: facts, inspect, tag, load (imgtool load / doctor) -------------------


class Daemon:
    """The daemon operations `imgtool load` and `doctor` need; errors become DaemonError."""

    traits: Traits = TRAITS

    def __init__(self, client, host: Optional[str] = None):
        from . import docker_http

        self.client = client
        if host is None:  # a client made by connect() without a host speaks to config's $DOCKER_HOST
            from ..config import docker_host

            host = docker_host()
        self.host = host
        if isinstance(client, docker_http.Client):  # the same APIClient calls, over the stdlib
            self.api = client
            self.errors: Tuple[Type[BaseException], ...] = docker_http.ERRORS
            self.not_found: Tuple[Type[BaseException], ...] = (docker_http.NotFound,)
            self.api_error: Type[BaseException] = docker_http.APIError
        else:
            from docker.errors import APIError, NotFound  # ImageNotFound is a NotFound

            self.api = client.api
            self.errors = docker_errors()
            self.not_found = (NotFound,)
            self.api_error = APIError

    def close(self) -> None:
        try:
            self.client.close()
        except self.errors:
            pass

    def __enter__(self) -> "Daemon":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def info(self) -> RuntimeInfo:
        """Version, storage driver, root dir and architecture of the daemon; raises DaemonError."""
        from ..model import Platform

        try:
            version = self.api.version()
            info = self.api.info()
        except self.errors as e:
            raise DaemonError(f"cannot read the Docker daemon's version and info: {one_line(e)}") from e
        host = self.host
        arch = Platform.from_json({"architecture": info.get("Architecture") or version.get("Arch") or ""}).architecture
        status = {tuple(pair)[0]: tuple(pair)[1] for pair in (info.get("DriverStatus") or []) if len(pair) == 2}
        store = "containerd" if status.get("driver-type") == "io.containerd.snapshotter.v1" else "graphdriver"
        return RuntimeInfo(
            traits=TRAITS,
            host=host,
            version=str(version.get("Version") or info.get("ServerVersion") or "unknown"),
            api_version=str(version.get("ApiVersion") or ""),
            driver=str(info.get("Driver") or "unknown"),
            root_dir=str(info.get("DockerRootDir") or ""),
            arch=arch,
            os=str(info.get("OSType") or version.get("Os") or "linux"),
            local=host.startswith("unix://"),
            image_store=store,
        )

    def image_info(self, ref: str) -> Optional[ImageInfo]:
        """The image with this ID or name, or None when the daemon does not have it; raises DaemonError."""
        try:
            d = self.api.inspect_image(ref)
        except self.not_found:
            return None
        except self.errors as e:
            raise DaemonError(f"cannot inspect image {ref}: {one_line(e)}") from e
        return ImageInfo(str(d.get("Id") or ""), tuple(d.get("RepoTags") or ()), str(d.get("Os") or ""),
                         str(d.get("Architecture") or ""), d.get("Variant") or None, int(d.get("Size") or 0))

    def images_by_id(self) -> Dict[str, ImageInfo]:
        """Every image the daemon lists, by ID, from one request: IDs, tags and sizes (no platform: an
        ImageInfo from here has empty os/architecture). For bundles of many images, where one inspect per
        image is what takes the time; raises DaemonError."""
        try:
            listed = self.api.images(all=True)
        except self.errors as e:
            raise DaemonError(f"cannot list the daemon's images: {one_line(e)}") from e
        out = {}
        for entry in listed:
            image_id = str(entry.get("Id") or "")
            tags = tuple(t for t in (entry.get("RepoTags") or ()) if t != "<none>:<none>")
            out[image_id] = ImageInfo(image_id, tags, "", "", None, int(entry.get("Size") or 0))
        return out

    def inventory(self) -> list:
        """Every image the daemon holds (intermediate ones too) with its layers: [delta.InventoryImage].

        Raises DaemonError. An image removed while this runs is skipped.
        """
        from ..delta import InventoryImage
        from ..model import Digest

        try:
            listed = self.api.images(all=True)
        except self.errors as e:
            raise DaemonError(f"cannot list the daemon's images: {one_line(e)}") from e
        out = []
        for entry in listed:
            image_id = str(entry.get("Id") or "")
            try:
                d = self.api.inspect_image(image_id)
            except self.not_found:
                continue
            except self.errors as e:
                raise DaemonError(f"cannot inspect image {image_id[:19]}: {one_line(e)}") from e
            layers = ((d.get("RootFS") or {}).get("Layers")) or []
            try:
                diff_ids = tuple(Digest.parse(x) for x in layers)
            except (UsageError, TypeError, AttributeError):
                continue  # not a sha256 layer list (very old images): nothing a bundle can build on
            tags = tuple(t for t in (d.get("RepoTags") or ()) if t != "<none>:<none>")
            platform = "/".join(p for p in (d.get("Os"), d.get("Architecture"), d.get("Variant")) if p)
            out.append(InventoryImage(image_id, tags, platform, diff_ids))
        return out

    def remove_image(self, image_id: str) -> None:
        """Remove an image and every name it carries (docker rmi -f ID); raises DaemonError."""
        try:
            self.api.remove_image(image_id, force=True)
        except self.not_found:
            pass
        except self.errors as e:
            raise DaemonError(f"cannot remove image {image_id[:19]}: {one_line(e)}") from e

    def incomplete(self, image_id: str, diff_ids: Sequence[str]) -> Optional[Unfinished]:
        """None: Docker records an image only once its layers are in place."""
        return None

    def finish(self, image_id: str) -> None:
        """Nothing to finish: see incomplete."""

    def debris(self) -> List[Debris]:
        """None: an interrupted `docker load` leaves nothing imgtool made (dockerd cleans its own tmp)."""
        return []

    def remove_debris(self) -> List[str]:
        """Nothing: see debris."""
        return []

    def left_behind(self) -> str:
        """Nothing: dockerd registers nothing of an upload it did not receive whole."""
        return ""

    def pin(self, image_id: str) -> bool:
        """False: Docker has no kubelet image GC to keep the image from (a kubelet on cri-dockerd pins by its own
        flags only)."""
        return False

    def held_blobs(self, digests: Iterable[Digest]) -> FrozenSet[Digest]:
        """None: Docker keeps no blob by its digest that an archive could leave out (traits.reuses_blobs)."""
        return frozenset()

    def blob_head(self, digest: str, limit: int) -> Optional[bytes]:
        """None: Docker keeps no manifest's layers as blobs (inventory reads no modelcar's files here)."""
        return None

    def applied_diff_ids(self, image_id: str) -> Optional[List[str]]:
        """None: Docker checks every layer against its diff_id itself while it loads."""
        return None

    def stored_name(self, name: str) -> str:
        """How Docker shows a name it was given: docker.io/library/x:1 as x:1."""
        from ..model import familiar

        return familiar(name)

    def tag(self, image_id: str, name: str) -> None:
        """Tag an image `repo:tag`; raises DaemonError."""
        repo, _, tag = name.rpartition(":")
        if not repo or "/" in tag:
            repo, tag = name, "latest"
        try:
            self.api.tag(image_id, repo, tag, force=True)
        except self.errors as e:
            raise DaemonError(f"cannot tag {image_id[:19]} as {name}: {one_line(e)}") from e

    def load_archive(self, chunks: Iterable[bytes], platforms: Tuple[str, ...] = (),
                     on_message: Optional[Callable[[dict], None]] = None,
                     images: Sequence[Tuple[str, str]] = ()) -> List[str]:
        """POST a tar stream (an iterable of chunks, sent chunked: never held in memory) to /images/load.

        `platforms` and `images` are ignored: Docker loads every image the archive's manifest.json lists, and
        registers nothing of an upload it did not receive whole.
        Reads the whole answer: an `errorDetail` is a failure even after HTTP 200. Returns the
        "Loaded image" lines. Raises DaemonError, or whatever the chunk iterable raised.
        """
        failure: Dict[str, BaseException] = {}

        def body():
            try:
                yield from chunks
            except BaseException as e:
                failure["error"] = e
                raise

        messages: List[str] = []
        try:
            for msg in self.api.load_image(body(), quiet=True):
                if not isinstance(msg, dict):
                    continue
                if msg.get("errorDetail") or msg.get("error"):
                    text = (msg.get("errorDetail") or {}).get("message") or msg.get("error") or "unknown error"
                    raise DaemonError(f"docker load failed: {one_line(text)}", hint=_load_hint(str(text)))
                if on_message is not None:
                    on_message(msg)
                text = str(msg.get("stream") or "").strip()
                if text:
                    messages.append(text)
        except DaemonError:
            raise
        except BaseException as e:
            if "error" in failure:
                raise failure["error"] from None  # the chunks' own error: its traceback is the story
            if not isinstance(e, self.errors):
                raise  # Ctrl-C, or a bug: not Docker's doing
            raise DaemonError(f"docker load failed: {one_line(e)}", hint=_load_hint(str(e))) from e
        if "error" in failure:
            raise failure["error"]
        return messages


    def inspect(self, ref: str) -> dict:
        """Docker's raw image inspect (Id, RepoTags, RootFS, Architecture...); raises DaemonError."""
        info = self.image_info(ref)
        if info is None:
            from ..errors import UsageError

            raise UsageError(f"image {ref} is not in the local Docker", hint="check `docker images`")
        try:
            return self.api.inspect_image(ref)
        except self.errors as e:
            raise DaemonError(f"cannot inspect image {ref}: {one_line(e)}") from e

    def save(self, ref: str, chunk_size: int = 4 * 1024 * 1024) -> Iterable[bytes]:
        """`docker save REF` as a stream of chunks (never held whole); raises DaemonError."""
        try:
            stream = self.api.get_image(ref, chunk_size=chunk_size)
        except self.errors as e:
            raise DaemonError(f"docker save {ref} failed: {one_line(e)}") from e

        def chunks():
            sent = 0
            try:
                for chunk in stream:
                    sent += len(chunk)
                    yield chunk
            except self.errors as e:
                from ..model import format_size

                why = "Docker's answer was cut short" if _cut_short(e) else one_line(e)
                raise DaemonError(f"docker save {ref} failed after {format_size(sent)}: {why}",
                                  hint="check the daemon's log (journalctl -u docker), then export again") from e

        return chunks()


    def local_tags(self, repository: str) -> list:
        """Tags of `repository` present in this daemon, sorted; raises DaemonError."""
        from ..model import familiar

        try:
            images = self.api.images(name=repository)
        except self.errors as e:
            raise DaemonError(f"cannot list images of {repository}: {one_line(e)}") from e
        wanted = familiar(repository)
        tags = set()
        for image in images:
            for ref in image.get("RepoTags") or []:
                name, _, tag = ref.rpartition(":")
                if name and familiar(name) == wanted:
                    tags.add(tag)
        return sorted(tags)

    def mounts_images(self) -> bool:
        """Whether `--mount type=image` works here: Docker 28.0 (API 1.48) with the containerd image store (the
        graphdriver store cannot mount an image). Raises DaemonError."""
        facts = self.info()
        return facts.containerd_store and version_tuple(facts.api_version) >= IMAGE_MOUNTS_API

    def has_image(self, ref: str) -> bool:
        """Whether the daemon holds an image by this name; raises DaemonError."""
        return self.image_info(ref) is not None

    def arch_warning(self, ref: str) -> Optional[str]:
        """The warning `load` gives when the local image `ref` is for another architecture than this
        Docker's; None when it fits or is not loaded. Raises DaemonError."""
        from ..model import foreign_arch_warning

        image = self.image_info(ref)
        if image is None or not image.architecture:
            return None
        return foreign_arch_warning(ref, image.platform, self.info().arch)

    def run_container(self, spec, argv_for: Optional[Callable[[bool], List[str]]] = None) -> tuple:
        """Start `spec` (a presets.RunSpec) and follow it: (exit code or 0 when detached, container).

        The image must already be loaded: an offline host must never start a pull. Output is
        streamed as it comes; with a terminal on both ends the session is interactive. On
        Ctrl-C the container is stopped (and removed unless --no-rm). `argv_for` is not needed: Docker is
        asked through its API, not a command line. Raises DaemonError, or UsageError when the image is not loaded.
        """
        import sys

        if self.image_info(spec.image) is None:
            raise UsageError(f"image {spec.image} is not loaded in this Docker daemon",
                             hint="load it first (imgtool load BUNDLE_DIR), or check the name with `docker images`")
        interactive = bool(spec.interactive and not spec.detach and sys.stdin.isatty() and sys.stdout.isatty())
        tty = interactive or spec.detach  # detached like `docker run -itd`: a shell CMD stays up
        cid = self._create_container(spec, tty)
        name = spec.name or cid[:12]
        started = False
        try:
            if spec.detach:
                _start(self.api, cid, spec, self.api_error)
                started = True
                return 0, name
            if interactive:
                code = _run_interactive(self.api, cid, spec, self.errors, self.api_error)
            else:
                code = self._follow(cid, spec)
            return int(code), name
        finally:
            if spec.remove and not (spec.detach and started):
                self._remove_container(cid)

    def _create_container(self, spec, tty: bool) -> str:
        """Create (not start) `spec`'s container; its ID. Raises DaemonError in the words of explain_run_error."""
        ports = {f"{p.container}/{p.proto}": ((p.host_ip, p.host) if p.host_ip else p.host) for p in spec.ports}
        try:
            host_config = self.api.create_host_config(
                binds=[m.spec for m in spec.mounts],
                devices=[f"{d}:{d}:rwm" for d in spec.device_paths],
                shm_size=spec.shm_size,
                network_mode=spec.network,
                port_bindings=ports or None,
                privileged=spec.privileged,
                # foreground runs are removed by us after the exit code is read; the daemon's
                # auto-remove could delete the container before `wait` sees it
                auto_remove=spec.remove and spec.detach,
            )
            model = getattr(spec, "model", None)
            if model is not None and model.image is not None:  # `--mount type=image`, as the API says it (1.48+)
                host_config.setdefault("Mounts", []).append(
                    {"Type": "image", "Source": model.image, "Target": model.image_target, "ReadOnly": True})
            created = self.api.create_container(
                spec.image, command=list(spec.command) or None, name=spec.name,
                environment=[f"{k}={v}" for k, v in spec.env], host_config=host_config,
                ports=[(p.container, p.proto) for p in spec.ports] or None,
                tty=tty, stdin_open=tty, detach=spec.detach,
            )
        except self.api_error as e:
            raise explain_run_error(_api_text(e), spec) from e
        return created["Id"]

    def _follow(self, cid: str, spec) -> int:
        """Attach, start, copy the container's stdout and stderr to ours until it ends; its exit code."""
        import sys

        # the API client is opened with no read timeout (open_daemon(None)): output may pause for hours;
        # logs=False: dockerd subscribes to the streams before it answers the attach, so
        # nothing is missed; a log replay on top could send early output twice
        stream = self.api.attach(cid, stdout=True, stderr=True, stream=True, logs=False, demux=True)
        _start(self.api, cid, spec, self.api_error)
        with _stop_on_signals(self.api, cid, self.errors):
            for out, err in stream:
                for data, to in ((out, sys.stdout), (err, sys.stderr)):
                    if data:
                        to.buffer.write(data)
                        to.buffer.flush()
            return self.api.wait(cid).get("StatusCode", 1)

    def _remove_container(self, cid: str) -> None:
        """Remove a foreground run's container (or one that never started); gone already is fine."""
        try:
            self.api.remove_container(cid, force=True)
        except (*self.not_found, self.api_error):
            pass


def _cut_short(e: BaseException) -> bool:
    """Whether `e` (or what it wraps) says the daemon's HTTP answer ended before its end: the connection broke or
    the daemon went away mid-stream (docker-py: ChunkedEncodingError, urllib3's ProtocolError; the stdlib client:
    http.client.IncompleteRead)."""
    at: Optional[BaseException] = e
    for _ in range(8):  # a chain of wrapped errors, never a cycle's worth
        if at is None:
            break
        wrapped = [a for a in getattr(at, "args", ()) if isinstance(a, BaseException)]
        if {type(x).__name__ for x in [at, *wrapped]} & {"ChunkedEncodingError", "ProtocolError", "IncompleteRead"}:
            return True
        at = at.__cause__ or at.__context__
    return False


def _load_hint(text: str) -> Optional[str]:
    low = text.lower()
    if "invalid tar header" in low:
        return ("vllm-ascend FAQ 19: this Docker read a zstd-compressed layer as a plain tar (Docker reads zstd "
                "only from 23.0 on); upgrade Docker, or bring the image with gzip layers (imgtool fetch --layers compat, the "
                "default)")
    if "no space left" in low:
        return "free space under Docker's root dir (docker info: Docker Root Dir), then load again"
    return None


def open_daemon(timeout: Optional[int] = 3600, host: Optional[str] = None) -> "Daemon":
    """A Daemon for the daemon at `host` (default: config's $DOCKER_HOST; long read timeout: a big load
    is quiet for minutes; None: no read timeout, for following a container); raises DaemonError,
    UsageError. Use it as a context manager."""
    if host is None:
        from ..config import docker_host

        host = docker_host()
    return Daemon(connect(timeout=timeout, host=host), host)


def _api_text(e) -> str:
    return " ".join(str(getattr(e, "explanation", None) or e).split())


def _start(api, cid, spec, APIError) -> None:  # noqa: N803 - the transport's error class
    try:
        api.start(cid)
    except APIError as e:
        raise explain_run_error(_api_text(e), spec) from e


def explain_run_error(text: str, spec) -> DaemonError:
    """The DaemonError for Docker refusing to create or start `spec`'s container."""
    short = text if len(text) <= 300 else text[:297] + "..."
    low = text.lower()
    if "operation not permitted" in low and not spec.privileged:
        return DaemonError(
            f"Docker refused to start the container: operation not permitted (with --shm-size={spec.shm_size_text}): "
            f"{short}",
            hint=("this is vllm-ascend FAQ 20: the runtime here will not give an unprivileged container that /dev/shm. "
                  "Try a smaller --shm-size; or, only for an image you trust, add --privileged yourself "
                  "(it grants every host device and capability); imgtool never adds it on its own"))
    if "conflict" in low and "already in use" in low:
        return DaemonError(f"a container named {spec.name} already exists",
                           hint=f"pass --name NEW_NAME, or remove the old one: docker rm -f {spec.name}")
    return DaemonError(f"Docker refused to start the container: {short}")


class _stop_on_signals:
    """Ctrl-C or SIGTERM while following a container: stop it (10 s grace), then re-raise."""

    def __init__(self, api, cid, errors: tuple):
        self.api, self.cid, self.errors = api, cid, errors
        self.old: Any = None  # the SIGTERM handler to put back, as signal.signal returned it

    def __enter__(self):
        import signal
        import threading

        if threading.current_thread() is threading.main_thread():
            def on_term(signum, frame):
                raise KeyboardInterrupt

            self.old = signal.signal(signal.SIGTERM, on_term)
        return self

    def __exit__(self, kind, value, tb):
        import signal

        if self.old is not None:
            signal.signal(signal.SIGTERM, self.old)
        if kind is KeyboardInterrupt:
            try:
                self.api.stop(self.cid, timeout=10)
            except self.errors:
                pass
        return False


def _run_interactive(api, cid, spec, errors: tuple, APIError) -> int:  # noqa: N803
    """`docker run -it`: the terminal in raw mode, bytes pumped both ways, resized with the window."""
    import os
    import select
    import signal
    import sys
    import termios
    import tty

    sock = api.attach_socket(cid, params={"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1, "logs": 0})
    raw = getattr(sock, "_sock", sock)
    raw.settimeout(None)
    _start(api, cid, spec, APIError)
    in_fd, out_fd = sys.stdin.fileno(), sys.stdout.fileno()

    def resize(*_):
        try:
            cols, rows = os.get_terminal_size(out_fd)
            api.resize(cid, height=rows, width=cols)
        except errors:
            pass  # the container may already be gone

    resize()
    old_winch = signal.signal(signal.SIGWINCH, resize)
    saved = termios.tcgetattr(in_fd)
    tty.setraw(in_fd)
    try:
        watch = [raw, in_fd]
        while True:
            ready, _, _ = select.select(watch, [], [])
            if raw in ready:
                data = raw.recv(65536)
                if not data:
                    break
                os.write(out_fd, data)
            if in_fd in ready:
                data = os.read(in_fd, 65536)
                if data:
                    raw.sendall(data)
                else:
                    watch = [raw]
    finally:
        termios.tcsetattr(in_fd, termios.TCSADRAIN, saved)
        signal.signal(signal.SIGWINCH, old_winch)
        try:
            sock.close()
        except errors:
            pass
    return api.wait(cid).get("StatusCode", 1)


# --- what a node's Docker needs to pull from `imgtool serve` (nodeconfig.py asks each room) ----------------------

DAEMON_JSON = "/etc/docker/daemon.json"


def mirror_part(mirror: Mirror) -> RuntimePart:
    """daemon.json's registry-mirrors (Docker Hub only) and insecure-registries, to merge; the CA under TLS; for
    other registries, the pull-and-tag Docker needs instead."""
    import json

    daemon: dict = {}
    if HUB in mirror.registries:
        daemon["registry-mirrors"] = [mirror.url]
    if not mirror.tls:
        daemon["insecure-registries"] = [mirror.address]
    files = [NodeFile(DAEMON_JSON, json.dumps(daemon, indent=2) + "\n", merge=True)] if daemon else []
    ca_path = f"/etc/docker/certs.d/{mirror.address}/ca.crt"
    if mirror.tls and mirror.ca_pem is not None:
        files.append(NodeFile(ca_path, mirror.ca_pem))
    notes = []
    others = [(r, path) for r, path in mirror.images if r != HUB]
    if others:
        registry, path = others[0]
        notes.append("registry-mirrors mirrors Docker Hub only: Docker cannot mirror "
                     f"{', '.join(r for r in mirror.registries if r != HUB)}. Pull through this address by name instead "
                     "(serve answers the path without the registry), then give it the upstream name:")
        notes.append(f"  docker pull {mirror.address}/{path} && docker tag {mirror.address}/{path} {registry}/{path}")
    if HUB in mirror.registries:
        notes.append("Docker Hub images (docker.io) keep their names through registry-mirrors")
    if not mirror.tls:
        notes.append("plain HTTP needs insecure-registries (without it Docker speaks plain HTTP to 127.0.0.0/8 only)")
    return RuntimePart("docker", "Docker", tuple(files), tuple(notes), ca_path)
