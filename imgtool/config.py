"""Reading imgtool's configuration into plain values: its TOML files (mirrors.toml) and the environment.

Every error names the file, the line or key, and the problem, and exits 2. This is the one module
that reads environment variables (tests/test_layering.py holds it): commands/ reads each once and hands
the value to the room that needs it.
"""

import dataclasses
import os
import pkgutil
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, NoReturn, Optional, Tuple

from .errors import ConfigError, UsageError
from .model import CARRIERS, FAT32_MAX, ImageRef, format_size, is_size, parse_size
from .schema import Key, Table

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on old Pythons
    import tomli as tomllib

BUILTIN_MIRRORS = Path(__file__).with_name("mirrors.toml")
DEFAULT_READ_TIMEOUT = 60.0  # seconds a registry read may stall
DEFAULT_HELPER_TIMEOUT = 30.0  # seconds a docker-credential-* helper may take to answer
DEFAULT_MIN_RATE = 1024  # bytes/s a blob's body must average over each read timeout spent waiting for it


@dataclass(frozen=True)
class Mirror:
    """One mirrors.toml entry: an endpoint serving `registry`, optionally under a path prefix."""

    name: str
    registry: str
    url: str
    prefix: str = ""
    insecure: bool = False
    ca_cert: Optional[str] = None
    upstream: Optional[bool] = None  # None: the registry itself when url's host is `registry`

    @property
    def is_upstream(self) -> bool:
        """True for the registry itself (whose answer for a tag is authoritative)."""
        if self.upstream is not None:
            return self.upstream
        return self.url.split("://", 1)[-1].split("/")[0] == self.registry and not self.prefix


@dataclass(frozen=True)
class ModelMirror:
    """One `[[model_mirrors]]` entry: an endpoint speaking a model hub's API (`hub` "hf" or "modelscope"), e.g.
    hf-mirror.com for Hugging Face. The hub's token (`$HF_TOKEN`, `$MODELSCOPE_API_TOKEN`) goes to it only with
    `token = true`: a mirror is a third party unless the user says otherwise."""

    name: str
    hub: str
    url: str
    insecure: bool = False
    ca_cert: Optional[str] = None
    upstream: bool = False  # its answer for a revision is authoritative (as the hub itself is)
    token: bool = False


@dataclass(frozen=True)
class MirrorConfig:
    """How imgtool reaches registries: the whole mirrors.toml (the default image and the mirror entries,
    in file order), how long a read may stall (`$IMGTOOL_READ_TIMEOUT`), a whole answer may take
    (`$IMGTOOL_RESPONSE_TIMEOUT`; None: twice the read timeout), how slowly a blob may come
    (`$IMGTOOL_MIN_RATE`) and a credential helper may take (`$IMGTOOL_CREDENTIAL_HELPER_TIMEOUT`), each read
    once by commands/."""

    default_image: str
    mirrors: Tuple[Mirror, ...]
    path: str
    read_timeout: float = DEFAULT_READ_TIMEOUT
    helper_timeout: float = DEFAULT_HELPER_TIMEOUT
    response_timeout: Optional[float] = None
    min_rate: int = DEFAULT_MIN_RATE
    model_mirrors: Tuple[ModelMirror, ...] = ()

    def parse_ref(self, text: str) -> ImageRef:
        """Parse a user reference against this config's default image; raises UsageError."""
        return ImageRef.parse(text, self.default_image)


def _read_text(path: Path) -> str:
    """A file's text; imgtool's own built-in files are read through the loader when they live
    inside imgtool.pyz (a zip, where `open()` cannot reach them)."""
    try:
        return path.read_text(encoding="utf-8")
    except (FileNotFoundError, NotADirectoryError):
        root = Path(__file__).parent
        if root not in Path(path).parents or root.is_dir():
            raise
        data = pkgutil.get_data(__package__, Path(path).relative_to(root).as_posix())
        if data is None:  # pragma: no cover - a loader without get_data
            raise
        return data.decode("utf-8")


