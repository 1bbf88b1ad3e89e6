"""Release bundles described in files: the bundle spec (bundle.toml) and its lock (bundle.lock).

A spec says what goes into a bundle (images, models, platforms, chunk size, compression, output
name, mirrors); the lock, written next to it by `imgtool lock`, pins every image to the
digest of its index and of each platform manifest, and every model to its commit and each
file's size and sha256, so a rebuild fetches exactly the same bytes after tags and branches
move. Pure values and (de)serialisation; reading the files is the only I/O. What `lock --update`
changed is lock.py's. Errors name the file, the line or key, and exit 2. See docs/release.md.
"""

import calendar
import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from .bundle.format import COMPRESSIONS
from .config import MirrorConfig, parse_chunk_size, read_toml, toml_fail
from .errors import ConfigError, UsageError, VerifyError
from .fsutil import write_atomic
from .model import UTC_TIME, Digest, ImageRef, Platform, PulledImage, json_object, utc_time
from .schema import Invalid, Key, Table, one_of

LOCK_NAME = "bundle.lock"
LOCK_VERSION = 1
MAX_LOCK_BYTES = 4 * 1024 * 1024

@dataclass(frozen=True)
class Spec:
    """A parsed bundle.toml: what to put into the bundle and how to cut it."""

    path: Path
    images: Tuple[str, ...]  # as written: tags or references
    platforms: Tuple[Platform, ...]
    output: Optional[str] = None  # relative to the current directory, like -o
    chunk_size: Optional[int] = None
    compress: str = "none"
    mirrors: Optional[str] = None  # mirrors.toml, resolved relative to the spec file
    mirror: str = "auto"
    models: Tuple[str, ...] = ()  # hf:ORG/NAME[@REV], modelscope:...: each as weights.ModelRef prints it

    @property
    def lock_path(self) -> Path:
        return self.path.with_name(LOCK_NAME)


def _images(values: List[Any]) -> Tuple[str, ...]:
    if not values or not all(isinstance(x, str) and x.strip() for x in values):
        raise Invalid()
    seen: List[str] = []
    for text in values:
        if text.strip() in seen:
            raise UsageError(f"image {text!r} is listed twice")
        ImageRef.parse(text)
        seen.append(text.strip())
    return tuple(seen)


def _models(values: List[Any]) -> Tuple[str, ...]:
    from .weights import parse_model_ref

    if not all(isinstance(x, str) and x.strip() for x in values):
        raise Invalid()
    seen: List[str] = []
    for text in values:
        ref = parse_model_ref(text.strip()).asked
        if ref in seen:
            raise UsageError(f"model {text!r} is listed twice")
        seen.append(ref)
    return tuple(seen)


def _platforms(value: Union[str, List[Any]]) -> Tuple[Platform, ...]:
    values = [value] if isinstance(value, str) else value
    if not values or not all(isinstance(x, str) for x in values):
        raise Invalid()
    platforms: List[Platform] = []
    for text in values:
        p = Platform.parse(text)
        if p in platforms:
            raise UsageError(f"platform {p} is listed twice")
        platforms.append(p)
    return tuple(platforms)


def _text(value: str) -> str:
    if not value.strip():
        raise Invalid()
    return value


_PLATFORMS_WRONG = '{key} must be a non-empty array of strings like "arm64" or "linux/arm64"'
_SPEC = Table(
    Key("images", list, check=_images, wrong="images must be a non-empty array of image references (strings)"),
    Key("models", list, check=_models,
        wrong='models must be an array of model references (strings like "hf:ORG/NAME@REVISION")'),
    Key("arch", (str, list), check=_platforms, wrong=_PLATFORMS_WRONG),
    Key("platforms", (str, list), check=_platforms, wrong=_PLATFORMS_WRONG),
    Key("output", str, check=_text, what="a non-empty string"),
    Key("chunk_size", (str, int), check=lambda v: parse_chunk_size(str(v), "chunk_size"),
        wrong='chunk_size must be a size like "4G" or a number of bytes'),
    Key("compress", check=one_of(COMPRESSIONS, "invalid compress {value!r}: use one of {choices}")),
    Key("mirrors", str, check=_text, what="a non-empty string"),
    Key("mirror", str, check=_text, what="a non-empty string"),
)


