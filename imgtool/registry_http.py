"""The distribution API's HTTP over the standard library, for Pythons that requests 2.32 no longer runs on.

Kylin V10's python3 is 3.7; requests 2.32 / urllib3 2 need 3.8+ (and docker.auth imports requests).
imgtool.pyz pushes from there, so registry.py (the one registry room, the only user of this module)
talks HTTP through this small client when requests cannot be imported. It offers the subset of
`requests.Session` / `requests.Response` that registry.py calls, with the same names and arguments,
so both transports go through the same `RegistryClient` methods; and `docker_credentials`, docker.auth's
resolution of `~/.docker/config.json` (auths, credsStore, credHelpers) without docker-py.
"""

import base64
import http.client
import json
import os
import shutil
import socket
import ssl
import subprocess
import urllib.request
from typing import Callable, Dict, Iterator, List, Optional, Tuple, Union
from urllib.parse import SplitResult, unquote, urlencode, urljoin, urlsplit

MAX_REDIRECTS = 10
INDEX_NAME = "docker.io"
INDEX_URL = "https://index.docker.io/v1/"  # docker.auth's key for Docker Hub in credential stores
TOKEN_USERNAME = "<token>"  # a helper's way of saying "the secret is an identity token"


# --- what requests raises, by the same names (registry.py catches them by these) ---------------

class RequestException(OSError):
    """Any failure to exchange a request and its answer."""


class ConnectionError(RequestException):  # noqa: A001 - requests' name
    """The connection could not be made, or broke."""


class SSLError(ConnectionError):
    """TLS failed: an unverifiable certificate, or a server that does not speak TLS."""


class ProxyError(ConnectionError):
    """The proxy the environment names could not be reached, or refused the tunnel."""


class Timeout(RequestException):
    """Connecting or reading took longer than the timeout."""


class ConnectTimeout(ConnectionError, Timeout):
    """Connecting took longer than the connect timeout."""


class ReadTimeout(Timeout):
    """The server sent nothing for the read timeout."""


class TooManyRedirects(RequestException):
    """More than MAX_REDIRECTS redirects."""


class InvalidURL(RequestException, ValueError):
    """A URL (a redirect's Location) that cannot be parsed."""


def _strips_auth(old: str, new: str) -> bool:
    """Whether a redirect from `old` to `new` drops the Authorization header: requests' `should_strip_auth`
    (another host, port or scheme; http -> https on the default ports keeps it). Raises ValueError."""
    a, b = urlsplit(old), urlsplit(new)
    if a.hostname != b.hostname:
        return True
    if a.scheme == "http" and a.port in (80, None) and b.scheme == "https" and b.port in (443, None):
        return False
    default = ({"http": 80, "https": 443}.get(a.scheme), None)
    if a.scheme == b.scheme and a.port in default and b.port in default:
        return False
    return a.port != b.port or a.scheme != b.scheme


class exceptions:  # noqa: N801 - `requests.exceptions.SSLError` reads the same on both transports
    RequestException = RequestException
    ConnectionError = ConnectionError
    ProxyError = ProxyError
    SSLError = SSLError
    Timeout = Timeout
    ConnectTimeout = ConnectTimeout
    ReadTimeout = ReadTimeout


def _translate(e: BaseException, connecting: bool) -> RequestException:
    """The requests-named exception for what http.client, ssl or socket raised."""
    if isinstance(e, RequestException):
        return e
    if isinstance(e, ssl.SSLError):  # before OSError: SSLError is one
        return SSLError(str(e))
    if isinstance(e, socket.timeout):
        return ConnectTimeout("timed out") if connecting else ReadTimeout("timed out")
    if isinstance(e, http.client.RemoteDisconnected):
        return ConnectionError("RemoteDisconnected: connection closed by the server")
    if isinstance(e, http.client.IncompleteRead):
        return ConnectionError(f"IncompleteRead: {e}")
    return ConnectionError(str(e) or type(e).__name__)


_NET_ERRORS = (OSError, http.client.HTTPException)


# --- connections ------------------------------------------------------------------------------

class _HTTPConnection(http.client.HTTPConnection):
    """Connect timeout while connecting, read timeout afterwards (requests' (connect, read) pair)."""

    def __init__(self, host: str, port: Optional[int], timeouts: Tuple[float, float]):
        super().__init__(host, port, timeout=timeouts[0])
        self.read_timeout = timeouts[1]

    def connect(self) -> None:
        super().connect()
        self.sock.settimeout(self.read_timeout)