def read_toml(path: Path) -> Tuple[Dict[str, Any], str]:
    """Load a TOML file, turning syntax errors into one-line ConfigErrors."""
    try:
        text = _read_text(path)
    except FileNotFoundError:
        raise ConfigError(f"{path}: file not found") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: cannot read: {e}") from e
    deep = too_deep(text)
    if deep is not None:  # the parser recurses per level: past ~300 a RecursionError, never a message
        raise ConfigError(f"{path}:{deep}: invalid TOML: arrays or inline tables nested more than {MAX_TOML_DEPTH} deep")
    try:
        return tomllib.loads(text), text
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: invalid TOML: {e}") from e


MAX_TOML_DEPTH = 64  # imgtool's files nest 3 deep; tomllib and tomli recurse once per level


def too_deep(text: str) -> Optional[int]:
    """The line where `[` and `{` (outside strings and comments) nest deeper than MAX_TOML_DEPTH, or None."""
    depth, line, i, n = 0, 1, 0, len(text)
    while i < n:
        c = text[i]
        if c == "\n":
            line += 1
        elif c == "#":
            end = text.find("\n", i)
            i = n if end < 0 else end
            continue
        elif c in "\"'":
            quote = c * 3 if text.startswith(c * 3, i) else c
            j = i + len(quote)
            while j < n and not text.startswith(quote, j):
                if c == '"' and text[j] == "\\":
                    j += 1  # an escaped character, the quote included
                elif text[j] == "\n" and len(quote) == 1:
                    break  # an unclosed one-line string: the parser says so
                j += 1
            line += text.count("\n", i, j)
            i = j + len(quote)
            continue
        elif c in "[{":
            depth += 1
            if depth > MAX_TOML_DEPTH:
                return line
        elif c in "]}":
            depth = max(depth - 1, 0)
        i += 1
    return None


def key_line(text: str, key: Optional[str], table: Optional[str] = None, nth: int = 0) -> Optional[int]:
    """Best-effort line number of `key` inside the `nth` `[[table]]` (or top level); no key: the table's header."""
    lines = text.splitlines()
    start, end = 0, len(lines)
    if table is not None:
        headers = [i for i, ln in enumerate(lines) if re.match(rf"^\s*\[\[\s*{re.escape(table)}\s*\]\]", ln)]
        if nth >= len(headers):
            return None
        start = headers[nth]
        end = next((i for i, ln in enumerate(lines) if i > start and re.match(r"^\s*\[", ln)), len(lines))
        if key is None:
            return start + 1
    if key is None:
        return None
    pat = re.compile(rf"^\s*[\"']?{re.escape(key)}[\"']?\s*=")
    for i in range(start, end):
        if table is None and re.match(r"^\s*\[", lines[i]):
            break
        if pat.match(lines[i]):
            return i + 1
    return (start + 1) if table is not None else None


def file_line(path: Path, line: Optional[int]) -> str:
    """Where a problem is, as messages name it: `path:line`, or the path alone when the line is unknown."""
    return f"{path}:{line}" if line else str(path)


def toml_fail(path: Path, text: str, table: Optional[str] = None, nth: int = 0,
              label: str = "") -> Callable[[Optional[str], str], NoReturn]:
    """A `schema.Fail` for a TOML file: raises ConfigError at `path:line` of the key (of the `nth`
    `[[table]]`, whose header line a problem of the whole entry names), the message led by `label`."""

    def fail(key: Optional[str], problem: str) -> NoReturn:
        line = key_line(text, key, table, nth) if key or table else None
        raise ConfigError(f"{file_line(path, line)}: {label}{problem}")

    return fail


_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*\Z")  # \Z: `$` lets a final newline through
_URL_RE = re.compile(r"(https?)://([^/\s]+)(/\S*)?\Z")


def _default_image(value: str) -> str:
    ImageRef.parse("latest", value)
    return value


def _mirror_name(value: str) -> str:
    if not _NAME_RE.match(value) or value == "auto":
        raise UsageError(f"invalid name {value!r} (letters, digits, '.', '_', '-'; 'auto' is reserved)")
    return value


def _mirror_url(value: str) -> str:
    if not _URL_RE.match(value.rstrip("/")):
        raise UsageError(f"invalid url {value!r}: expected https://host[:port]")
    return value


