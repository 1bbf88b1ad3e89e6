"""A tar stream read once, in order, from the chunks it arrives in: `docker save`'s archive as export reads it.

tarfile's stream mode (`mode="r|"`) over a file of chunks copied every byte three more times on its way to a
member's reader (a BufferedReader, tarfile's own buffer, the slices of each), all on the one thread that reads the
save: that thread was the export's limit (docs/benchmarks.md, "export reads the save once"). Here a member's
`read(n)` joins the pieces of the chunks it spans into one bytes object (the one copy; a read of exactly one whole
chunk is the chunk itself), and a header is one 512-byte block parsed by `tarfile.TarInfo.frombuf`, which checks
its checksum.

It reads what Go's archive/tar and GNU tar write: ustar, pax extended headers (`path`, `size`) and GNU long names;
a pax global header is skipped; link, directory and device entries carry no data, as in Go's reader. Members come
in order; whatever a caller leaves unread of one is skipped. Standard library only. Raises TarStreamError for a
stream that ends inside the archive or holds a broken header; after the end blocks the rest of the stream is read
(and dropped), so the chunks' source finishes and reports its own errors.
"""

import tarfile
from typing import Dict, Iterable, Iterator, List, Optional, Tuple

BLOCK = 512
_ZERO_BLOCK = bytes(BLOCK)
SKIP = 1 << 20  # what skipping unread member data reads at a time
MAX_META = 1 << 20  # pax headers and GNU long names larger than this are refused: they hold names, not data
_META_TYPES = (tarfile.XHDTYPE, tarfile.SOLARIS_XHDTYPE, tarfile.XGLTYPE, tarfile.GNUTYPE_LONGNAME,
               tarfile.GNUTYPE_LONGLINK)


class TarStreamError(ValueError):
    """The stream is not a whole tar archive; the message says where it broke."""


class _Chunks:
    """The stream's bytes, read by count: each read is one bytes object, joined only across chunks."""

    def __init__(self, chunks: Iterable[bytes]):
        self._it = iter(chunks)
        self._chunk = b""  # the chunk being read, and how far
        self._at = 0
        self.offset = 0  # bytes handed out so far (for messages)

    def read(self, n: int) -> bytes:
        """`n` bytes, fewer only where the stream ends."""
        pieces: List[memoryview] = []
        want = n
        while want:
            left = len(self._chunk) - self._at
            if not left:
                chunk = next(self._it, None)
                if chunk is None:
                    break
                self._chunk, self._at = chunk, 0
                continue
            if not pieces and self._at == 0 and left == want:  # exactly one whole chunk: no copy at all
                whole, self._chunk = self._chunk, b""
                self.offset += n
                return bytes(whole) if not isinstance(whole, bytes) else whole
            take = min(want, left)
            pieces.append(memoryview(self._chunk)[self._at:self._at + take])
            self._at += take
            want -= take
        self.offset += n - want
        return b"".join(pieces)

    def drain(self) -> None:
        """Read the stream to its end, dropping it."""
        self._chunk, self._at = b"", 0
        for _ in self._it:
            pass


class Member:
    """One member's data, read in order; `left` bytes are still unread."""

    def __init__(self, chunks: _Chunks, size: int, name: str):
        self._chunks, self.left, self.name = chunks, size, name

    def read(self, n: Optional[int] = -1) -> bytes:
        """Up to `n` bytes (all that is left when n is None or negative); b"" at the member's end."""
        n = self.left if n is None or n < 0 else min(n, self.left)
        if not n:
            return b""
        data = self._chunks.read(n)
        self.left -= len(data)
        if len(data) < n:
            raise TarStreamError(f"the archive ends inside {self.name} ({self.left} bytes missing)")
        return data

    def skip(self) -> None:
        while self.left:
            self.read(min(self.left, SKIP))


def members(chunks: Iterable[bytes]) -> Iterator[Tuple[tarfile.TarInfo, Member]]:
    """Each member of the tar stream `chunks` with a reader of its data; raises TarStreamError."""
    stream = _Chunks(chunks)
    pax: Dict[str, str] = {}
    long_name: Optional[str] = None
    while True:
        at = stream.offset
        block = stream.read(BLOCK)
        if not block:  # no end blocks: tarfile and Go's reader take the end of the stream for the archive's end
            return
        if len(block) < BLOCK:
            raise TarStreamError(f"the archive ends inside a header (at byte {at})")
        if block == _ZERO_BLOCK:  # the archive's end
            stream.drain()
            return
        try:
            info = tarfile.TarInfo.frombuf(block, "utf-8", "surrogateescape")
        except tarfile.HeaderError as e:
            raise TarStreamError(f"a broken tar header at byte {at} ({e})") from None
        if info.type in _META_TYPES:
            if info.size > MAX_META:
                raise TarStreamError(f"a tar header at byte {at} is {info.size} bytes long (more than {MAX_META})")
            data = Member(stream, info.size, "a tar header").read()
            _skip(stream, -info.size % BLOCK)
            if info.type in (tarfile.XHDTYPE, tarfile.SOLARIS_XHDTYPE):
                pax = _pax_records(data, at)
            elif info.type == tarfile.GNUTYPE_LONGNAME:
                long_name = data.rstrip(b"\0").decode("utf-8", "surrogateescape")
            continue
        if long_name is not None:
            info.name, long_name = long_name, None
        if "path" in pax:
            info.name = pax["path"]
        if "size" in pax:
            try:
                info.size = int(pax["size"])
            except ValueError:
                raise TarStreamError(f"a pax header at byte {at} has a size that is not a number") from None
        pax = {}
        # Go's reader, like tarfile, reads no data for links, directories, devices and FIFOs whatever the size says
        size = info.size if info.isreg() or info.type not in tarfile.SUPPORTED_TYPES else 0
        member = Member(stream, size, info.name)
        yield info, member
        member.skip()
        _skip(stream, -size % BLOCK)


def _skip(stream: _Chunks, n: int) -> None:
    if n and len(stream.read(n)) < n:
        raise TarStreamError("the archive ends inside a member's padding")


def _pax_records(data: bytes, at: int) -> Dict[str, str]:
    """The records of a pax extended header ("%d %s=%s\\n" each)."""
    out: Dict[str, str] = {}
    pos = 0
    while pos < len(data) and data[pos:pos + 1] != b"\0":
        space = data.find(b" ", pos)
        try:
            length = int(data[pos:space]) if space > pos else 0
        except ValueError:
            length = 0
        record = data[space + 1:pos + length]
        if length <= 0 or pos + length > len(data) or not record.endswith(b"\n") or b"=" not in record:
            raise TarStreamError(f"a broken pax header at byte {at}")
        key, _, value = record[:-1].partition(b"=")
        out[key.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "surrogateescape")
        pos += length
    return out
