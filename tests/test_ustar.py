"""Tar header bytes are imgtool's, not the running tarfile's: every Python writes and checks the same.

Before 3.9 `tarfile` wrote devmajor/devminor of a regular file as `0000000`; 3.9+ leaves them
empty. A bundle verified on Kylin's python3 3.7 must expect exactly the bytes the 3.9+ writer
put there, so bundle/ustar.py spells them out and these tests hold it to 3.9+'s tarfile and to
itself under every interpreter pyenv holds (3.6-3.13; a missing one fails the run).
"""

import json
import random
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from imgtool.bundle import layout, ustar
from tests.support.pythons import pyenv_python, pyenv_root

ROOT = Path(__file__).resolve().parents[1]
PYTHONS = ("3.6", "3.7", "3.8", "3.9", "3.10", "3.11", "3.12", "3.13")
GiB = 2 ** 30


def _cases():
    rng = random.Random(18)
    names = ["index.json", "manifest.json", "oci-layout", "x" * 99, "x" * 100, "y/" * 60 + "z", "bl\u00f6b/\u540d"]
    names += ["blobs/sha256/%064x" % rng.getrandbits(256) for _ in range(8)]
    sizes = [0, 1, 511, 512, 513, 4 * GiB - 1, 8 ** 11 - 1, 8 ** 11, 15 * GiB + 7]
    sizes += [rng.randrange(1, 2 ** 40) for _ in range(8)]
    return [(name, rng.choice(sizes)) for name in names] + [(names[7], size) for size in sizes]


CASES = _cases()


def _tarfile_header(name, size):
    """What imgtool's writer produced before ustar.py (tarfile on 3.9+): existing bundles hold these."""
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime, info.uid, info.gid = size, 0o644, 0, 0, 0
    info.uname = info.gname = ""
    info.type = tarfile.REGTYPE
    return info.tobuf(tarfile.PAX_FORMAT, "utf-8", "strict")


def test_headers_match_the_ones_bundles_already_hold():
    assert sys.version_info >= (3, 9)  # the test venv: its tarfile wrote every bundle so far
    for name, size in CASES:
        assert layout.header(name, size) == _tarfile_header(name, size), (name, size)
    # and they read back as the member they describe
    h = layout.header(CASES[7][0], 15 * GiB + 7)
    pax = tarfile.TarInfo.frombuf(h[:512], "utf-8", "strict")
    assert pax.type == tarfile.XHDTYPE and h[512:].startswith(b"20 size=16106127367\n")
    info = tarfile.TarInfo.frombuf(h[1024:], "utf-8", "strict")
    assert (info.name, info.mode, info.mtime, info.uid, info.gid, info.uname) == (CASES[7][0], 0o644, 0, 0, 0, "")


def _interpreter(version):
    found = pyenv_python(version)
    assert found, "python%s is not under %s/versions: the header test needs every interpreter" % (version, pyenv_root())
    return found


@pytest.mark.parametrize("version", PYTHONS)
def test_every_python_writes_the_same_header_bytes(version):
    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); from imgtool.bundle.ustar import header; "
            "print(json.dumps([header(n, s).hex() for n, s in json.loads(sys.stdin.read())]))")
    r = subprocess.run(["env", "-i", str(_interpreter(version)), "-I", "-c", code, str(ROOT)],
                       input=json.dumps(CASES), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == [_tarfile_header(n, s).hex() for n, s in CASES]


def test_a_negative_size_is_refused():
    with pytest.raises(ValueError, match="negative size"):
        ustar.header("a", -1)