def _registry_host(value: str) -> str:
    if not value or "/" in value or any(c.isspace() for c in value):
        raise UsageError(f"invalid registry {value!r}: expected a host like quay.io")
    return value


_MIRRORS_FILE = Table(
    Key("default_image", str, check=_default_image, wrong='default_image must be a string like "quay.io/ascend/vllm-ascend"',
        missing='default_image must be a string like "quay.io/ascend/vllm-ascend"', required=True),
    Key("mirrors", list, wrong="mirrors must be an array of tables ([[mirrors]])"),
    Key("model_mirrors", list, wrong="model_mirrors must be an array of tables ([[model_mirrors]])"),
)
_MIRROR = Table(
    Key("name", str, required=True, what="string", check=_mirror_name),
    Key("registry", str, required=True, what="string", check=_registry_host),
    Key("url", str, required=True, what="string", check=_mirror_url),
    Key("prefix", str, what="string"),
    Key("insecure", bool, what="boolean"),
    Key("ca_cert", str, what="string"),
    Key("upstream", bool, what="boolean"),
    wrong="{key} must be a {what}",
)


def _hub_name(value: str) -> str:
    if value not in ("hf", "modelscope"):
        raise UsageError(f"invalid hub {value!r}: \"hf\" (Hugging Face) or \"modelscope\"")
    return value


_MODEL_MIRROR = Table(
    Key("name", str, required=True, what="string", check=_mirror_name),
    Key("hub", str, required=True, what="string", check=_hub_name),
    Key("url", str, required=True, what="string", check=_mirror_url),
    Key("insecure", bool, what="boolean"),
    Key("ca_cert", str, what="string"),
    Key("upstream", bool, what="boolean"),
    Key("token", bool, what="boolean"),
    wrong="{key} must be a {what}",
)


def _entries(section: str, table: Any, entries: List[Any], text: str, path: Path) -> List[Tuple[Dict[str, Any], str, Optional[str]]]:
    """Each `[[section]]` entry checked against `table` as [[mirrors]] and [[model_mirrors]] are: a table, a name
    used once, http:// only with insecure = true; (its values, its url without a trailing /, its ca_cert beside
    the file); raises ConfigError at file:line."""
    out = []
    seen: Dict[str, int] = {}
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise ConfigError(f"{path}: {section}[{i}] must be a table")
        fail = toml_fail(path, text, section, i, f"{section}[{i}]: ")
        values = table.check(entry, fail)
        name, url = values["name"], values["url"].rstrip("/")
        if name in seen:
            fail("name", f"duplicate name {name!r} (also {section}[{seen[name]}])")
        seen[name] = i
        if url.startswith("http://") and not values.get("insecure", False):
            fail("url", f"url {values['url']!r} uses http://; set insecure = true for this entry to allow it")
        ca_cert = values.get("ca_cert")
        out.append((values, url, str((path.parent / os.path.expanduser(ca_cert)).resolve()) if ca_cert else None))
    return out


def parse_mirrors(data: Dict[str, Any], text: str, path: Path) -> MirrorConfig:
    """Validate a loaded mirrors.toml; raises ConfigError naming file, line and key."""
    top = _MIRRORS_FILE.check(data, toml_fail(path, text))
    mirrors = [Mirror(v["name"], v["registry"], url, v.get("prefix", "").strip("/"), v.get("insecure", False), ca_cert,
                      v.get("upstream"))
               for v, url, ca_cert in _entries("mirrors", _MIRROR, top.get("mirrors", []), text, path)]
    models = [ModelMirror(v["name"], v["hub"], url, v.get("insecure", False), ca_cert, v.get("upstream", False),
                          v.get("token", False))
              for v, url, ca_cert in _entries("model_mirrors", _MODEL_MIRROR, top.get("model_mirrors", []), text, path)]
    return MirrorConfig(top["default_image"], tuple(mirrors), str(path), model_mirrors=tuple(models))


def find_user_file(option: Optional[str], env_var: str, name: str) -> Optional[Path]:
    """The user's config file: the option, else `$env_var`, else ~/.config/imgtool/NAME if it exists, else None."""
    if option:
        return Path(option)
    env = os.environ.get(env_var)
    if env:
        return Path(env)
    user = Path(os.path.expanduser(f"~/.config/imgtool/{name}"))
    return user if user.is_file() else None


