"""The Docker Engine API over the standard library, for Pythons that docker-py no longer runs on.

Kylin V10's python3 is 3.7; docker 7 / requests 2.32 / urllib3 2 need 3.8+. imgtool.pyz runs
its offline verbs there, so docker.py (the one Docker room, the only user of this module) talks
to dockerd through this small client when docker-py cannot be imported. It offers the subset
of docker-py's `APIClient` that docker.py calls, with the same names and arguments, so both
transports go through the same `Daemon` methods. Unix sockets and plain tcp:// only.
"""

import http.client
import json
import socket
from typing import Any, Dict, Iterable, Iterator, List, Optional
from urllib.parse import quote, urlencode

DEFAULT_HOST = "unix:///var/run/docker.sock"
MAX_JSON = 64 * 1024 * 1024  # an inventory of thousands of images stays far below this


class APIError(Exception):
    """Docker answered with an error status."""

    def __init__(self, status: int, explanation: str):
        super().__init__(f"{status} {explanation}")
        self.status_code = status
        self.explanation = explanation


class NotFound(APIError):
    """404: no such image or container."""


class BadHost(ValueError):
    """DOCKER_HOST names something this client cannot speak to (TLS, ssh://)."""


ERRORS = (APIError, OSError, http.client.HTTPException, ValueError)


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: Optional[float]):
        super().__init__("localhost", timeout=timeout)
        self.socket_path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.socket_path)
        except BaseException:
            sock.close()
            raise
        self.sock = sock


