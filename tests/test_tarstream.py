"""tarstream: docker save's archive read as it streams, against archives Python's tarfile writes (ustar, GNU and pax
forms), cut into chunks of every awkward size; and the errors of a stream that is cut short or damaged."""

import io
import random
import tarfile

import pytest

from imgtool import tarstream


class Kind:
    """An entry without data: a directory or a link (tarfile's types are bytes too, so they are wrapped)."""

    def __init__(self, type_: bytes):
        self.type = type_


def _archive(entries, fmt=tarfile.PAX_FORMAT) -> bytes:
    """A tar of (name, data or Kind) entries, written by tarfile in `fmt`."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tar:
        for name, data in entries:
            info = tarfile.TarInfo(name)
            if isinstance(data, bytes):
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            else:
                info.type = data.type
                if data.type == tarfile.SYMTYPE:
                    info.linkname = "elsewhere"
                tar.addfile(info)
    return buf.getvalue()


def _chunks(data: bytes, sizes):
    """`data` cut at sizes taken in turn from `sizes`."""
    at, i = 0, 0
    while at < len(data):
        n = sizes[i % len(sizes)]
        yield data[at:at + n]
        at, i = at + n, i + 1


def _read_all(chunks, piece: int = 1000):
    out = []
    for info, member in tarstream.members(chunks):
        data = b"".join(iter(lambda m=member: m.read(piece), b""))
        out.append((info.name, info.type, data))
    return out


RNG = random.Random(38)
LAYER = bytes(RNG.getrandbits(8) for _ in range(70_001))
ENTRIES = [
    ("manifest.json", b'[{"Config":"c.json"}]'),
    ("0123456789abcdef", Kind(tarfile.DIRTYPE)),
    ("0123456789abcdef/layer.tar", LAYER),
    ("0123456789abcdef/json", b"{}"),
    ("link", Kind(tarfile.SYMTYPE)),
    ("empty", b""),
    ("blobs/sha256/" + "ab" * 40 + "/a name longer than a hundred bytes", b"x" * 513),
    ("名前", b"non-ascii name"),
]


@pytest.mark.parametrize("fmt", [tarfile.PAX_FORMAT, tarfile.GNU_FORMAT])
@pytest.mark.parametrize("sizes", [[1], [7, 512, 3], [512], [32768], [10**7], [4096, 1, 65536, 511]])
def test_every_member_comes_out_whole_whatever_the_chunks(fmt, sizes):
    data = _archive(ENTRIES, fmt)
    got = _read_all(_chunks(data, sizes))
    want = [(name, (body if isinstance(body, bytes) else b"")) for name, body in ENTRIES]
    assert [(name, body) for name, _, body in got] == want
    assert [t for _, t, _ in got][1::3] == [tarfile.DIRTYPE, tarfile.SYMTYPE, tarfile.REGTYPE]


def test_what_a_caller_leaves_unread_is_skipped():
    data = _archive(ENTRIES)
    names, firsts = [], []
    for info, member in tarstream.members(_chunks(data, [300])):
        names.append(info.name)
        if info.name.endswith("layer.tar"):
            firsts.append(member.read(10))  # the rest is skipped for the caller
    assert names == [name for name, _ in ENTRIES]
    assert firsts == [LAYER[:10]]


def test_a_read_of_exactly_one_whole_chunk_is_that_chunk_not_a_copy():
    head = _archive([("big", bytes(4096))])[:512]
    body = bytes(range(256)) * 16  # 4096 bytes, the member's whole data in one chunk
    chunks = [head, body, bytes(1024)]
    for _, member in tarstream.members(chunks):
        assert member.read(4096) is body


def test_a_pax_size_beyond_the_ustar_field_is_honoured():
    # tarfile writes a pax `size` record only from 8 GiB on: build the header by hand, with a small size
    pax = b"13 size=1025\n"
    header = tarfile.TarInfo("././@PaxHeader")
    header.type, header.size = tarfile.XHDTYPE, len(pax)
    member = tarfile.TarInfo("layer.tar")
    member.size = 0  # the ustar field says 0; the pax record says 1025
    stream = (header.tobuf(tarfile.USTAR_FORMAT) + pax + bytes(-len(pax) % 512)
              + member.tobuf(tarfile.USTAR_FORMAT) + b"y" * 1025 + bytes(-1025 % 512) + bytes(1024))
    assert _read_all([stream]) == [("layer.tar", tarfile.REGTYPE, b"y" * 1025)]


def test_the_end_blocks_end_the_archive_and_the_rest_of_the_stream_is_read():
    finished = []

    def source():
        yield _archive([("a", b"1")])
        yield b"trailing bytes a daemon might send"
        finished.append(True)

    assert [(n, d) for n, _, d in _read_all(source())] == [("a", b"1")]
    assert finished == [True]


def test_a_stream_without_end_blocks_ends_where_it_ends():
    data = _archive([("a", b"1"), ("b", b"22")])
    cut = data.index(b"22") + 512  # b's data and padding, no end blocks
    assert [(n, d) for n, _, d in _read_all([data[:cut]])] == [("a", b"1"), ("b", b"22")]


def test_a_stream_cut_inside_a_member_names_it_and_what_is_missing():
    data = _archive([("blobs/sha256/aa", LAYER)])
    with pytest.raises(tarstream.TarStreamError) as e:
        _read_all(_chunks(data[:512 + 1000], [333]))
    assert str(e.value) == f"the archive ends inside blobs/sha256/aa ({len(LAYER) - 1000} bytes missing)"


def test_a_stream_cut_inside_a_header_or_padding_says_so():
    data = _archive([("a", b"1"), ("b", b"2")])
    with pytest.raises(tarstream.TarStreamError, match=r"^the archive ends inside a header \(at byte 1024\)$"):
        _read_all([data[:1024 + 100]])
    with pytest.raises(tarstream.TarStreamError, match=r"^the archive ends inside a member's padding$"):
        _read_all([data[:512 + 100]])


def test_a_damaged_header_is_refused_with_its_place():
    data = bytearray(_archive([("a", b"1"), ("b", b"2")]))
    data[1024 + 10] ^= 0xFF  # b's name: the checksum no longer matches
    with pytest.raises(tarstream.TarStreamError, match=r"^a broken tar header at byte 1024 \(bad checksum\)$"):
        _read_all([bytes(data)])


def test_a_broken_pax_header_is_refused():
    pax = b"99 path=x\n"  # says 99 bytes, holds 10
    header = tarfile.TarInfo("././@PaxHeader")
    header.type, header.size = tarfile.XHDTYPE, len(pax)
    stream = header.tobuf(tarfile.USTAR_FORMAT) + pax + bytes(-len(pax) % 512) + bytes(1024)
    with pytest.raises(tarstream.TarStreamError, match=r"^a broken pax header at byte 0$"):
        _read_all([stream])


def test_an_error_of_the_chunks_source_comes_through_as_it_is():
    class Gone(Exception):
        pass

    def source():
        yield _archive([("a", LAYER)])[:4096]
        raise Gone("the daemon went away")

    with pytest.raises(Gone, match="the daemon went away"):
        _read_all(source())