class _HTTPSConnection(http.client.HTTPSConnection):
    def __init__(self, host: str, port: Optional[int], timeouts: Tuple[float, float], context: ssl.SSLContext):
        super().__init__(host, port, timeout=timeouts[0], context=context)
        self.read_timeout = timeouts[1]

    def connect(self) -> None:
        super().connect()  # TCP and the TLS handshake, within the connect timeout
        self.sock.settimeout(self.read_timeout)


def tls_context(verify: Union[bool, str]) -> ssl.SSLContext:
    """verify=True: $REQUESTS_CA_BUNDLE or $CURL_CA_BUNDLE as requests reads them, else the system's CAs
    (requests has certifi's); a path: only that CA file (as requests' verify=PATH); False: no checks."""
    if verify is False:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        return ctx
    if verify is True:
        verify = os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE") or True
    return ssl.create_default_context(cafile=verify if isinstance(verify, str) else None)


def _timeouts(timeout) -> Tuple[Optional[float], Optional[float]]:
    if isinstance(timeout, (tuple, list)):
        return timeout[0], timeout[1]
    return timeout, timeout


def proxy_for(url: SplitResult) -> Optional[SplitResult]:
    """The proxy requests would use for `url`: $https_proxy / $http_proxy / $all_proxy unless
    $no_proxy names the host (requests' reading of the environment, CIDR entries aside)."""
    proxies = urllib.request.getproxies_environment()
    if not proxies or urllib.request.proxy_bypass_environment(url.netloc, proxies):  # type: ignore[attr-defined]
        return None
    proxy = proxies.get(url.scheme) or proxies.get("all")
    if not proxy:
        return None
    return urlsplit(proxy if "://" in proxy else "http://" + proxy)


def _proxy_auth(proxy: SplitResult) -> Dict[str, str]:
    if proxy.username is None:
        return {}
    raw = f"{unquote(proxy.username)}:{unquote(proxy.password or '')}".encode("utf-8")
    return {"Proxy-Authorization": "Basic " + base64.b64encode(raw).decode("ascii")}


