"""A trusted copy of imgtool on the offline host: `self-install` and `self-update`.

A bundle's own load.sh and imgtool.pyz can only check the bundle for damage: whoever edits the
bundle on the way can edit them too. The copy that checks bundles must come from outside the
bundle it checks. The first contact is the operator's own: `sha256sum imgtool.pyz` against the
value published out of band (fetch prints it), then `python3 imgtool.pyz self-install` puts that
pyz under PREFIX/lib/imgtool/ and an `imgtool` launcher for this python3 in PREFIX/bin. From then
on the installed copy checks every bundle, and replaces itself only with a bundle's imgtool.pyz
after it verified that bundle itself: a signature under the site's allowed_signers policy, or
`--expect` (the bundle.json sha256 published with the release).

Offline side: Python 3.7 syntax and the standard library only.
"""

import hashlib
import json
import os
import re
import shlex
import sys
import zipfile
from pathlib import Path
from typing import NamedTuple, Optional

from . import __version__
from .bundle.format import TOOL_PYZ, parse_expect
from .bundle.reader import read_index
from .bundle.signature import enforce
from .errors import ImgtoolError, UsageError, VerifyError
from .fsutil import NotRegularFile, fsync_dir, open_regular, write_atomic
from .selfbundle import running_pyz
from .trust import State

LIB_DIR = Path("lib") / "imgtool"
BIN = Path("bin") / "imgtool"
MAX_PYZ = 256 * 1024 * 1024  # imgtool.pyz is about 1 MB; anything near this is not one


class Installed(NamedTuple):
    """What self-install or self-update put in place."""

    pyz: Path
    launcher: Optional[Path]  # None for self-update (the launcher stays)
    python: str
    sha256: str
    version: str
    previous: Optional[str] = None  # self-update: the version it replaced
    unchanged: Optional[str] = None  # self-update of the version installed already: why nothing was replaced

    def to_json(self) -> dict:
        return {"pyz": str(self.pyz), "launcher": str(self.launcher) if self.launcher else None,
                "python": self.python, "sha256": self.sha256, "version": self.version, "previous": self.previous,
                "updated": self.unchanged is None}


def pyz_version(data: bytes) -> str:
    """The imgtool version a pyz says it holds ("" when it says nothing readable)."""
    import io

    try:
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            return str(json.loads(z.read("imgtool-pyz.json").decode("utf-8")).get("imgtool_version") or "")
    except (KeyError, ValueError, zipfile.BadZipFile, AttributeError):
        return ""


def launcher_text(python: str, pyz: Path, version: str, sha256: str) -> str:
    return ("#!/bin/sh\n"
            f"# imgtool {version}, put here by `python3 imgtool.pyz self-install` (imgtool.pyz sha256 {sha256}).\n"
            "# It checks bundles; it is updated only by `imgtool self-update BUNDLE_DIR`, from a bundle it verified.\n"
            f"exec {shlex.quote(python)} -I {shlex.quote(str(pyz))} \"$@\"\n")


def self_install(prefix: Path, python: Optional[str] = None) -> Installed:
    """Copy the running imgtool.pyz to PREFIX/lib/imgtool/imgtool.pyz and write PREFIX/bin/imgtool, both
    atomically (running it again is harmless); raises UsageError (not run from a pyz), ImgtoolError."""
    src = running_pyz()
    if src is None:
        raise UsageError("self-install installs imgtool.pyz, and this imgtool does not run from one",
                         hint="run it from the bundle, after checking the file with sha256sum: "
                              "python3 DIR/imgtool.pyz self-install")
    python = python or sys.executable
    if not python or not os.path.isabs(python):
        raise UsageError("cannot tell which python3 runs this imgtool (sys.executable is empty)",
                         hint="run it as /usr/bin/python3 imgtool.pyz self-install")
    data = src.read_bytes()
    sha = hashlib.sha256(data).hexdigest()
    version = pyz_version(data) or __version__
    prefix = Path(os.path.abspath(str(prefix)))
    pyz, launcher = prefix / LIB_DIR / TOOL_PYZ, prefix / BIN
    try:
        for d in (pyz.parent, launcher.parent):
            d.mkdir(parents=True, exist_ok=True)
        if not (pyz.exists() and os.path.samefile(str(pyz), str(src))):
            write_atomic(pyz, data, 0o644)
            fsync_dir(pyz.parent)
        write_atomic(launcher, launcher_text(python, pyz, version, sha).encode(), 0o755)
        fsync_dir(launcher.parent)
    except OSError as e:
        raise ImgtoolError(f"cannot install into {prefix}: {e.strerror or e}",
                           hint="run it as root for /usr/local, or give --prefix a directory you can write "
                                "(e.g. --prefix ~/.local)") from e
    return Installed(pyz, launcher, python, sha, version)