def parse_spec(data: Dict[str, Any], text: str, path: Path) -> Spec:
    """Validate a loaded bundle.toml; raises ConfigError naming file, line and key."""
    fail = toml_fail(path, text)
    values = _SPEC.check(data, fail)
    if not values.get("images") and not values.get("models"):
        fail(None, 'missing key \'images\' (e.g. images = ["v0.22.1rc1", "v0.22.1rc1-a3"]) or \'models\' '
                   '(e.g. models = ["hf:Qwen/Qwen3-8B"])')
    if "arch" in values and "platforms" in values:
        fail("platforms", "use arch or platforms, not both")
    platforms = values.get("platforms", values.get("arch"))
    if platforms is None and values.get("images"):
        fail(None, 'missing key \'arch\' (e.g. arch = ["arm64", "amd64"]); a release bundle names its platforms')
    mirrors = values.get("mirrors")
    if mirrors:
        mirrors = str((path.parent / os.path.expanduser(mirrors)).resolve())
    return Spec(path, values.get("images", ()), platforms or (), values.get("output"), values.get("chunk_size"),
                values.get("compress", "none"), mirrors, values.get("mirror", "auto"), values.get("models", ()))


def load_spec(path: str) -> Spec:
    """Read and validate a bundle spec; raises ConfigError."""
    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"{p} is a directory: give the bundle spec file (e.g. {p / 'bundle.toml'})")
    data, text = read_toml(p)
    return parse_spec(data, text, p)


# --- the lock ------------------------------------------------------------------------------


@dataclass(frozen=True)
class LockedImage:
    """One spec image pinned: the digest its tag meant, and each platform's manifest digest."""

    ref: str  # as written in the spec
    name: str  # canonical: quay.io/ascend/vllm-ascend:v0.22.1rc1
    digest: Digest  # what the tag pointed at (an index, or a single-platform manifest)
    manifests: Tuple[Tuple[str, Digest], ...]  # (platform, manifest digest), in the spec's order
    source: str = ""  # which mirror answered when it was locked

    def manifest_for(self, platform: Platform) -> Optional[Digest]:
        return dict(self.manifests).get(str(platform))

    def to_json(self) -> dict:
        return {"ref": self.ref, "name": self.name, "digest": str(self.digest),
                "platforms": {p: str(d) for p, d in self.manifests}, "source": self.source}


@dataclass(frozen=True)
class LockedModel:
    """One spec model pinned: the commit its revision meant, and each file's size and sha256 (issue 48)."""

    ref: str  # as written in the spec: hf:ORG/NAME[@REVISION]
    commit: str
    files: Tuple[Tuple[str, int, Digest], ...]  # (path, size, sha256), in path order
    source: str = ""

    def to_json(self) -> dict:
        return {"ref": self.ref, "commit": self.commit, "source": self.source,
                "files": [{"path": p, "size": n, "sha256": str(d)} for p, n, d in self.files]}


