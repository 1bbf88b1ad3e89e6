"""The registry room's answers as values: read whole and capped (`Answer`), a blob's raw bytes (`BlobStream`),
what an answer or a network failure says in one line, and the one `RetryPolicy` (which answers are worth
another try, how long to wait: back-off or the registry's `Retry-After`).

No transport here: registry.py reads the transport's responses and hands them in; the timeout types of the
transports loaded are found by name (`sys.modules`), so this module imports neither requests nor
registry_http.
"""

import email.utils
import random
import re
import socket
import sys
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional

from . import deadline
from .errors import Cancelled, RegistryError
from .model import MAX_MANIFEST_BYTES, json_object

RETRY_STATUS = {408, 425, 429, 500, 502, 503, 504}
MAX_ANSWER_BYTES = MAX_MANIFEST_BYTES  # any answer read whole (JSON: a tag page, a token, an error)
MAX_ERROR_BYTES = 64 * 1024  # what an error's body is read for: its message


if TYPE_CHECKING:  # typing.Protocol is Python 3.8's: imgtool.pyz pushes on 3.7 through this room
    from typing import Protocol

    class Response(Protocol):
        """A transport's response as this module reads it (requests', or registry_http's twin of it)."""

        status_code: int
        reason: Any
        headers: Mapping[str, str]
        url: str
        history: Any

        def close(self) -> None: ...


class Answer:
    """A registry's answer read whole (its body at most a cap): the status, headers and URL of the transport's
    response, without the transport."""

    def __init__(self, resp: "Response", body: bytes):
        self.status_code, self.reason, self.headers = resp.status_code, resp.reason, resp.headers
        self.url, self.history, self.body = resp.url, resp.history, body

    def close(self) -> None:
        pass  # read and released already

    def __enter__(self) -> "Answer":
        return self

    def __exit__(self, *exc) -> None:
        pass


def registry_error_text(resp: Answer) -> str:
    """The distribution error message of an answer, or its status line."""
    try:
        errors = json_object(resp.body, MAX_ERROR_BYTES, ValueError).get("errors") or []
        parts = [f"{e.get('code', '')}: {e.get('message', '')}".strip(": ") for e in errors if isinstance(e, dict)]
        if parts:
            return "; ".join(str(p) for p in parts)[:300]
    except (ValueError, AttributeError, TypeError):
        pass
    return f"HTTP {resp.status_code} {resp.reason or ''}".strip()


def retry_after(resp: "Response") -> Optional[float]:
    """The seconds a 429/503's `Retry-After` asks for (a number or an HTTP date), or None."""
    if resp.status_code not in (429, 503):
        return None
    value = resp.headers.get("Retry-After")
    if not value:
        return None
    try:
        return max(float(value), 0.0)
    except ValueError:
        try:
            parsed = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        return None if parsed is None else max(parsed.timestamp() - time.time(), 0.0)


@dataclass(frozen=True)
class RetryPolicy:
    """The one retry policy of the registry side: how often a request is tried, how long to wait between
    tries. The client applies it to each request; the puller to each range of a blob (where a retry may go
    to another source, so the client does not retry those again). Every wait ends at once on cancel."""

    attempts: int = 4
    """Tries of one request; a range's every `attempts`-th failure on a source drops that source."""

    backoff: float = 0.5
    """Seconds before the second try, doubled for each further one (at most `max_backoff`), with jitter."""

    max_backoff: float = 8.0

    max_retry_after: float = 60.0
    """A registry's `Retry-After` is honoured up to this many seconds."""

    def delay(self, attempt: int, retry_after: Optional[float] = None) -> float:
        """Seconds to wait after the `attempt`-th failure (0-based), or what the registry asked for."""
        if retry_after is not None:
            return min(max(retry_after, 0.0), self.max_retry_after)
        base = min(self.backoff * (2 ** attempt), self.max_backoff)
        return base * (0.5 + random.random() / 2)

    @staticmethod
    def wait(seconds: float, cancel: Optional[threading.Event]) -> None:
        """Wait `seconds`, or until `cancel` is set: then raises Cancelled. Without an event the wait is
        still one Ctrl-C ends in the main thread (a lock wait, which a signal interrupts)."""
        if (cancel if cancel is not None else threading.Event()).wait(seconds):
            raise Cancelled("cancelled while waiting to try again")


class BlobStream:
    """A blob's bytes as the registry sends them (never content-decoded), its transport hidden.

    `whole` is True when the registry ignored the Range asked for and sends the whole blob (200, not
    206). `read(n)` gives up to n bytes as they arrive (b"" at the end) and raises RegistryError when the
    connection breaks or stalls; `close()` (or leaving `with`) ends the response.
    """

    def __init__(self, resp: "Response", read: Callable[[int], bytes], errors: tuple, host: str,
                 rate: deadline.Rate):
        self.whole = resp.status_code == 200
        self._resp, self._read, self._errors, self._host, self._rate = resp, read, errors, host, rate

    def read(self, n: int) -> bytes:
        """Up to n bytes; raises RegistryError (also when the bytes come slower than the rate asked for)."""
        start = time.monotonic()
        try:
            chunk = self._read(n)
        except self._errors as e:
            raise RegistryError(f"{self._host}: {network_error_text(e)}") from e
        short = self._rate.add(len(chunk), time.monotonic() - start)
        if short is not None:
            self.close()
            raise RegistryError(f"{self._host}: sent too slowly: {short[0]} bytes in {short[1]:.0f} s, under "
                                f"{self._rate.floor} bytes/s ($IMGTOOL_MIN_RATE)")
        return chunk

    def read_up_to(self, limit: int) -> bytes:
        """The body until its end or `limit` bytes, whichever comes first; raises RegistryError."""
        chunks, total = [], 0
        while total < limit:
            chunk = self.read(min(65536, limit - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        return b"".join(chunks)

    def close(self) -> None:
        self._resp.close()

    def __enter__(self) -> "BlobStream":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def network_error_text(e: Exception, limit: int = 200) -> str:
    """One readable line for a network exception (urllib3 nests long reprs)."""
    text = " ".join(str(e).split())
    if isinstance(e, _timeouts()) or "timed out" in text:
        return "timed out"
    m = re.search(r"\[SSL: \w+\] ([^'\"]+?) \(_ssl\.c:\d+\)", text)  # OpenSSL's words, not urllib3's wrapping
    if m:
        return m.group(1)
    m = re.search(r"\[Errno -?\d+\] ([^'\")]+)", text)
    if m:
        return m.group(1).strip().rstrip(".").lower()
    for needle, said in (("RemoteDisconnected", "connection closed by the server"),
                         ("Connection reset", "connection reset"), ("Connection aborted", "connection aborted"),
                         ("IncompleteRead", "connection closed before the whole body arrived")):
        if needle in text:
            return said
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _timeouts() -> tuple:
    """The timeout exceptions of the transports loaded (one of requests' cannot exist unless requests is)."""
    found = [socket.timeout]
    for name in ("requests", "imgtool.registry_http"):
        lib = sys.modules.get(name)
        if lib is not None:
            found += [lib.exceptions.ConnectTimeout, lib.exceptions.ReadTimeout]
    return tuple(found)
