"""Tar header bytes as imgtool writes them, independent of the running Python's `tarfile`.

A bundle's archive is checked header byte by header byte, so those bytes must be the same on
every Python that reads it. `tarfile` before 3.9 wrote `0000000` into devmajor/devminor of a
regular file where 3.9+ writes NULs (bundles have always been written the 3.9+ way), so the
encoding is spelled out here: POSIX ustar, with a pax extended header only for what ustar
cannot hold (a name longer than 100 bytes or not ASCII, a size of 8 GiB or more). Standard
library only, no imports from imgtool: any python3 can run it.
"""

BLOCK = 512
MAGIC = b"ustar\x0000"  # POSIX magic "ustar\0" + version "00"
REGTYPE = b"0"
XHDTYPE = b"x"
PAX_NAME = "././@PaxHeader"
NAME_LENGTH = 100
SIZE_DIGITS = 12


def header(name: str, size: int, mode: int = 0o644) -> bytes:
    """The header block(s) of a regular file: uid/gid 0, no user names, mtime 0.

    Raises ValueError for a negative size.
    """
    if size < 0:
        raise ValueError("a tar member cannot have a negative size: %d" % size)
    pax = []
    if not _is_ascii(name) or len(name) > NAME_LENGTH:
        pax.append(("path", name))
    ustar_size = size
    if size >= 8 ** (SIZE_DIGITS - 1):
        pax.append(("size", str(size)))
        ustar_size = 0
    out = b""
    if pax:
        records = b"".join(_record(key, value) for key, value in pax)
        out = _block(PAX_NAME, 0, len(records), XHDTYPE) + records + bytes(-len(records) % BLOCK)
    return out + _block(name, mode, ustar_size, REGTYPE)


def _is_ascii(text: str) -> bool:
    try:  # str.isascii is 3.7+
        text.encode("ascii")
    except UnicodeEncodeError:
        return False
    return True


def _record(key: str, value: str) -> bytes:
    """One pax record, `<length> <key>=<value>\\n`, where length counts its own digits."""
    body = key.encode("utf-8") + b"=" + value.encode("utf-8") + b"\n"
    length = len(body) + 1  # the space after the length
    total = length + len(str(length))
    while total != length + len(str(total)):
        total = length + len(str(total))
    return str(total).encode("ascii") + b" " + body


def _text(value: str, length: int) -> bytes:
    raw = value.encode("ascii", "replace")[:length]
    return raw + bytes(length - len(raw))


def _octal(value: int, length: int) -> bytes:
    return ("%0*o" % (length - 1, value)).encode("ascii") + b"\x00"


def _block(name: str, mode: int, size: int, kind: bytes) -> bytes:
    fields = [
        _text(name, NAME_LENGTH),
        _octal(mode & 0o7777, 8),
        _octal(0, 8),  # uid
        _octal(0, 8),  # gid
        _octal(size, SIZE_DIGITS),
        _octal(0, 12),  # mtime
        b" " * 8,  # checksum, counted as spaces
        kind,
        bytes(100),  # linkname
        MAGIC,
        bytes(32),  # uname
        bytes(32),  # gname
        bytes(8),  # devmajor: empty for anything but a device
        bytes(8),  # devminor
        bytes(155),  # prefix
    ]
    block = b"".join(fields)
    block += bytes(BLOCK - len(block))
    checksum = sum(block)
    return block[:148] + ("%06o\x00 " % checksum).encode("ascii") + block[156:]
