"""gzip for layers and archives: ISA-L (the `isal` package) when it is importable, zlib otherwise.

ISA-L's deflate and inflate are several times faster than zlib's (on this project's 2-core
arm64 machine level 2 compresses ~390 MB/s against zlib level 1's ~60 MB/s, inflates ~330 MB/s
against ~135 MB/s). The installed package depends on `isal`; imgtool.pyz leaves it out (compiled
code), so Python 3.7 reads with zlib: the same bytes in, the same bytes out, slower.

Compressed output is a series of independent gzip members of `MEMBER` input bytes each, each with
a fixed header (no time, no name) and compressed on a thread pool (both libraries release the
GIL): multi-member gzip is plain gzip to every reader (gzip -d, Go's gzip, Docker 1.10+,
Python's GzipFile). The bytes are a function of the input, the library and its level only, not
of the thread count; `Gzip` names the two (bundle.json records it, `diff` names it).
Every other room gzips and gunzips through here: nothing else imports zlib or gzip for data.
"""

import struct
import zlib
from collections import deque
from types import ModuleType
from typing import Any, Callable, Iterator, Optional, Tuple, Type

from .errors import UsageError

_isal: Optional[ModuleType]
try:  # the installed package depends on isal; the pyz (and a bare Python 3.7) has only zlib
    from isal import isal_zlib as _isal
except ImportError:  # pragma: no cover - the pyz's path, tested through it
    _isal = None

LIBRARIES = ("auto", "isal", "zlib")
MEMBER = 2 * 1024 * 1024  # input bytes per gzip member: the unit of parallel work (4 MiB held export at 112-118 MiB
# RSS, 2 MiB at 78-84 MiB, same time, the bundle 0.08 % bigger: docs/benchmarks.md)
OUT = 1024 * 1024  # the most one inflate step hands out: a small bomb never fills memory
ISAL_LEVEL = 2  # ISA-L's fastest on layer data, about as small as zlib's level 1
# a member's fixed header: magic, deflate, no flags, mtime 0, no extra flags, OS unknown
_HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"


class GzipError(Exception):
    """A gzip stream that cannot be inflated: damaged, truncated, or not gzip."""


class Gzip:
    """A gzip compressor: the library (`isal` or `zlib`) and its own level. Equal ones write equal bytes."""

    def __init__(self, library: str, level: int):
        self.library, self.level = library, level
        self._lib: Any = _isal if library == "isal" else zlib

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Gzip) and (self.library, self.level) == (other.library, other.level)

    def __hash__(self) -> int:
        return hash((self.library, self.level))

    def __repr__(self) -> str:
        return f"Gzip({self.library!r}, {self.level})"

    def __str__(self) -> str:
        return f"{self.library} level {self.level}"

    def to_json(self) -> dict:
        return {"library": self.library, "level": self.level}

    def member(self, data: bytes) -> bytes:
        """`data` as one gzip member with the fixed header."""
        c = self._lib.compressobj(self.level, zlib.DEFLATED, -15)
        body = c.compress(data) + c.flush()
        return b"".join((_HEADER, body, struct.pack("<II", self._lib.crc32(data) & 0xFFFFFFFF,
                                                     len(data) & 0xFFFFFFFF)))


def compressor(level: int = 1, library: str = "auto") -> Gzip:
    """The compressor for `level` on zlib's scale (1 fast .. 9 small) from `library` (auto: ISA-L when
    importable). ISA-L takes level 1 (as its level 2); levels 2-9 are zlib's. Raises UsageError."""
    if library not in LIBRARIES:
        raise UsageError(f"invalid gzip library {library!r}: use one of {', '.join(LIBRARIES)}")
    if not 1 <= level <= 9:
        raise UsageError(f"invalid --gzip-level {level}: use 1 (fast) to 9 (small)")
    if library == "isal" and _isal is None:
        raise UsageError("--gzip-library isal: the isal Python package is missing",
                         hint="pip install isal, or use --gzip-library zlib")
    if library == "isal" and level != 1:
        raise UsageError(f"--gzip-library isal compresses at --gzip-level 1 only (asked: {level})",
                         hint="levels 2-9 are zlib's: --gzip-library zlib (or auto)")
    if library != "zlib" and level == 1 and _isal is not None:
        return Gzip("isal", ISAL_LEVEL)
    return Gzip("zlib", level)