def find_mirrors_file(option: Optional[str]) -> Path:
    """The mirrors.toml to use: --mirrors-file, $IMGTOOL_MIRRORS, ~/.config/imgtool/mirrors.toml, built-in."""
    return find_user_file(option, "IMGTOOL_MIRRORS", "mirrors.toml") or BUILTIN_MIRRORS


def load_mirrors(option: Optional[str] = None, read_timeout: Optional[float] = None,
                 helper_timeout: Optional[float] = None, waits: Optional[MirrorConfig] = None) -> MirrorConfig:
    """Find, read and validate the mirrors configuration; `read_timeout`/`helper_timeout` None: the
    defaults, 60 s and 30 s (commands/ passes `read_timeout()`, `helper_timeout()`), or with `waits`, every
    wait of that configuration (commands/options.py's `registries`). Raises ConfigError."""
    path = find_mirrors_file(option)
    data, text = read_toml(path)
    config = parse_mirrors(data, text, path)
    if waits is not None:
        config = dataclasses.replace(config, read_timeout=waits.read_timeout, helper_timeout=waits.helper_timeout,
                                     response_timeout=waits.response_timeout, min_rate=waits.min_rate)
    if read_timeout is not None:
        config = dataclasses.replace(config, read_timeout=read_timeout)
    return config if helper_timeout is None else dataclasses.replace(config, helper_timeout=helper_timeout)


def network_waits() -> MirrorConfig:
    """The environment's waits for the network (`$IMGTOOL_READ_TIMEOUT`, `$IMGTOOL_RESPONSE_TIMEOUT`,
    `$IMGTOOL_MIN_RATE`, `$IMGTOOL_CREDENTIAL_HELPER_TIMEOUT`) as the fields of an empty MirrorConfig, for
    `load_mirrors(waits=...)`. Raises UsageError."""
    return MirrorConfig("", (), "", read_timeout=read_timeout(), helper_timeout=helper_timeout(),
                        response_timeout=response_timeout(), min_rate=min_rate())


# --- the environment: every variable imgtool reads -------------------------------------------------


def cache_dir() -> Path:
    """`$IMGTOOL_CACHE`, default `~/.cache/imgtool`."""
    return Path(os.environ.get("IMGTOOL_CACHE") or os.path.expanduser("~/.cache/imgtool"))


def _client_path(value: str) -> str:
    return os.path.expandvars(os.path.expanduser(value))  # as the hub clients read their cache variables


def hf_hub_cache() -> Path:
    """The Hugging Face cache models are placed into, where huggingface_hub looks (its constants.py): `$HF_HUB_CACHE`,
    else the older `$HUGGINGFACE_HUB_CACHE`, else `$HF_HOME/hub`, else `$XDG_CACHE_HOME/huggingface/hub`, else
    `~/.cache/huggingface/hub`."""
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"),
                                                     "huggingface")
    hub = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE") or os.path.join(_client_path(home), "hub")
    return Path(_client_path(hub))


def modelscope_cache() -> Path:
    """The ModelScope cache models are placed into: `$MODELSCOPE_CACHE`, else its older alias `$MS_CACHE_HOME`, else
    `~/.cache/modelscope/hub`: where modelscope <= 1.37 keeps models, and where the current client (cache
    `~/.cache/modelscope`) looks first (placement.py says why)."""
    value = os.environ.get("MODELSCOPE_CACHE") or os.environ.get("MS_CACHE_HOME") or "~/.cache/modelscope/hub"
    return Path(_client_path(value))


def read_timeout() -> float:
    """Seconds a blob or manifest read may stall: `$IMGTOOL_READ_TIMEOUT`, default 60. Raises UsageError."""
    return _seconds("IMGTOOL_READ_TIMEOUT", DEFAULT_READ_TIMEOUT)


def response_timeout() -> Optional[float]:
    """Seconds a registry's answer may take to send its headers, and then a small answer (a manifest, a tag
    page, a token) its body: `$IMGTOOL_RESPONSE_TIMEOUT`, default None (twice the read timeout: 120 s).
    Raises UsageError."""
    text = os.environ.get("IMGTOOL_RESPONSE_TIMEOUT", "").strip()
    return _seconds("IMGTOOL_RESPONSE_TIMEOUT", 120.0) if text else None