class Response:
    """requests.Response, the part registry.py reads: status, headers, body (streamed or read)."""

    def __init__(self, raw: http.client.HTTPResponse, url: str, history: List["Response"], stream: bool,
                 on_close=None):
        self.status_code = raw.status
        self.reason = raw.reason
        self.headers = raw.msg  # an email.message.Message: .get() ignores case, as requests' headers do
        self.url = url
        self.history = history
        self._raw = raw
        self._on_close = on_close
        self._content: Optional[bytes] = None
        if not stream:
            self._content = b"".join(self._pieces(65536))
            self.close()

    def _pieces(self, size: int) -> Iterator[bytes]:
        while True:
            try:
                piece = self._raw.read(size)
            except _NET_ERRORS as e:
                self.close()
                raise _translate(e, connecting=False) from e
            if not piece:
                return
            yield piece

    def read1(self, n: int) -> bytes:
        """Up to n bytes of a streamed body as they arrive (b"" at its end), as urllib3's `read1`; at its end
        the answer is done with, so its connection serves the next request (as urllib3 releases it)."""
        try:
            data = self._raw.read1(n)
        except _NET_ERRORS as e:
            self.close()
            raise _translate(e, connecting=False) from e
        if not data and n:
            self._raw.close()  # http.client leaves a HEAD's or a read1-ended answer open: the next request waits on it
        return data

    def iter_content(self, chunk_size: int = 1) -> Iterator[bytes]:
        """The body in pieces of up to chunk_size bytes, as they arrive (never decoded: identity only)."""
        if self._content is not None:
            for i in range(0, len(self._content), chunk_size):
                yield self._content[i:i + chunk_size]
            return
        yield from self._pieces(chunk_size)
        self.close()

    @property
    def content(self) -> bytes:
        if self._content is None:
            self._content = b"".join(self._pieces(65536))
            self.close()
        return self._content

    def json(self):
        return json.loads(self.content.decode("utf-8"))

    def close(self) -> None:
        """Done with the answer; a connection whose answer was not read to its end is not reused."""
        if self._on_close is not None:
            done, self._on_close = self._on_close, None
            done(self._raw.isclosed())
        self._raw.close()

    def __enter__(self) -> "Response":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Session:
    """requests.Session, the part registry.py uses: one keep-alive connection per endpoint.

    Not thread-safe, like requests' sessions as registry.py uses them (one per thread)."""

    def __init__(self) -> None:
        self.headers: Dict[str, str] = {"Accept": "*/*"}
        self._conns: Dict[tuple, http.client.HTTPConnection] = {}
        # called with the (connected) connection a request is about to be sent on: the registry room watches
        # it for the answer's deadline (as it hooks urllib3's connections on the requests transport)
        self.on_send: Optional[Callable[[http.client.HTTPConnection], None]] = None

    def get(self, url: str, **kwargs) -> Response:
        return self.request("GET", url, **kwargs)

    def request(self, method: str, url: str, *, headers: Optional[dict] = None, params: Optional[dict] = None,
                data: Optional[bytes] = None, auth: Optional[Tuple[str, str]] = None, timeout=(10.0, 60.0),
                verify: Union[bool, str] = True, stream: bool = False, allow_redirects: bool = True) -> Response:
        """Send one request (following redirects); raises RequestException and its subclasses."""
        hdrs = dict(self.headers)
        hdrs.update(headers or {})
        if auth is not None:
            hdrs["Authorization"] = "Basic " + base64.b64encode(":".join(auth).encode("utf-8")).decode("ascii")
        if params:
            url += ("&" if "?" in url else "?") + urlencode(params)
        history: List[Response] = []
        while True:
            resp = self._send(method, url, hdrs, data, _timeouts(timeout), verify, stream)
            location = resp.headers.get("Location")
            if not (allow_redirects and location and resp.status_code in (301, 302, 303, 307, 308)):
                resp.history = history
                return resp
            resp.close()
            history.append(resp)
            if len(history) > MAX_REDIRECTS:
                raise TooManyRedirects(f"exceeded {MAX_REDIRECTS} redirects")
            try:
                target = urljoin(url, location)
                strip = _strips_auth(url, target)
            except ValueError:
                raise InvalidURL(f"a malformed redirect Location {location[:200]!r}") from None
            if strip:
                hdrs.pop("Authorization", None)  # a token is for the registry, not for its storage backend
            if resp.status_code in (301, 302, 303) and method not in ("GET", "HEAD"):
                method, data = "GET", None  # as browsers and requests do
                hdrs.pop("Content-Type", None)
            url = target

    def _connection(self, split: SplitResult, proxy: Optional[SplitResult], timeouts, verify
                    ) -> http.client.HTTPConnection:
        """The kept connection to the endpoint (through a proxy: to the proxy; https: a CONNECT tunnel)."""
        key = (split.scheme, split.netloc, proxy, verify if isinstance(verify, str) else bool(verify), timeouts)
        conn = self._conns.get(key)
        if conn is not None:
            return conn
        host, port = (proxy.hostname, proxy.port) if proxy else (split.hostname, split.port)
        if split.scheme == "https":
            conn = _HTTPSConnection(host or "", port, timeouts, tls_context(verify))
            if proxy:
                conn.set_tunnel(split.hostname or "", split.port or 443, headers=_proxy_auth(proxy))
        elif split.scheme == "http":
            conn = _HTTPConnection(host or "", port, timeouts)
        else:
            raise RequestException(f"cannot speak {split.scheme!r} (http and https only)")
        self._conns[key] = conn
        return conn

    def _send(self, method: str, url: str, headers: dict, data: Optional[bytes], timeouts, verify,
              stream: bool) -> Response:
        split = urlsplit(url)
        target = (split.path or "/") + ("?" + split.query if split.query else "")
        proxy = proxy_for(split)
        if proxy and split.scheme == "http":  # a plain-HTTP request goes to the proxy whole
            target = url
            headers = dict(headers, **_proxy_auth(proxy))
        conn = self._connection(split, proxy, timeouts, verify)
        for fresh in (conn.sock is None, True):
            connecting = conn.sock is None
            try:
                if connecting:
                    conn.connect()
                connecting = False
                if self.on_send is not None:
                    self.on_send(conn)
                conn.request(method, target, body=data, headers=headers)
                raw = conn.getresponse()
                break
            except _NET_ERRORS as e:
                conn.close()
                stale = isinstance(e, (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError))
                if fresh or not stale:
                    err = _translate(e, connecting)
                    if proxy and connecting and not isinstance(err, SSLError):  # as requests: the proxy's fault
                        err = ProxyError(str(err))
                    raise err from e
                # a kept-alive connection the server had closed meanwhile: once more on a new one

        def done(finished: bool) -> None:
            if not finished:
                conn.close()  # the rest of the body is still on the wire: the next request reconnects

        return Response(raw, url, [], stream, on_close=done)

    def close(self) -> None:
        for conn in self._conns.values():
            conn.close()
        self._conns.clear()