def self_update(bundle_dir: Path, *, expect: Optional[str] = None, signers: Optional[str] = None,
                allow_downgrade: bool = False) -> Installed:
    """Replace the installed imgtool.pyz (the one running) with BUNDLE_DIR's, only when this copy verified the
    bundle: a signature the site's policy allows, or bundle.json matching --expect; the pyz must match what
    bundle.json records for it; an older imgtool only with `allow_downgrade` (the same version is left in place and
    `unchanged` says so). Raises UsageError, SignatureError/VerifyError (exit 3), ImgtoolError."""
    me = running_pyz()
    if me is None or me.parent.name != LIB_DIR.name or me.parent.parent.name != LIB_DIR.parent.name:
        where = me or Path(os.path.abspath(__file__)).parent
        raise UsageError(f"self-update updates an installed imgtool, and this one runs from {where}",
                         hint="install one first: check imgtool.pyz with sha256sum against the published value, "
                              "then python3 imgtool.pyz self-install")
    bundle_dir = Path(bundle_dir)
    index, raw = read_index(bundle_dir)
    sha = hashlib.sha256(raw).hexdigest()
    verdict = enforce(bundle_dir, raw, signers, doing="update")
    if expect is not None:
        if parse_expect(expect) != sha:
            raise VerifyError(f"refusing to update imgtool from {bundle_dir}: bundle.json does not match --expect "
                              f"(its sha256 is {sha}); nothing was updated",
                              hint="give the bundle.json sha256 published with this release")
    elif verdict.state is not State.TRUSTED:
        raise VerifyError(f"refusing to update imgtool from {bundle_dir}: nothing vouches for its bundle.json "
                          f"({verdict.message}); nothing was updated",
                          hint="give --expect SHA256 (the bundle.json sha256 published with the release), or sign "
                               "the bundle with a key the site's allowed_signers lists")
    entry = next((f for f in index.files if f.name == TOOL_PYZ), None)
    if entry is None:
        raise VerifyError(f"refusing to update imgtool from {bundle_dir}: the bundle carries no {TOOL_PYZ} "
                          "(made with --no-tool); nothing was updated")
    try:
        with open_regular(bundle_dir / TOOL_PYZ) as f:
            data = f.read(MAX_PYZ + 1)
    except NotRegularFile as e:
        raise VerifyError(f"refusing to update imgtool from {bundle_dir}: {TOOL_PYZ} is not a regular file "
                          f"({e.kind}); nothing was updated") from None
    except OSError as e:
        raise VerifyError(f"refusing to update imgtool from {bundle_dir}: cannot read {TOOL_PYZ} "
                          f"({e.strerror}); nothing was updated") from None
    if len(data) != entry.size or hashlib.sha256(data).hexdigest() != entry.sha256:
        raise VerifyError(f"refusing to update imgtool from {bundle_dir}: {TOOL_PYZ} does not match the verified "
                          "bundle.json (it was changed after the bundle was made); nothing was updated",
                          hint=f"copy {TOOL_PYZ} again from the source medium")
    previous, version = __version__, pyz_version(data)
    same = None if allow_downgrade else _refuse_older(bundle_dir, version, previous, me, entry.sha256)
    if same is not None:
        return Installed(me, None, sys.executable, entry.sha256, version, previous, same)
    try:
        write_atomic(me, data, 0o644)
        fsync_dir(me.parent)
    except OSError as e:
        raise ImgtoolError(f"cannot replace {me}: {e.strerror or e}",
                           hint="run it as the user who installed imgtool (root for /usr/local)") from e
    return Installed(me, None, sys.executable, entry.sha256, version or "?", previous)


def _refuse_older(bundle_dir: Path, version: str, installed: str, me: Path, sha256: str) -> Optional[str]:
    """Refuse a pyz older than the installed imgtool (a signed old release with a fixed hole is still signed), or
    one naming no version; for the same version, what to say instead of replacing it. Raises VerifyError."""
    key, mine = version_key(version), version_key(installed)
    if key is None or mine is None:
        raise VerifyError(f"refusing to update imgtool from {bundle_dir}: cannot compare its {TOOL_PYZ}'s version "
                          f"({version or 'none given'}) with this {installed}; nothing was updated",
                          hint="pass --allow-downgrade to install it anyway")
    if key < mine:
        raise VerifyError(f"refusing to update imgtool from {bundle_dir}: its {TOOL_PYZ} is imgtool {version}, older "
                          f"than this {installed}; nothing was updated",
                          hint="an older release may lack a fix; to go back on purpose pass --allow-downgrade")
    if key == mine:
        return (f"imgtool is already {installed} ({me}); nothing was updated"
                + ("" if _sha256_of(me) == sha256 else f" ({bundle_dir}'s {TOOL_PYZ} is another build of {version}: "
                   "--allow-downgrade installs it)"))
    return None


def _sha256_of(path: Path) -> str:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return ""


_VERSION = re.compile(r"^v?(\d+(?:\.\d+)*)(?:[-_.]?(a|alpha|b|beta|rc|c|pre|preview)[-_.]?(\d*))?"
                      r"(?:[-_.]?(post|rev|r)[-_.]?(\d*))?(?:[-_.]?(dev)[-_.]?(\d*))?(?:\+[a-z0-9.]+)?$", re.I)
_PRE = {"a": 0, "alpha": 0, "b": 1, "beta": 1, "rc": 2, "c": 2, "pre": 2, "preview": 2}


def version_key(text: str) -> Optional[tuple]:
    """A PEP 440 version as a key that sorts as pip does (1.0.dev1 < 1.0a1 < 1.0rc1 < 1.0 < 1.0.post1; the local
    part ignored); None when `text` is not one."""
    m = _VERSION.match(text.strip())
    if not m:
        return None
    release = tuple(int(x) for x in m.group(1).split("."))
    while len(release) > 1 and release[-1] == 0:
        release = release[:-1]
    pre = (_PRE[m.group(2).lower()], int(m.group(3) or 0)) if m.group(2) else (3, 0)  # 3: no pre-release sorts after
    post = int(m.group(5) or 0) if m.group(4) else -1
    dev = int(m.group(7) or 0) if m.group(6) else float("inf")
    if m.group(6) and not m.group(2) and not m.group(4):
        pre = (-1, 0)  # 1.0.dev1 sorts before 1.0a1
    return release, pre, post, dev
