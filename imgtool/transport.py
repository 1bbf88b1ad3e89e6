"""The HTTP set-up the two network rooms share: the registry room (registry.py, over requests or registry_http's
stdlib twin) and the model hubs' (hubs/http.py, over requests). One copy of issue 35's rules, so a change to them
reaches both:

- a session: imgtool's User-Agent, `Accept-Encoding: identity` (a cap on bytes is a cap on what arrives), every
  connection told to `deadline` as it connects and sends (requests: `watched_adapter`; registry_http: `on_send`);
- TLS: `tls_verify(insecure, ca_cert)`, passed on every call (a Session's own `verify` loses to $REQUESTS_CA_BUNDLE);
- the waits (`Waits`): connect and read timeouts, the response deadline (twice the read timeout unless set), the
  minimum rate of a body, and the one "answered too slowly" error;
- an answer read whole (`read_capped`): at most a cap, within the response deadline;
- a request that could not be sent (`unreachable`): the proxy the environment names, when it was the proxy.

The libraries are imported only inside the functions that use them (requests runs on Python 3.9+ only).
"""

from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Tuple, Union
from urllib.parse import urlsplit

from . import deadline
from .config import DEFAULT_MIN_RATE, proxy_variable
from .errors import RegistryError
from .model import format_size
from .registry_answers import network_error_text

USER_AGENT = "imgtool"
READ_CHUNK = 65536


def tls_verify(insecure: bool, ca_cert: Optional[str]) -> Union[bool, str]:
    """requests' `verify`: False (no checks) for an insecure endpoint, else its CA file, else the system's CAs."""
    return False if insecure else (ca_cert or True)


@dataclass(frozen=True)
class Waits:
    """How long an endpoint's answers may take: connect and read timeouts (seconds), the response deadline (an
    answer's headers, and a small answer whole, within it), and the minimum rate (bytes/s) of a body."""

    connect: float = 10.0
    read: float = 60.0
    response: float = 120.0
    min_rate: int = DEFAULT_MIN_RATE

    @classmethod
    def of(cls, connect_timeout: float = 10.0, read_timeout: float = 60.0, response_timeout: Optional[float] = None,
           min_rate: int = DEFAULT_MIN_RATE) -> "Waits":
        return cls(connect_timeout, read_timeout, response_timeout or 2 * read_timeout, min_rate)

    @property
    def timeout(self) -> Tuple[float, float]:
        """requests' (connect, read) pair."""
        return (self.connect, self.read)

    def seconds(self, timeout=None) -> float:
        """The response deadline for a call given `timeout` (None, seconds, or (connect, read)): twice its read
        timeout when that is shorter than the endpoint's (a probe's few seconds)."""
        read = timeout[1] if isinstance(timeout, (tuple, list)) else timeout
        return self.response if read is None else min(self.response, 2 * read)

    @staticmethod
    def too_slow(host: str, seconds: float) -> RegistryError:
        return RegistryError(f"{host}: answered too slowly: not complete within {seconds:g} s "
                             "($IMGTOOL_RESPONSE_TIMEOUT)")


class Waited:
    """An endpoint's client (registry.RegistryClient, hubs.http.HubHttp) with its `waits` and `host`: what its
    requests are given, derived from the waits here, once for both rooms."""

    waits: Waits
    host: str

    @property
    def timeout(self) -> Tuple[float, float]:
        """requests' (connect, read) pair."""
        return self.waits.timeout

    @property
    def response_timeout(self) -> float:
        return self.waits.response

    @property
    def min_rate(self) -> int:
        return self.waits.min_rate

    def _seconds(self, timeout) -> float:
        return self.waits.seconds(timeout)

    def _too_slow(self, seconds: float) -> RegistryError:
        return self.waits.too_slow(self.host, seconds)