class Members:
    """Bytes in, gzip members of MEMBER input bytes each out through `write`, in order; each compressed on
    `pool`, at most `ahead` in flight (memory stays at ~2 x ahead x MEMBER). `close()` writes the rest
    (an empty stream still becomes one valid member)."""

    def __init__(self, gzip: Gzip, pool, write: Callable[[bytes], None], ahead: int):
        self.gzip, self.pool, self.write, self.ahead = gzip, pool, write, max(1, ahead)
        self._buf = bytearray()
        self._pending: deque = deque()
        self._members = 0

    def _submit(self, data: bytes) -> None:
        self._pending.append(self.pool.submit(self.gzip.member, data))
        self._members += 1
        while len(self._pending) > self.ahead:
            self.write(self._pending.popleft().result())

    def feed(self, data) -> None:
        if not self._buf and len(data) == MEMBER:
            self._submit(bytes(data))  # the common case: a whole member read at once, no copy
            return
        self._buf += data
        while len(self._buf) >= MEMBER:
            self._submit(bytes(self._buf[:MEMBER]))
            del self._buf[:MEMBER]

    def close(self) -> None:
        if self._buf or not self._members:
            self._submit(bytes(self._buf))
            self._buf = bytearray()
        while self._pending:
            self.write(self._pending.popleft().result())

    def abandon(self) -> None:
        """On an error: wait for what is in flight (the pool is the caller's), keep nothing."""
        for f in self._pending:
            f.cancel()
        self._pending.clear()


class Inflate:
    """A gzip stream fed in pieces, inflated in pieces of at most OUT bytes: one member or several, zeros
    after a member skipped (as gzip(1) and GzipFile do). `end()` raises when the last member is cut short."""

    def __init__(self, library: str = "auto"):
        self._lib: Any = _isal if library != "zlib" and _isal is not None else zlib
        self._errors: Tuple[Type[Exception], ...] = (zlib.error,) + ((_isal.error,) if _isal is not None else ())
        self._z: Any = None
        self._ended = True  # between members (none yet)
        self._members = 0

    def feed(self, data) -> Iterator[bytes]:
        """The inflated bytes `data` completes; raises GzipError."""
        data = bytes(data)
        try:
            while True:
                if self._z is None:
                    data = data.lstrip(b"\0") if self._members else data
                    if not data:
                        return
                    self._z, self._ended = self._lib.decompressobj(31), False
                out = self._z.decompress(data, OUT)
                if out:
                    yield out
                if self._z.eof:
                    data, self._z, self._ended = self._z.unused_data, None, True
                    self._members += 1
                    continue
                data = self._z.unconsumed_tail
                if not data and len(out) < OUT:
                    return  # everything fed is inflated: more input is needed
        except self._errors as e:  # the libraries word it differently (and zlib gives one code for all): one text
            raise GzipError("damaged deflate data or CRC") from e

    def end(self) -> None:
        """The stream is over: raises GzipError unless its last member was complete."""
        if not self._ended or not self._members:
            raise GzipError("the gzip stream ends early")


class Reader:
    """read(n) of the inflated bytes of `raw` (anything with read(n)); raises GzipError."""

    def __init__(self, raw, library: str = "auto", read_size: int = OUT):
        self._pieces = self._inflated(raw, Inflate(library), read_size)
        self._buf = memoryview(b"")

    @staticmethod
    def _inflated(raw, inflate: Inflate, read_size: int) -> Iterator[bytes]:
        for chunk in iter(lambda: raw.read(read_size), b""):
            yield from inflate.feed(chunk)
        inflate.end()

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            return b"".join([bytes(self._buf)] + list(self._pieces))
        while not len(self._buf):
            piece = next(self._pieces, None)
            if piece is None:
                return b""
            self._buf = memoryview(piece)
        out, self._buf = self._buf[:n], self._buf[n:]
        return out.tobytes()