def min_rate() -> int:
    """Bytes a second a blob's body must average over each read timeout spent waiting for it:
    `$IMGTOOL_MIN_RATE` (a number, or with a unit: 10K), default 1024. Raises UsageError."""
    text = os.environ.get("IMGTOOL_MIN_RATE", "").strip()
    if not text:
        return DEFAULT_MIN_RATE
    try:
        rate = parse_size(text, "IMGTOOL_MIN_RATE") if is_size(text) else 0
    except UsageError:  # zero, or past any size: one message for every bad value
        rate = 0
    if not 1 <= rate <= 1024 ** 3:
        raise UsageError(f"invalid IMGTOOL_MIN_RATE {text!r}: give bytes per second between 1 and 1G, e.g. "
                         f"{DEFAULT_MIN_RATE} or 10K")
    return rate


def helper_timeout() -> float:
    """Seconds a docker-credential-* helper may take to answer: `$IMGTOOL_CREDENTIAL_HELPER_TIMEOUT`, default 30.
    Raises UsageError."""
    return _seconds("IMGTOOL_CREDENTIAL_HELPER_TIMEOUT", DEFAULT_HELPER_TIMEOUT)


def _seconds(name: str, default: float) -> float:
    """A variable holding seconds, above 0 and at most 3600; `default` when unset or blank. Raises UsageError."""
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value <= 3600:
        raise UsageError(f"invalid {name} {text!r}: give seconds between 0 and 3600, e.g. {default:g}")
    return value


DEFAULT_HF_ENDPOINT = "https://huggingface.co"
DEFAULT_MODELSCOPE_ENDPOINT = "https://modelscope.cn"
MAX_TOKEN_FILE = 4096  # a token file longer than this is not a token


@dataclass(frozen=True)
class HubEnvironment:
    """What the model hubs' own clients read from the environment, read once by commands/ (`hub_environment`)
    and handed to the hubs room: the endpoints (`$HF_ENDPOINT`; `$MODELSCOPE_ENDPOINT`, else
    `$MODELSCOPE_DOMAIN`) and the tokens. `hf_default`/`modelscope_default` are the hubs themselves.
    `modelscope_variable` is the variable the ModelScope endpoint came from, the name messages give it."""

    hf_endpoint: Optional[str] = None
    hf_token: Optional[str] = field(default=None, repr=False)
    modelscope_endpoint: Optional[str] = None
    modelscope_token: Optional[str] = field(default=None, repr=False)
    hf_default: Optional[str] = DEFAULT_HF_ENDPOINT
    modelscope_default: Optional[str] = DEFAULT_MODELSCOPE_ENDPOINT
    modelscope_variable: str = "MODELSCOPE_DOMAIN"


def hub_environment() -> HubEnvironment:
    """The hubs' endpoints and tokens as their clients read them (huggingface_hub 2.4, modelscope 1.40):
    `hf_endpoint`, `hf_token`, `modelscope_endpoint`, `modelscope_token`. Raises UsageError for an endpoint
    that is not an http(s) URL."""
    return HubEnvironment(hf_endpoint(), hf_token(), modelscope_endpoint(), modelscope_token(),
                          modelscope_variable=modelscope_variable())


def _endpoint(name: str, value: str) -> str:
    url = value.strip().rstrip("/")
    if not _URL_RE.match(url):
        raise UsageError(f"invalid {name} {value!r}: expected https://host[:port]")
    return url


def hf_endpoint() -> Optional[str]:
    """`$HF_ENDPOINT` (how hf-mirror.com is used), or None. Raises UsageError."""
    value = os.environ.get("HF_ENDPOINT", "").strip()
    return _endpoint("HF_ENDPOINT", value) if value else None


# modelscope (1.40, the client vllm-ascend's docs use) reads $MODELSCOPE_DOMAIN; its successor modelscope_hub reads
# $MODELSCOPE_ENDPOINT first and takes $MODELSCOPE_DOMAIN as a deprecated name for it
MODELSCOPE_VARIABLES = ("MODELSCOPE_ENDPOINT", "MODELSCOPE_DOMAIN")


