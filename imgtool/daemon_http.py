"""The Docker Engine API over the standard library, for Pythons that docker-py no longer runs on.

Kylin V10's python3 is 3.7; docker 7 / requests 2.32 / urllib3 2 need 3.8+. imgtool.pyz runs
its offline verbs there, so daemon.py (the one Docker room, the only user of this module) talks
to dockerd through this small client when docker-py cannot be imported. It offers the subset
of docker-py's `APIClient` that daemon.py calls, with the same names and arguments, so both
transports go through the same `Daemon` methods. Unix sockets and plain tcp:// only.
"""

import http.client
import json
import os
import socket
from typing import Iterable, Iterator, Optional
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

    def __init__(self, host: Optional[str] = None, version: str = "auto", timeout: Optional[float] = 600):
        self.host = host or os.environ.get("DOCKER_HOST") or DEFAULT_HOST
        self.timeout = timeout
        if self.host.startswith("unix://"):
            self._unix = self.host[len("unix://"):]
        elif self.host.startswith("tcp://") and not os.environ.get("DOCKER_TLS_VERIFY"):
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
                raw = resp.read(MAX_JSON)
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
            raw = resp.read(MAX_JSON + 1)
        finally:
            conn.close()
        if len(raw) > MAX_JSON:
            raise ValueError(f"Docker's answer to {path} is larger than {MAX_JSON} bytes")
        return json.loads(raw.decode("utf-8")) if raw.strip() else None

    @staticmethod
    def _ref(name: str) -> str:
        return quote(name, safe="/:@")

    # --- what daemon.py uses ------------------------------------------------------

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