@dataclass(frozen=True)
class Lock:
    """A parsed bundle.lock."""

    path: Path
    platforms: Tuple[str, ...]
    images: Tuple[LockedImage, ...]
    models: Tuple[LockedModel, ...] = ()

    def to_bytes(self) -> bytes:
        doc: Dict[str, Any] = {"lock_version": LOCK_VERSION, "platforms": list(self.platforms),
                               "images": [im.to_json() for im in self.images]}
        if self.models:
            doc["models"] = [m.to_json() for m in self.models]
        return (json.dumps(doc, indent=2) + "\n").encode()

    def model_pins(self) -> Dict[str, str]:
        """Model reference as written -> pinned commit, for fetch."""
        return {m.ref: m.commit for m in self.models}

    def check_model(self, ref: str, files: Sequence[Tuple[str, int, Optional[Digest]]]) -> None:
        """A resolved model's files must be those the lock pins (path, size, sha256): a hub listing other bytes
        for the pinned commit is refused, naming the files. Raises VerifyError (exit 3)."""
        locked = next((m for m in self.models if m.ref == ref), None)
        if locked is None:
            return
        got = {p: (n, d) for p, n, d in files}
        want = {p: (n, d) for p, n, d in locked.files}
        differ = sorted(p for p in set(got) | set(want) if got.get(p) != want.get(p))
        if not differ:
            return
        first = differ[0]
        if first not in got:
            why = f"{first}: pinned by the lock, not listed by the hub"
        elif first not in want:
            why = f"{first}: listed by the hub, not pinned by the lock"
        else:
            why = (f"{first}: the hub lists {got[first][1]} ({got[first][0]} bytes), the lock pins "
                   f"{want[first][1]} ({want[first][0]} bytes)")
        more = f" (and {len(differ) - 1} more: {', '.join(differ[1:4])}{' ...' if len(differ) > 4 else ''})" \
            if len(differ) > 1 else ""
        raise VerifyError(f"{ref} at commit {locked.commit[:12]}: {why}{more}; refused",
                          hint=f"the hub's files changed under a pinned commit: try another endpoint with --mirror "
                               f"NAME; if the change is wanted, imgtool lock --update (pins in {self.path})")

    def pins(self) -> Dict[str, Digest]:
        """Canonical name -> pinned digest, for fetch."""
        return {im.name: im.digest for im in self.images}

    def by_name(self) -> Dict[str, LockedImage]:
        return {im.name: im for im in self.images}

    def check(self, image: PulledImage, platform: Platform) -> None:
        """A pulled image must be the platform manifest the lock pins; raises ConfigError."""
        ref, names = image.ref, self.by_name()
        name = str(ref) if str(ref) in names or not ref.tag else str(ref.with_digest(None))
        locked = names.get(name)
        want = locked.manifest_for(platform) if locked else None
        if want is None:
            raise ConfigError(f"{self.path}: no {platform} manifest pinned for {name}",
                              hint="run imgtool lock --update -f SPEC")
        if want != image.manifest_digest:
            raise ConfigError(f"{self.path}: {name} {platform} resolved to {image.manifest_digest}, "
                              f"but the lock pins {want}", hint="run imgtool lock --update -f SPEC")

    def mismatch(self, spec: Spec, config: MirrorConfig) -> Optional[str]:
        """Why this lock does not fit `spec` (images or platforms changed), or None."""
        want = [_canonical(config, r) for r in spec.images]
        have = [im.name for im in self.images]
        plats = [str(p) for p in spec.platforms]
        why = []
        added = [n for n in want if n not in have]
        gone = [n for n in have if n not in want]
        if added:
            why.append("not locked: " + ", ".join(added))
        if gone:
            why.append("no longer in the spec: " + ", ".join(gone))
        if sorted(plats) != sorted(self.platforms):
            why.append(f"platforms {', '.join(plats)} in the spec, {', '.join(self.platforms)} in the lock")
        locked = [m.ref for m in self.models]
        added_m = [r for r in spec.models if r not in locked]
        gone_m = [r for r in locked if r not in spec.models]
        if added_m:
            why.append("models not locked: " + ", ".join(added_m))
        if gone_m:
            why.append("models no longer in the spec: " + ", ".join(gone_m))
        return "; ".join(why) or None

    def require_fit(self, spec: Spec, config: MirrorConfig) -> None:
        """Refuse a lock that no longer fits `spec` (the one rule of `fetch -f` and `lock`); raises ConfigError."""
        why = self.mismatch(spec, config)
        if why:
            raise ConfigError(f"{self.path} does not match {spec.path}: {why}",
                              hint=f"run imgtool lock --update -f {spec.path}")


def _canonical(config: MirrorConfig, text: str) -> str:
    return str(config.parse_ref(text))


def parse_lock(data: bytes, path: Path) -> Lock:
    """Validate bundle.lock (JSON); raises ConfigError naming the file and the entry."""

    def bad(problem: str) -> ConfigError:
        return ConfigError(f"{path}: {problem}", hint="recreate it: imgtool lock --update -f SPEC")

    obj = json_object(data, MAX_LOCK_BYTES, bad)
    version = obj.get("lock_version")
    if version != LOCK_VERSION:
        raise bad(f"unsupported lock_version {version!r} (this imgtool writes {LOCK_VERSION})")
    platforms = obj.get("platforms")
    if not isinstance(platforms, list) or not all(isinstance(p, str) for p in platforms):
        raise bad("`platforms` is not a list of strings")
    images = obj.get("images")
    if not isinstance(images, list):
        raise bad("`images` is not a list")
    out = []
    for i, x in enumerate(images):
        where = f"images[{i}]"
        if not isinstance(x, dict) or not all(isinstance(x.get(k), str) for k in ("ref", "name", "digest")):
            raise bad(f"{where} needs string ref, name and digest")
        try:
            digest = Digest.parse(x["digest"])
            ImageRef.parse(x["name"])
            manifests = x.get("platforms")
            if not isinstance(manifests, dict):
                raise bad(f"{where}.platforms is not an object")
            pairs = tuple((str(Platform.parse(p)), Digest.parse(d if isinstance(d, str) else ""))
                          for p, d in manifests.items())
        except UsageError as e:
            raise bad(f"{where}: {e.message}") from e
        out.append(LockedImage(x["ref"], x["name"], digest, pairs, str(x.get("source") or "")))
    return Lock(path, tuple(str(Platform.parse(p)) for p in platforms), tuple(out), _locked_models(obj, bad))