class Client:
    """docker-py's APIClient, the part imgtool uses, over http.client. Methods raise ERRORS."""

    def __init__(self, host: str = DEFAULT_HOST, version: str = "auto", timeout: Optional[float] = 600,
                 tls: bool = False):
        """`host`: unix:// or tcp://, as DOCKER_HOST names it; `tls`: DOCKER_TLS_VERIFY is set (refused:
        this client speaks plain tcp:// only). The caller reads both from the environment."""
        self.host = host
        self.timeout = timeout
        self._unix: Optional[str]  # the socket's path, or None for tcp://
        if self.host.startswith("unix://"):
            self._unix = self.host[len("unix://"):]
        elif self.host.startswith("tcp://") and not tls:
            self._unix = None
            hostport = self.host[len("tcp://"):].rstrip("/")
            name, _, port = hostport.rpartition(":")
            self._tcp = (name or hostport, int(port) if name and port else 2375)
        else:
            raise BadHost(f"DOCKER_HOST {self.host}: on this Python imgtool speaks to Docker over unix:// "
                             "or plain tcp:// only")
        self.api_version = None if version == "auto" else version
        if self.api_version is None:
            self.api_version = str(self._request("GET", "/version", versioned=False).get("ApiVersion") or "1.24")

    # --- plumbing ---------------------------------------------------------------

    def _connection(self, timeout: Optional[float] = -1) -> http.client.HTTPConnection:
        t = self.timeout if timeout == -1 else timeout
        if self._unix is not None:
            return _UnixConnection(self._unix, t)
        return http.client.HTTPConnection(self._tcp[0], self._tcp[1], timeout=t)

    def _path(self, path: str, params: Optional[dict] = None, versioned: bool = True) -> str:
        url = (f"/v{self.api_version}" if versioned else "") + path
        if params:
            url += "?" + urlencode(params)
        return url

    def _send(self, method: str, path: str, params: Optional[dict] = None, body=None, headers=None,
              versioned: bool = True, timeout: Optional[float] = -1):
        """The open connection and its response (status checked); the caller closes the connection."""
        conn = self._connection(timeout)
        try:
            hdrs = {"Host": "docker"}
            hdrs.update(headers or {})
            if body is None or isinstance(body, bytes):
                conn.request(method, self._path(path, params, versioned), body=body, headers=hdrs)
            else:  # an iterable of chunks: sent with Transfer-Encoding: chunked, never held whole
                hdrs["Transfer-Encoding"] = "chunked"
                conn.request(method, self._path(path, params, versioned), body=body, headers=hdrs,
                             encode_chunked=True)
            resp = conn.getresponse()
            if resp.status >= 400:
                raw = _read_capped(resp, path)
                try:
                    text = str(json.loads(raw.decode("utf-8", "replace")).get("message") or "")
                except (ValueError, AttributeError):
                    text = raw.decode("utf-8", "replace").strip()
                kind = NotFound if resp.status == 404 else APIError
                raise kind(resp.status, text or resp.reason)
            return conn, resp
        except BaseException:
            conn.close()
            raise

    def _request(self, method: str, path: str, params: Optional[dict] = None, versioned: bool = True):
        conn, resp = self._send(method, path, params, versioned=versioned)
        try:
            raw = _read_capped(resp, path)
        finally:
            conn.close()
        return json.loads(raw.decode("utf-8")) if raw.strip() else None

    @staticmethod
    def _ref(name: str) -> str:
        return quote(name, safe="/:@")

    # --- what docker.py uses ------------------------------------------------------

    def ping(self) -> bool:
        conn, resp = self._send("GET", "/_ping", versioned=False)
        try:
            resp.read()
        finally:
            conn.close()
        return True

    def close(self) -> None:
        pass  # one connection per request, closed after it

    def version(self) -> dict:
        return self._request("GET", "/version")

    def info(self) -> dict:
        return self._request("GET", "/info")

    def inspect_image(self, ref: str) -> dict:
        return self._request("GET", f"/images/{self._ref(ref)}/json")

    def images(self, name: Optional[str] = None, all: bool = False) -> list:  # noqa: A002 - docker-py's name
        params = {"all": "1" if all else "0"}
        if name:
            params["filters"] = json.dumps({"reference": [name]})
        return self._request("GET", "/images/json", params) or []

    def remove_image(self, image: str, force: bool = False) -> None:
        self._request("DELETE", f"/images/{self._ref(image)}", {"force": "1" if force else "0", "noprune": "0"})

    def tag(self, image: str, repository: str, tag: Optional[str] = None, force: bool = False) -> bool:
        params = {"repo": repository, "force": "1" if force else "0"}
        if tag:
            params["tag"] = tag
        self._request("POST", f"/images/{self._ref(image)}/tag", params)
        return True

    def load_image(self, data: Iterable[bytes], quiet: bool = False) -> Iterator[dict]:
        """POST /images/load with `data` sent chunked; yields every JSON message of the answer."""
        conn, resp = self._send("POST", "/images/load", {"quiet": "1" if quiet else "0"}, body=data,
                                headers={"Content-Type": "application/x-tar"})
        try:
            yield from _json_stream(resp)
        finally:
            conn.close()

    def get_image(self, image: str, chunk_size: int = 2 * 1024 * 1024) -> Iterator[bytes]:
        """GET /images/{name}/get: `docker save` as a stream of chunks."""
        conn, resp = self._send("GET", f"/images/{self._ref(image)}/get")

        def chunks():
            try:
                while True:
                    chunk = resp.read(chunk_size)
                    if not chunk:
                        return
                    yield chunk
            finally:
                conn.close()

        return chunks()


    # --- containers (imgtool run) ---------------------------------------------------

    @staticmethod
    def create_host_config(binds=None, devices=None, shm_size=None, network_mode=None, port_bindings=None,
                           privileged=False, auto_remove=False) -> dict:
        """The HostConfig of POST /containers/create, from docker-py's keyword arguments."""
        config: Dict[str, Any] = {"Binds": list(binds or []), "Privileged": bool(privileged), "AutoRemove": bool(auto_remove)}
        if devices:
            config["Devices"] = []
            for device in devices:
                host, _, rest = device.partition(":")
                inside, _, perms = rest.partition(":")
                config["Devices"].append({"PathOnHost": host, "PathInContainer": inside or host,
                                          "CgroupPermissions": perms or "rwm"})
        if shm_size is not None:
            config["ShmSize"] = int(shm_size)
        if network_mode:
            config["NetworkMode"] = network_mode
        if port_bindings:
            config["PortBindings"] = {}
            for port, target in port_bindings.items():
                host_ip, host_port = target if isinstance(target, tuple) else ("", target)
                config["PortBindings"][port] = [{"HostIp": host_ip, "HostPort": str(host_port)}]
        return config

    def create_container(self, image: str, command=None, name: Optional[str] = None, environment=None,
                         host_config: Optional[dict] = None, ports=None, tty: bool = False, stdin_open: bool = False,
                         detach: bool = False) -> dict:
        body = {"Image": image, "Cmd": command, "Env": list(environment or []), "HostConfig": host_config or {},
                "Tty": tty, "OpenStdin": stdin_open, "StdinOnce": stdin_open and not detach,
                "AttachStdin": stdin_open and not detach, "AttachStdout": not detach, "AttachStderr": not detach}
        if ports:
            body["ExposedPorts"] = {f"{port}/{proto}": {} for port, proto in ports}
        params = {"name": name} if name else None
        return self._json("POST", "/containers/create", params, body)

    def start(self, container: str) -> None:
        self._request("POST", f"/containers/{container}/start")

    def wait(self, container: str) -> dict:
        conn, resp = self._send("POST", f"/containers/{container}/wait", timeout=None)
        try:
            return json.loads(_read_capped(resp, "/wait").decode("utf-8"))
        finally:
            conn.close()

    def stop(self, container: str, timeout: int = 10) -> None:
        conn, resp = self._send("POST", f"/containers/{container}/stop", {"t": str(timeout)}, timeout=timeout + 60)
        try:
            resp.read()
        finally:
            conn.close()

    def remove_container(self, container: str, force: bool = False) -> None:
        self._request("DELETE", f"/containers/{container}", {"force": "1" if force else "0", "v": "0"})

    def resize(self, container: str, height: int, width: int) -> None:
        self._request("POST", f"/containers/{container}/resize", {"h": str(height), "w": str(width)})

    def attach(self, container: str, stdout: bool = True, stderr: bool = True, stream: bool = True,
               logs: bool = False, demux: bool = True) -> Iterator[tuple]:
        """The container's output as (stdout bytes or None, stderr bytes or None), from the
        multiplexed stream of a container without a TTY."""
        params = {"stdout": int(stdout), "stderr": int(stderr), "stream": int(stream), "logs": int(logs)}
        # no Upgrade header: http.client would take a 101 answer as bodiless; a 200 is read to EOF
        conn, resp = self._send("POST", f"/containers/{container}/attach", {k: str(v) for k, v in params.items()},
                                timeout=None)

        def frames():
            try:
                while True:
                    head = _read_exact(resp, 8)
                    if len(head) < 8:
                        return
                    size = int.from_bytes(head[4:8], "big")
                    data = _read_exact(resp, size)
                    yield (data, None) if head[0] != 2 else (None, data)
            finally:
                conn.close()

        return frames()

    def attach_socket(self, container: str, params: Optional[dict] = None) -> socket.socket:
        """A raw socket to the container's terminal (POST .../attach with an upgrade to tcp)."""
        conn = self._connection(None)
        conn.connect()
        sock = conn.sock
        query = urlencode({k: str(v) for k, v in (params or {}).items()})
        request = (f"POST {self._path(f'/containers/{container}/attach')}?{query} HTTP/1.1\r\nHost: docker\r\n"
                   "Connection: Upgrade\r\nUpgrade: tcp\r\nContent-Length: 0\r\n\r\n")
        sock.sendall(request.encode("ascii"))
        head = b""
        while b"\r\n\r\n" not in head:
            byte = sock.recv(1)
            if not byte:
                sock.close()
                raise http.client.RemoteDisconnected("Docker closed the attach connection")
            head += byte
        status = int(head.split(b" ", 2)[1])
        if status not in (101, 200):
            sock.close()
            raise APIError(status, head.decode("latin-1").splitlines()[0])
        return sock

    def _json(self, method: str, path: str, params: Optional[dict], body: dict):
        conn, resp = self._send(method, path, params, body=json.dumps(body).encode(),
                                headers={"Content-Type": "application/json"})
        try:
            return json.loads(_read_capped(resp, path).decode("utf-8"))
        finally:
            conn.close()