# --- ~/.docker/config.json, as docker.auth reads it ----------------------------------------------

class HelperError(Exception):
    """A credential helper named in the config could not be run or failed (docker's StoreError words)."""


class HelperTimeout(HelperError):
    """A credential helper did not answer within `seconds` (it was killed)."""

    def __init__(self, program: str, seconds: float):
        super().__init__(f"{program} did not answer within {seconds:g} s")
        self.program, self.seconds = program, seconds


def docker_credentials(path: str, host: str, timeout: float = 30.0) -> Optional[dict]:
    """The auth entry for `host` as docker.auth's `load_config(path).resolve_authconfig(host)` returns it:
    {"Username", "Password"} from a helper, {"username", "password", ...} from `auths`, or None.

    A helper gets `timeout` seconds (docker-py gives it forever). Raises HelperError when a helper is named
    for the host but cannot be run or fails, HelperTimeout when it does not answer in time; ValueError,
    OSError when the file is not a docker config.
    """
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    if not isinstance(doc, dict):
        raise ValueError(f"{path} is not a JSON object")
    helpers = doc.get("credHelpers") or {}
    store = doc.get("credsStore")
    if doc.get("auths") or store or helpers:
        auths = _parse_auths(doc.get("auths") or {}, strict=True)
    else:  # a file of auths entries only (docker's legacy layout)
        auths = _parse_auths(doc, strict=False)
    if store or helpers:
        server = host if host and host != INDEX_NAME else INDEX_URL
        name = helpers.get(server) or store
        if name:
            found = _helper_get(f"docker-credential-{name}", server, timeout)
            if found is not None:
                if found.get("Username") == TOKEN_USERNAME:
                    return {"ServerAddress": server, "IdentityToken": found.get("Secret")}
                return {"ServerAddress": server, "Username": found.get("Username"), "Password": found.get("Secret")}
    registry = _index_name(host) if host else INDEX_NAME
    if registry in auths:
        return auths[registry]
    for key, entry in auths.items():
        if _index_name(key) == registry:
            return entry
    return None


def _parse_auths(entries: dict, strict: bool) -> Dict[str, dict]:
    out: Dict[str, dict] = {}
    for registry, entry in entries.items():
        if not isinstance(entry, dict):
            if strict:
                raise ValueError(f"invalid configuration for registry {registry}")
            return {}
        if "identitytoken" in entry:
            out[registry] = {"IdentityToken": entry["identitytoken"]}
        elif "auth" not in entry:
            out[registry] = {}  # `docker login` with a credential helper leaves an empty entry
        else:
            raw = entry["auth"].encode("ascii") if isinstance(entry["auth"], str) else entry["auth"]
            user, password = base64.b64decode(raw).split(b":", 1)  # ValueError when malformed, as docker's
            out[registry] = {"username": user.decode("utf-8"), "password": password.decode("utf-8"),
                             "email": entry.get("email"), "serveraddress": registry}
    return out


def _index_name(name: str) -> str:
    host = name.replace("http://", "").replace("https://", "").split("/", 1)[0]
    return INDEX_NAME if host == f"index.{INDEX_NAME}" else host


def _helper_get(program: str, server: str, timeout: float) -> Optional[dict]:
    """`PROGRAM get` with the server on stdin: its JSON, or None when it has no credentials for it."""
    exe = shutil.which(program)
    if exe is None:
        raise HelperError(f"{program} not installed or not available in PATH")
    try:
        out = subprocess.run([exe, "get"], input=server.encode("utf-8"), stdout=subprocess.PIPE,
                             check=True, timeout=timeout).stdout  # the helper inherits imgtool's environment
    except subprocess.TimeoutExpired as e:
        raise HelperTimeout(program, timeout) from e
    except subprocess.CalledProcessError as e:
        said = (e.output or b"").decode("utf-8")
        if "credentials not found in native keychain" in said:
            return None
        raise HelperError(f'Credentials store {program} exited with "{said}".') from e
    except OSError as e:
        raise HelperError(f"{program} not installed or not available in PATH" if isinstance(e, FileNotFoundError)
                          else f'Unexpected OS error "{e.strerror}", errno={e.errno}') from e
    result = json.loads(out.decode("utf-8"))
    if result.get("Username") == "" and result.get("Secret") == "":
        return None  # docker-credential-pass answers an empty entry for a server it does not know
    return result