def modelscope_variable() -> str:
    """The variable the ModelScope endpoint comes from: the first of MODELSCOPE_VARIABLES that is set, else
    MODELSCOPE_DOMAIN (what modelscope's client reads)."""
    return next((n for n in MODELSCOPE_VARIABLES if os.environ.get(n, "").strip()), "MODELSCOPE_DOMAIN")


def modelscope_endpoint() -> Optional[str]:
    """`$MODELSCOPE_ENDPOINT`, else `$MODELSCOPE_DOMAIN` (a bare host gets https://, a value with http:// is used
    as given, as modelscope's client does), or None. Raises UsageError naming the variable."""
    name = modelscope_variable()
    value = os.environ.get(name, "").strip()
    if not value:
        return None
    if not value.lower().startswith(("http://", "https://")):
        value = "https://" + value
    return _endpoint(name, value)


def _clean_token(value: Optional[str]) -> Optional[str]:
    """A token as huggingface_hub cleans it: CR and LF removed, blanks stripped; None when empty."""
    if value is None:
        return None
    return value.replace("\r", "").replace("\n", "").strip() or None


def hf_token() -> Optional[str]:
    """The Hugging Face token as huggingface_hub finds it: `$HF_TOKEN` (or the older `$HUGGING_FACE_HUB_TOKEN`),
    else the token file: `$HF_TOKEN_PATH`, else `$HF_HOME/token`, else `$XDG_CACHE_HOME/huggingface/token`, else
    `~/.cache/huggingface/token`. A file that is not regular or is longer than 4 KiB is not read."""
    token = _clean_token(os.environ.get("HF_TOKEN") or os.environ.get("HUGGING_FACE_HUB_TOKEN"))
    if token:
        return token
    path = os.environ.get("HF_TOKEN_PATH")
    if not path:
        home = os.environ.get("HF_HOME") or os.path.join(
            os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "huggingface")
        path = os.path.join(home, "token")
    path = os.path.expanduser(path)
    if not os.path.isfile(path):
        return None
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_TOKEN_FILE + 1)
    except OSError:
        return None
    if len(data) > MAX_TOKEN_FILE:
        return None
    return _clean_token(data.decode("utf-8", "replace"))


def modelscope_token() -> Optional[str]:
    """`$MODELSCOPE_API_TOKEN`, or None. modelscope's own login file (`~/.modelscope/credentials/cookies`) is a
    pickle, which imgtool does not load: unpickling runs code."""
    return _clean_token(os.environ.get("MODELSCOPE_API_TOKEN"))


def source_date_epoch() -> Optional[str]:
    """`$SOURCE_DATE_EPOCH` as given (spec.parse_created reads it), or None."""
    return os.environ.get("SOURCE_DATE_EPOCH")


def signers_variable() -> Optional[str]:
    """`$IMGTOOL_SIGNERS` as given (trust.find_policy decides what it means), or None."""
    return os.environ.get("IMGTOOL_SIGNERS")


def docker_config_dir() -> str:
    """Where `docker login` keeps config.json: `$DOCKER_CONFIG`, default `~/.docker`."""
    return os.environ.get("DOCKER_CONFIG") or os.path.expanduser("~/.docker")


def proxy_variable(scheme: str) -> Optional[Tuple[str, str]]:
    """(variable, value) of the proxy the environment names for a URL scheme, in urllib's and requests'
    order (lowercase first, then the scheme's, then all_proxy), or None."""
    for name in (f"{scheme}_proxy", f"{scheme.upper()}_PROXY", "all_proxy", "ALL_PROXY"):
        value = os.environ.get(name)
        if value:
            return name, value
    return None


DEFAULT_DOCKER_HOST = "unix:///var/run/docker.sock"


def docker_host() -> str:
    """Where the Docker daemon listens: `$DOCKER_HOST`, default the system socket."""
    return os.environ.get("DOCKER_HOST") or DEFAULT_DOCKER_HOST


