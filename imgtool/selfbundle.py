"""imgtool.pyz: imgtool and its pure-Python dependencies in one zipapp, carried in every bundle.

An offline host has no package index, so the bundle brings the tool that reads it:
`python3 imgtool.pyz load .` (and the other offline verbs, and push) works with any CPython 3.7+ on
any architecture; fetch and the other connected verbs need 3.9+.

The pyz is built from what is installed in the running environment (importlib.metadata: each
distribution's file list), so building needs no network. Compiled extension files (.so/.pyd)
are left out; a package whose extension modules have no pure-Python twin is refused, except
zstandard, which imgtool imports only for zstd bundles (reader/writer say what to install when
it is missing), and isal (ISA-L's gzip), for which gz.py uses zlib: the same results, slower.
Entries are sorted, timestamps fixed at 1980-01-01, modes fixed, compression level fixed: the
same installed versions give a byte-identical pyz. Built pyz files are kept in `$IMGTOOL_CACHE/tool/`,
keyed by imgtool's sources and the dependencies' versions.
"""

import hashlib
import io
import json
import os
import re
import zipfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Dict, FrozenSet, List, Optional, Set, Tuple

from . import __version__
from .bundle.format import TOOL_PYZ as TOOL_NAME
from .errors import ImgtoolError
from .fsutil import write_atomic

# imgtool's runtime dependencies as pyproject.toml lists them (tests hold the two together);
# their own requirements are followed from the installed metadata.
ROOTS = ("click", "requests", "urllib3", "docker", "tqdm", "tomli", "idna")  # idna: pinned for requests (pyproject.toml)
# Compiled, and imported only where needed: left out of the pyz on purpose.
LAZY = ("zstandard", "isal")  # isal: gz.py falls back to zlib (the same bytes, slower)
MIN_PYTHON = (3, 9)
# The offline verbs (verify, load, doctor, inventory, presets, run-flags, run, diff) and push run on
# 3.7 too: Kylin V10's system python3. commands/main.py refuses the others below 3.9; runtimes/docker.py and registry.py
# speak to Docker and to registries over the standard library there.
OFFLINE_MIN_PYTHON = (3, 7)
BUILD_FORMAT = 2  # bump when what goes into the pyz changes: part of the cache key
ZIP_TIME = (1980, 1, 1, 0, 0, 0)
ZIP_LEVEL = 9
SHEBANG = b"#!/usr/bin/env python3\n"
_EXTENSIONS = (".so", ".pyd", ".dylib", ".dll")
_SKIP_SUFFIXES = (".pyc", ".pyo", ".pyi") + _EXTENSIONS
_LICENSE = re.compile(r"^(LICEN[CS]E|COPYING|NOTICE|AUTHORS)", re.IGNORECASE)
_MAIN = """# imgtool.pyz: imgtool {version} with its pure-Python dependencies (imgtool self-bundle).
import sys

if sys.version_info < {min_python!r}:
    sys.stderr.write("error: imgtool.pyz needs Python {min_text} or newer; this is Python %d.%d\\n"
                     "hint: run it with a newer python3, or load the bundle with: sh load.sh\\n"
                     % sys.version_info[:2])
    sys.exit(1)

from imgtool.cli import main

main()
"""


@dataclass
class Package:
    """One distribution going into the pyz: its entries (name in the zip -> file on disk)."""

    name: str
    version: str
    requires_python: str
    files: Dict[str, Path] = field(default_factory=dict)


@dataclass
class ToolBuild:
    """A built imgtool.pyz and what is in it."""

    path: Path
    size: int
    sha256: str
    version: str
    packages: Dict[str, str]  # distribution -> version
    min_python: Tuple[int, int]  # every verb runs from here on
    cached: bool = False
    notes: List[str] = field(default_factory=list)  # what went in how (pure-Python fallbacks)
    warnings: List[str] = field(default_factory=list)  # a packed package raises the Python the pyz needs

    @property
    def start_python(self) -> Tuple[int, int]:
        """The oldest Python the pyz starts on (the offline verbs and push; see _gate)."""
        return _gate(self.min_python)

    def python_text(self) -> str:
        """Which Python runs what, in a few words: "Python 3.7+ (offline verbs and push; every verb on 3.9+)"."""
        low, every = self.start_python, self.min_python
        if low == every:
            return "Python %d.%d+" % every
        return "Python %d.%d+ (offline verbs and push; every verb on %d.%d+)" % (low + every)

    def to_json(self) -> dict:
        return {"path": str(self.path), "size": self.size, "sha256": self.sha256, "imgtool_version": self.version,
                "requires_python": ">=%d.%d" % self.start_python,
                "requires_python_every_verb": ">=%d.%d" % self.min_python, "packages": dict(self.packages),
                "cached": self.cached}