def _locked_models(obj: Dict[str, Any], bad: Any) -> Tuple[LockedModel, ...]:
    """bundle.lock's `models` (absent in locks of specs without models)."""
    from .weights import check_path, parse_model_ref

    models = obj.get("models", [])
    if not isinstance(models, list):
        raise bad("`models` is not a list")
    out = []
    for i, x in enumerate(models):
        where = f"models[{i}]"
        if not isinstance(x, dict) or not all(isinstance(x.get(k), str) for k in ("ref", "commit")) \
                or not isinstance(x.get("files"), list):
            raise bad(f"{where} needs string ref and commit, and a list of files")
        files = []
        try:
            parse_model_ref(x["ref"])  # a local directory's too (hf:ORG/NAME=DIR)
            for j, f in enumerate(x["files"]):
                if not isinstance(f, dict) or not isinstance(f.get("path"), str) or check_path(f["path"]) \
                        or not isinstance(f.get("size"), int) or isinstance(f.get("size"), bool) or f["size"] < 0:
                    raise bad(f"{where}.files[{j}] needs a safe path, a size and a sha256")
                files.append((f["path"], f["size"], Digest.parse(f["sha256"] if isinstance(f.get("sha256"), str) else "")))
        except UsageError as e:
            raise bad(f"{where}: {e.message}") from e
        out.append(LockedModel(x["ref"], x["commit"], tuple(files), str(x.get("source") or "")))
    return tuple(out)


def read_lock(path: Path) -> Optional[Lock]:
    """The lock at `path`, or None when there is none; raises ConfigError when unreadable."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e.strerror or e}") from e
    return parse_lock(data, Path(path))


def write_lock(lock: Lock) -> None:
    """Write the lock atomically (temp file, fsync, rename)."""
    try:
        write_atomic(lock.path, lock.to_bytes())
    except OSError as e:
        raise UsageError(f"cannot write {lock.path}: {e.strerror or e}") from e


# --- creation time ---------------------------------------------------------------------------


def parse_created(option: Optional[str], env: Optional[str] = None) -> Optional[str]:
    """bundle.json's `created` from --created (RFC 3339 UTC or unix seconds) or SOURCE_DATE_EPOCH.

    Returns None (meaning: now) when neither is given. Raises UsageError.
    """
    if option:
        text, what = option.strip(), "--created"
    elif env:
        text, what = env.strip(), "SOURCE_DATE_EPOCH"
    else:
        return None
    if re.fullmatch(r"[0-9]{1,12}", text):
        return utc_time(int(text))
    m = re.fullmatch(r"([0-9]{4}-[0-9]{2}-[0-9]{2})[T ]([0-9]{2}:[0-9]{2}:[0-9]{2})Z", text)
    if m:
        try:
            secs = calendar.timegm(time.strptime(f"{m.group(1)}T{m.group(2)}Z", UTC_TIME))
        except ValueError:
            m = None
        else:
            return utc_time(secs)
    raise UsageError(f"invalid {what} {text!r}: use UTC like 2025-06-01T08:00:00Z, or unix seconds")


def lock_from(spec: Spec, config: MirrorConfig, resolved: Sequence[Tuple[str, Digest, Sequence[Tuple[Platform, Digest]], str]],
              models: Sequence[LockedModel] = ()) -> Lock:
    """Build the lock for `spec` from (spec ref, digest, [(platform, manifest digest)], source) and its models."""
    images = []
    for text, digest, manifests, source in resolved:
        images.append(LockedImage(text, _canonical(config, text), digest,
                                  tuple((str(p), d) for p, d in manifests), source))
    return Lock(spec.lock_path, tuple(str(p) for p in spec.platforms), tuple(images), tuple(models))
