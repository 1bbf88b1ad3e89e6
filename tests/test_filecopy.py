"""filecopy.py: a file copied in the kernel from regions of other files, hashed from the copy (issue 48's placement)."""

import hashlib
import json
import os
import random
import subprocess
import tracemalloc
from pathlib import Path

import pytest

from imgtool import filecopy
from imgtool.filecopy import Regions, copy_regions
from tests.support.pythons import pyenv_python

ROOT = Path(__file__).resolve().parents[1]
WAYS = [("copy_file_range", "sendfile", "read"), ("sendfile", "read"), ("read",)]


def seeded(path: Path, size: int, seed: int) -> bytes:
    data = random.Random(seed).randbytes(size) if hasattr(random.Random, "randbytes") else \
        bytes(random.Random(seed).getrandbits(8) for _ in range(size))
    path.write_bytes(data)
    return data


def two_parts(tmp_path: Path):
    """A file's bytes spanning the end of one part and the start of the next, as an uncompressed bundle holds them."""
    a = seeded(tmp_path / "part001", 3 << 20, 1)
    b = seeded(tmp_path / "part002", 2 << 20, 2)
    want = a[1000:] + b[:(1 << 20) + 7]
    regions = Regions(((str(tmp_path / "part001"), 1000, len(a) - 1000), (str(tmp_path / "part002"), 0, (1 << 20) + 7)))
    return regions, want


@pytest.mark.parametrize("ways", WAYS, ids=lambda w: w[0])
def test_each_way_copies_the_regions_and_hashes_the_bytes_it_wrote(tmp_path, ways):
    regions, want = two_parts(tmp_path)
    out = tmp_path / "copy"
    header = b"blob %d\0" % len(want)
    with open(out, "wb") as f:
        got = copy_regions(regions, f.fileno(), str(out), header, methods=ways)
    assert out.read_bytes() == want
    assert got.size == len(want) == regions.size
    assert got.sha256 == hashlib.sha256(want).hexdigest()
    assert got.git_sha1 == hashlib.sha1(header + want).hexdigest()


@pytest.mark.parametrize("ways", WAYS, ids=lambda w: w[0])
def test_a_region_whose_file_is_shorter_ends_the_copy_there(tmp_path, ways):
    regions, want = two_parts(tmp_path)
    os.truncate(tmp_path / "part002", 5)
    out = tmp_path / "copy"
    with open(out, "wb") as f:
        got = copy_regions(regions, f.fileno(), str(out), methods=ways)
    assert got.size == len(want) - (1 << 20) - 2 and out.read_bytes() == want[:got.size]
    assert got.sha256 == hashlib.sha256(want[:got.size]).hexdigest() and got.git_sha1 is None


@pytest.mark.parametrize("ways", WAYS, ids=lambda w: w[0])
def test_memory_does_not_grow_with_the_file_size(tmp_path, ways):
    """64 MiB copied: at most a few read buffers of Python memory at any time (a 1 GB file takes the same)."""
    src = tmp_path / "big"
    with open(src, "wb") as f:
        f.truncate(64 << 20)  # sparse: no memory to make it
        f.seek(5 << 20)
        f.write(b"weights")
    out = tmp_path / "copy"
    tracemalloc.start()
    try:
        with open(out, "wb") as f:
            got = copy_regions(Regions(((str(src), 0, 64 << 20),)), f.fileno(), str(out), methods=ways)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert got.size == 64 << 20
    assert peak < 4 << 20, peak


def test_python_3_7_has_no_copy_file_range_and_copies_with_sendfile(tmp_path):
    """The pyz runs on Python 3.7: os.copy_file_range is 3.8's; the fallbacks place the same bytes."""
    regions, want = two_parts(tmp_path)
    out = tmp_path / "copy"
    script = ("import json, os, sys; sys.path.insert(0, sys.argv[1]); from imgtool.filecopy import Regions, copy_regions\n"
              "r = Regions(tuple(tuple(x) for x in json.loads(sys.argv[2])))\n"
              "f = open(sys.argv[3], 'wb'); c = copy_regions(r, f.fileno(), sys.argv[3]); f.close()\n"
              "print(hasattr(os, 'copy_file_range'), c.size, c.sha256)")
    python = pyenv_python("3.7")
    assert python, "python3.7 is not under pyenv's versions: the pyz places models on Kylin's 3.7 (never a skip)"
    r = subprocess.run([python, "-c", script, str(ROOT), json.dumps(regions.regions), str(out)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False", str(len(want)), hashlib.sha256(want).hexdigest()]
    assert out.read_bytes() == want


def test_the_ways_are_best_first():
    assert filecopy.METHODS == ("copy_file_range", "sendfile", "read")