def new_session(lib: Any, keep_cookies: bool = True) -> Any:
    """A session of `lib` (requests, or registry_http) with the headers above and its connections watched by
    `deadline`; `keep_cookies` False: it keeps none (a hub's login never rides along as a cookie)."""
    s = lib.Session()
    s.headers["User-Agent"] = USER_AGENT
    s.headers["Accept-Encoding"] = "identity"
    if hasattr(s, "on_send"):  # registry_http's session: it hands over each connection before a request
        s.on_send = deadline.attach
    else:
        adapter = watched_adapter()(pool_connections=4, pool_maxsize=16, max_retries=0)
        s.mount("http://", adapter)
        s.mount("https://", adapter)
    if not keep_cookies:
        import http.cookiejar

        s.cookies.set_policy(http.cookiejar.DefaultCookiePolicy(allowed_domains=[]))
    return s


def read_capped(read: Callable[[int], bytes], limit: int, what: str, seconds: float,
                too_slow: Callable[[float], Exception], cut: bool = False) -> bytes:
    """A body read to its end with `read(n)` (up to n bytes as they arrive, b"" at the end): at most `limit` bytes
    (`cut`: what fits, else RegistryError naming `what` past it), within `seconds` of now (else `too_slow(seconds)`).
    The caller closes the response."""
    import time

    due = time.monotonic() + seconds
    chunks: List[bytes] = []
    total = 0
    while True:
        chunk = read(READ_CHUNK)  # returns with what has arrived: a dripping body comes back here each time
        if not chunk:
            return b"".join(chunks)
        total += len(chunk)
        if total > limit:
            if cut:
                return b"".join(chunks)
            raise RegistryError(f"{what}: larger than {format_size(limit)}; imgtool stops reading there")
        if time.monotonic() > due:
            raise too_slow(seconds)
        chunks.append(chunk)


def unreachable(host: str, e: Exception, url: str, proxy_error: type, kind: str = "registry") -> RegistryError:
    """The error for a request to `host` (a `kind`: registry, hub) that could not be sent: the proxy in between
    named when it failed."""
    if isinstance(e, proxy_error):
        return RegistryError(f"cannot reach the proxy {proxy_named(url)} for {host}: {network_error_text(e)}",
                             hint=f"check that variable (or unset it), or name this {kind} in $no_proxy to "
                                  "connect directly")
    return RegistryError(f"{host}: {network_error_text(e)}")


def proxy_named(url: str) -> str:
    """The proxy the environment gives for `url` and the variable it came from, as requests and
    registry_http read them (urllib's order: lowercase first, then the scheme's, then all_proxy)."""
    named = proxy_variable(urlsplit(url).scheme)
    return f"{named[1]} (from ${named[0]})" if named else "(none named)"


_ADAPTER: Optional[type] = None


def watched_adapter() -> type:
    """requests' HTTPAdapter whose urllib3 connections tell `deadline` which socket an answer arrives on (made
    once, on first use: requests and urllib3 are imported only where they run)."""
    global _ADAPTER
    if _ADAPTER is None:
        import requests.adapters
        from urllib3.connection import HTTPConnection, HTTPSConnection
        from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

        def watched(base: type) -> type:
            """`base` (urllib3's connection, plain or TLS) telling `deadline` of itself as it connects and sends."""

            class Watched(base):
                def connect(self) -> None:
                    super().connect()
                    deadline.attach(self)

                def request(self, *args, **kwargs):
                    deadline.attach(self)
                    return super().request(*args, **kwargs)

            return Watched

        Watched, WatchedTLS = watched(HTTPConnection), watched(HTTPSConnection)

        class Pool(HTTPConnectionPool):
            ConnectionCls = Watched

        class PoolTLS(HTTPSConnectionPool):
            ConnectionCls = WatchedTLS

        pools = {"http": Pool, "https": PoolTLS}

        class Adapter(requests.adapters.HTTPAdapter):
            def init_poolmanager(self, *args, **kwargs):
                super().init_poolmanager(*args, **kwargs)
                self.poolmanager.pool_classes_by_scheme = pools

            def proxy_manager_for(self, *args, **kwargs):
                manager = super().proxy_manager_for(*args, **kwargs)
                manager.pool_classes_by_scheme = pools
                return manager

        _ADAPTER = Adapter
    return _ADAPTER