def _gate(min_python: Tuple[int, int]) -> Tuple[int, int]:
    """The oldest Python the pyz lets in: 3.7 while its packages allow imgtool's own floor, else theirs."""
    return OFFLINE_MIN_PYTHON if min_python <= MIN_PYTHON else min_python


def collect() -> Tuple[List[Package], List[str]]:
    """imgtool's own package and its installed dependencies; raises ImgtoolError when one is
    missing or needs compiled code."""
    from importlib import metadata

    notes: List[str] = []
    own = Package("imgtool", __version__, ">=%d.%d" % MIN_PYTHON, _own_files())
    packages: Dict[str, Package] = {}
    todo = [(name, "imgtool") for name in ROOTS]
    while todo:
        name, wanted_by = todo.pop(0)
        key = _norm(name)
        if key in packages or key in LAZY:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            raise ImgtoolError(f"cannot build {TOOL_NAME}: {name} (needed by {wanted_by}) is not installed here",
                               hint=f"pip install {name}, or pass --no-tool") from None
        packages[key] = pkg = _package(dist, notes)
        for req in map(Requirement.parse, dist.requires or ()):
            if req.for_extra or req.not_for_linux or _norm(req.name) in packages:
                continue
            try:
                metadata.distribution(req.name)
            except metadata.PackageNotFoundError:
                if req.conditional:  # e.g. colorama on Windows only: not for this kind of host
                    continue
            todo.append((req.name, pkg.name))
    return [own] + [packages[k] for k in sorted(packages)], notes


def build(out: Path) -> ToolBuild:
    """Build imgtool.pyz at `out` (atomically); raises ImgtoolError."""
    running = running_pyz()
    if running is not None:  # imgtool runs from a pyz: that file is the tool, copied as it is
        return _copy(running, Path(out))
    packages, notes = collect()
    return _write(Path(out), packages, notes)


def running_pyz() -> Optional[Path]:
    """The imgtool.pyz this process runs from, if it does (its installed files are not on disk)."""
    here = Path(os.path.abspath(__file__))
    for parent in here.parents:
        if parent.is_file():
            return parent if zipfile.is_zipfile(parent) else None
    return None


def _copy(src: Path, out: Path) -> ToolBuild:
    data = src.read_bytes()
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            manifest = json.loads(z.read("imgtool-pyz.json"))
        # pyz files written before the key existed said the every-verb floor in requires_python
        every = manifest.get("requires_python_every_verb") or manifest["requires_python"]
        major, minor = (int(x) for x in every.lstrip(">=").split(".")[:2])
    except (KeyError, ValueError, zipfile.BadZipFile) as e:
        raise ImgtoolError(f"cannot read {src} as {TOOL_NAME}: {e}") from e
    if out.resolve() != src.resolve():
        _write_file(out, data)
    return ToolBuild(out, len(data), hashlib.sha256(data).hexdigest(), manifest["imgtool_version"],
                     dict(manifest["packages"]), (major, minor), cached=True)


def cached_tool(cache_root: Path) -> ToolBuild:
    """imgtool.pyz from `$IMGTOOL_CACHE/tool/`, built there first if these versions have none."""
    running = running_pyz()
    if running is not None:
        return _copy(running, running)
    packages, notes = collect()
    path = Path(cache_root) / "tool" / f"imgtool-{__version__}-{_cache_key(packages)[:16]}.pyz"
    if path.is_file():
        data = path.read_bytes()
        return ToolBuild(path, len(data), hashlib.sha256(data).hexdigest(), __version__, _versions(packages),
                         _min_python(packages), cached=True, notes=notes, warnings=_python_warnings(packages))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ImgtoolError(f"cannot create {path.parent} for {TOOL_NAME}: {e.strerror}",
                           hint="point IMGTOOL_CACHE somewhere writable, or pass --no-tool") from e
    return _write(path, packages, notes)