def docker_api_version() -> str:
    """`$DOCKER_API_VERSION` (e.g. 1.39, Docker 18.09's), or "auto": the daemon's own. Raises UsageError."""
    version = os.environ.get("DOCKER_API_VERSION", "").strip() or "auto"
    if version != "auto" and not re.fullmatch(r"1\.[0-9]{1,2}", version):
        raise UsageError(f"invalid DOCKER_API_VERSION {version!r}: give an API version such as 1.39 (Docker 18.09)")
    return version


def docker_tls() -> Dict[str, str]:
    """The TLS variables docker-py reads beside DOCKER_HOST (`$DOCKER_TLS_VERIFY`, `$DOCKER_CERT_PATH`),
    those that are set; a tcp:// host with TLS is docker-py's alone (runtimes/docker_http speaks plain tcp://)."""
    return {name: os.environ[name] for name in ("DOCKER_TLS_VERIFY", "DOCKER_CERT_PATH") if name in os.environ}


MIN_CHUNK_SIZE = 1024 ** 2  # the smallest part a user may ask for
TYPICAL_IMAGE = 15 * 1024 ** 3  # a vllm-ascend image, for saying what a tiny chunk size would mean


SIZE_UNITS = "K, M, G, T are binary: 4G = 4 GiB, 700MB = 700 MiB"


def carriers_help() -> str:
    """What --help says of SIZE: each carrier name in bytes, and how numbers are read."""
    names = "; ".join(f"{name} = {size:,} bytes" for name, size in CARRIERS.items())
    return f"{names}; or a number with a unit ({SIZE_UNITS})"


def parse_chunk_size(text: str, what: str = "--chunk-size", floor: int = MIN_CHUNK_SIZE) -> int:
    """A part size: a carrier name (`fat32`, `dvd`, ...) or a size of at least `floor` (1 MiB; `700M`,
    binary units); raises UsageError naming the file count a tiny size would cost."""
    carrier = CARRIERS.get(str(text).strip().lower())
    if carrier is not None:
        return carrier
    if not is_size(text):
        raise UsageError(f"invalid {what} {text!r}: use a carrier ({', '.join(CARRIERS)}) or a number with an "
                         f"optional unit K, M, G, T (binary), e.g. 700M")
    size = parse_size(text, what)
    if size < floor:
        files = -(-TYPICAL_IMAGE // size)
        raise UsageError(f"invalid {what} {text!r}: parts must be at least {_size(floor)} "
                         f"({_size(size)} parts would cut a 15 GiB image into {files:,} files)",
                         hint="use the largest file your medium takes: fat32, dvd, dvd-dl, bd25, bd50, or e.g. 700M")
    return size


def chunk_size_warning(size: Optional[int]) -> Optional[str]:
    """The warning for a numeric part size FAT32 cannot hold (`4G` is one byte too many)."""
    if size is None or size <= FAT32_MAX or size in CARRIERS.values():
        return None
    return (f"parts of {size:,} bytes ({_size(size)}) do not fit on FAT32, which holds files up to "
            f"{FAT32_MAX:,} bytes: for FAT32 USB sticks use --chunk-size fat32")


def _size(n: int) -> str:
    return format_size(n).replace(".0 ", " ")


def tool_environment() -> Dict[str, str]:
    """This process's whole environment, for a runtime's tool run with a variable of imgtool's changed (podman
    load's TMPDIR: runtimes/podman.py), everything else as the tool would see it."""
    return dict(os.environ)


def runtime_environment() -> Dict[str, str]:
    """The variables the runtimes' own tools read, as `docker`, `ctr` and `podman` do: DOCKER_HOST
    (docker_host()), CONTAINERD_ADDRESS, CONTAINERD_NAMESPACE, TMPDIR (podman load's staging), and where Podman's
    storage.conf is (CONTAINERS_STORAGE_CONF, XDG_CONFIG_HOME, XDG_DATA_HOME: doctor reads it; those set)."""
    names = ("CONTAINERD_ADDRESS", "CONTAINERD_NAMESPACE", "TMPDIR", "CONTAINERS_STORAGE_CONF", "XDG_CONFIG_HOME",
             "XDG_DATA_HOME")
    return dict({name: os.environ[name] for name in names if os.environ.get(name)}, DOCKER_HOST=docker_host())