def _read_capped(resp, path: str) -> bytes:
    """The whole answer, refused beyond MAX_JSON (read in pieces: http.client's read(n)
    allocates n bytes up front)."""
    pieces: List[bytes] = []
    size = 0
    while True:
        piece = resp.read(65536)
        if not piece:
            return b"".join(pieces)
        size += len(piece)
        if size > MAX_JSON:
            raise ValueError(f"Docker's answer to {path} is larger than {MAX_JSON} bytes")
        pieces.append(piece)


def _read_exact(resp, size: int) -> bytes:
    out = b""
    while len(out) < size:
        chunk = resp.read(size - len(out))
        if not chunk:
            break
        out += chunk
    return out


def _json_stream(resp) -> Iterator[dict]:
    """The JSON values of a streamed answer (concatenated, usually one per line)."""
    decoder = json.JSONDecoder()
    buf = ""
    while True:
        chunk = resp.read1(65536) if hasattr(resp, "read1") else resp.read(65536)
        if not chunk:
            break
        buf += chunk.decode("utf-8", "replace")
        while True:
            stripped = buf.lstrip()
            if not stripped:
                buf = ""
                break
            try:
                value, end = decoder.raw_decode(stripped)
            except ValueError:
                if len(stripped) > MAX_JSON:
                    raise
                buf = stripped
                break
            buf = stripped[end:]
            yield value
    if buf.strip():
        raise ValueError(f"Docker's answer ended in the middle of a message: {buf.strip()[:200]!r}")