def _write(out: Path, packages: List[Package], notes: List[str]) -> ToolBuild:
    min_python = _min_python(packages)
    entries: Dict[str, bytes] = {}
    for pkg in packages:
        for arcname, src in pkg.files.items():
            try:
                entries[arcname] = src.read_bytes()
            except OSError as e:
                raise ImgtoolError(f"cannot build {TOOL_NAME}: cannot read {src} ({pkg.name}): {e.strerror}") from e
    gate = _gate(min_python)
    entries["__main__.py"] = _MAIN.format(version=__version__, min_python=gate, min_text="%d.%d" % gate).encode()
    manifest = {"imgtool_version": __version__, "requires_python": ">=%d.%d" % gate,
                "requires_python_every_verb": ">=%d.%d" % min_python,
                "packages": _versions(packages), "left_out": list(LAZY)}
    entries["imgtool-pyz.json"] = (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode()
    buf = io.BytesIO()
    buf.write(SHEBANG)
    with zipfile.ZipFile(buf, "w") as z:
        for name in sorted(entries):
            info = zipfile.ZipInfo(name, date_time=ZIP_TIME)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.create_system = 3  # unix, so the mode below is the one an unzip applies
            info.external_attr = 0o100644 << 16
            z.writestr(info, entries[name], compresslevel=ZIP_LEVEL)
    data = buf.getvalue()
    _write_file(out, data)
    return ToolBuild(out, len(data), hashlib.sha256(data).hexdigest(), __version__, _versions(packages),
                     min_python, notes=notes, warnings=_python_warnings(packages))


def _write_file(out: Path, data: bytes) -> None:
    try:
        write_atomic(out, data, 0o755)
    except OSError as e:
        raise ImgtoolError(f"cannot write {out}: {e.strerror}") from e


def _own_files() -> Dict[str, Path]:
    """imgtool's package directory as it is (works for editable installs and source trees)."""
    root = Path(__file__).resolve().parent
    out = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if (path.is_file() and "__pycache__" not in rel.parts and not rel.name.startswith(".")
                and not rel.name.endswith(_SKIP_SUFFIXES)):
            out["imgtool/" + rel.as_posix()] = path
    return out


def _package(dist, notes: List[str]) -> Package:
    """A distribution's importable files plus METADATA and licenses; refuses required compiled code."""
    # METADATA read once: each `dist.metadata` or `dist.version` parses the whole file (long descriptions
    # included) again, and asking once per file cost a fetch ~0.25 CPU s
    meta = dist.metadata
    name, version = meta["Name"], meta["Version"]
    files = dist.files
    if files is None:
        raise ImgtoolError(f"cannot build {TOOL_NAME}: {name} {version} was installed without a file list",
                           hint=f"reinstall it with pip (pip install --force-reinstall {name}), or pass --no-tool")
    pkg = Package(name, version, meta.get("Requires-Python") or "")
    names = {PurePosixPath(str(f)).as_posix() for f in files}
    for rel in sorted(names):
        if _carried(rel, names, name, version):
            pkg.files[rel] = Path(dist.locate_file(rel))
    if any(r.endswith(_EXTENSIONS) for r in names):
        notes.append(f"{TOOL_NAME}: {name} {version} goes in without its compiled speed-ups (pure Python)")
    return pkg


def _carried(rel: str, names: Set[str], name: str, version: str) -> bool:
    """Whether a distribution's file goes into the pyz: its modules and data, METADATA and licenses; not
    scripts, byte code, .pth files nor compiled speed-ups of pure modules. Raises ImgtoolError for compiled
    code with no pure-Python twin."""
    parts = PurePosixPath(rel).parts
    if not parts or parts[0] in ("..", "") or "__pycache__" in parts:
        return False  # scripts in bin/, byte code
    if parts[0].endswith(".dist-info"):
        return bool(rel.endswith("/METADATA") and len(parts) == 2 or _LICENSE.match(parts[-1])
                    or (len(parts) > 2 and parts[1] == "licenses"))
    if rel.endswith(_EXTENSIONS):
        module = rel.rsplit("/", 1)[-1].split(".", 1)[0]
        twin = (rel.rsplit("/", 1)[0] + "/" if "/" in rel else "") + module + ".py"
        if not module.endswith("__mypyc") and twin not in names:  # mypyc helpers serve the .so files only
            raise ImgtoolError(f"cannot build {TOOL_NAME}: {name} {version} needs compiled code ({rel}) that has no "
                               f"pure-Python version",
                               hint=f"install a pure-Python release of {name}, or pass --no-tool")
        return False
    return not (rel.endswith(_SKIP_SUFFIXES) or rel.endswith(".pth"))


# A PEP 508 marker's tokens: a quoted string, a name (a marker variable or and/or/in/not), or operators
_MARKER_TOKEN = re.compile(r"""'[^']*'|"[^"]*"|([A-Za-z_][A-Za-z0-9_.]*)|[^\s'"A-Za-z_]+""")


@dataclass(frozen=True)
class Requirement:
    """One Requires-Dist line: the distribution it names and the variables its marker tests.

    Markers are read, never evaluated: the pyz runs on Pythons other than the one building it,
    so a dependency for `python_version < "3.11"` goes in whenever it is installed here."""

    name: str
    variables: FrozenSet[str]  # e.g. {"extra"}, {"python_version", "sys_platform"}; empty: unconditional
    marker: str = field(default="", compare=False)  # the marker's text, for not_for_linux

    @classmethod
    def parse(cls, text: str) -> "Requirement":
        """`name[extra] (>=1); marker`."""
        spec, _, marker = text.partition(";")
        m = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", spec)
        names = {t.group(1) for t in _MARKER_TOKEN.finditer(marker) if t.group(1)}
        return cls(m.group(1) if m else spec.strip(), frozenset(names - {"and", "or", "in", "not"}), marker.strip())

    @property
    def for_extra(self) -> bool:
        """Wanted only with an extra (`; extra == "socks"`): imgtool asks for none."""
        return "extra" in self.variables

    @property
    def conditional(self) -> bool:
        return bool(self.variables)

    @property
    def not_for_linux(self) -> bool:
        """A marker on the platform alone that never names Linux or POSIX (`platform_system == "Windows"`: tqdm's
        colorama): the pyz runs on Linux hosts only, so it stays out even where it is installed here."""
        platform_only = self.variables and self.variables <= {"platform_system", "sys_platform", "os_name"}
        return bool(platform_only) and not re.search(r"linux|posix", self.marker, re.IGNORECASE)


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _versions(packages: List[Package]) -> Dict[str, str]:
    return {p.name: p.version for p in packages}


def _lower_bound(spec: str) -> Tuple[int, int]:
    """The lowest Python a Requires-Python allows (only >=, >, ~= and == bounds matter here)."""
    best = MIN_PYTHON
    for item in spec.split(","):
        m = re.match(r"\s*(>=|~=|==|>)\s*(\d+)\.(\d+)", item)
        if m:
            bound = (int(m.group(2)), int(m.group(3)))
            best = max(best, bound)
    return best


def _min_python(packages: List[Package]) -> Tuple[int, int]:
    return max(_lower_bound(p.requires_python) for p in packages)


def _python_warnings(packages: List[Package]) -> List[str]:
    """The warning when a packed dependency needs a newer Python than imgtool's 3.9."""
    low = _min_python(packages)
    if low <= MIN_PYTHON:
        return []
    newer = ", ".join(f"{p.name} {p.version}" for p in packages if _lower_bound(p.requires_python) == low)
    return [f"{TOOL_NAME} needs Python {low[0]}.{low[1]}+ because of {newer}; "
            "install imgtool's pinned dependencies (pip install .) for a pyz that runs on Python 3.9"]


def _cache_key(packages: List[Package]) -> str:
    """Versions of the dependencies, plus imgtool's own file contents (its version does not
    change with every edit of a source checkout)."""
    h = hashlib.sha256(json.dumps([BUILD_FORMAT, ZIP_LEVEL, _versions(packages)], sort_keys=True).encode())
    own = packages[0]
    for arcname in sorted(own.files):
        h.update(arcname.encode() + b"\0" + own.files[arcname].read_bytes() + b"\0")
    return h.hexdigest()


def bundle_tool(cache: Path, progress) -> Dict[str, Path]:
    """`write_bundle(extra_files=...)` for fetch and export: {"imgtool.pyz": the pyz cached under `cache`
    (the blob store's root)}; raises ImgtoolError."""
    tool = cached_tool(cache)
    for warning in tool.warnings:
        progress.warn(warning)
    for note in tool.notes if not tool.cached else ():
        progress.note(note)
    progress.note(f"{TOOL_NAME}: imgtool {tool.version}, {tool.size // 1024} KiB, {tool.python_text()}"
                  + (" (cached)" if tool.cached else ""))
    return {TOOL_NAME: tool.path}
