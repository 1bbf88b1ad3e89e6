"""`docker run` presets for Ascend hosts: presets.toml -> `Preset` -> `RunSpec` -> argv.

Pure apart from reading the preset files: the daemon is asked about local images and
started by `daemon.py`; the host's device nodes are looked at through an `exists`
callable, so every decision here can be tested without an NPU.
"""

import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from .config import key_line, read_toml
from .errors import ConfigError, ImgtoolError, UsageError
from .model import ImageRef, parse_size

BUILTIN_PRESETS = Path(__file__).with_name("presets.toml")
CARD_DEVICE = "/dev/davinci{}"
# A tag that cannot be pulled by accident: docker rejects it at once as a reference.
PLACEHOLDER_TAG = "<version>"
DEFAULT_NAME = "vllm-ascend"

PRIVILEGED_EFFECT = (
    "it gives the container every host device and all kernel capabilities and turns off its "
    "seccomp/AppArmor confinement; use it only with an image you trust (vllm-ascend FAQ 20)"
)

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_NETWORK_RE = re.compile(r"^(?:[A-Za-z0-9][A-Za-z0-9_.-]*|container:[A-Za-z0-9][A-Za-z0-9_.-]*)$")
_CONTAINER_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_PORT_RE = re.compile(r"^(?:(?P<ip>[0-9]{1,3}(?:\.[0-9]{1,3}){3}|\[[0-9a-fA-F:]+\]):)?"
                      r"(?:(?P<host>[0-9]{1,5}):)?(?P<container>[0-9]{1,5})(?:/(?P<proto>tcp|udp|sctp))?$")
# vllm-ascend release tags: v0.11.0rc1, v0.10.0, v0.7.3.post1, each with an optional -a3, -310p-openeuler...
_VERSION_TAG_RE = re.compile(r"^v(?P<nums>[0-9]+(?:\.[0-9]+)*)(?:rc(?P<rc>[0-9]+)|\.post(?P<post>[0-9]+))?"
                             r"(?P<suffix>(?:-[A-Za-z0-9_.]+)*)$")

_PRESET_KEYS = {
    "description": "a string",
    "extends": "a preset name",
    "cards": 'a card range like "0-7"',
    "min_cards": "an integer",
    "devices": "an array of device paths",
    "mounts": "an array of mounts",
    "shm_size": 'a size like "1g"',
    "network": '"bridge" or "host"',
    "ports": 'an array like ["8000:8000"]',
    "env": "a table of NAME = \"value\"",
    "tag_suffixes": 'an array like ["-a3", "-a3-openeuler"]',
    "privileged": "true or false",
    "multi_node": "true or false",
}
_MULTI_NODE_KEYS = ("network", "mounts")
_ENV_PRESET_KEYS = ("description", "env")


# --- values ------------------------------------------------------------------


@dataclass(frozen=True)
class Mount:
    """A host path bound into the container; `create` lets Docker make a missing host dir."""

    host: str
    container: str
    readonly: bool = False
    create: bool = False
    user: bool = field(default=False, compare=False)  # from --volume: never dropped silently

    @property
    def spec(self) -> str:
        """`HOST:CONTAINER[:ro]`, as `docker run -v` and the API's Binds take it."""
        return f"{self.host}:{self.container}" + (":ro" if self.readonly else "")

    def to_json(self) -> dict:
        return {"host": self.host, "container": self.container, "readonly": self.readonly, "create": self.create}


@dataclass(frozen=True)
class Port:
    """A published port: `[IP:]HOST:CONTAINER[/proto]`."""

    container: int
    host: Optional[int] = None
    host_ip: Optional[str] = None
    proto: str = "tcp"

    @classmethod
    def parse(cls, text: str, what: str = "port") -> "Port":
        """Parse `8000:8000`, `127.0.0.1:8080:8000`, `8000/udp`; raises UsageError."""
        m = _PORT_RE.match(str(text).strip())
        ok = bool(m)
        if m:
            numbers = [int(x) for x in (m.group("host"), m.group("container")) if x]
            ok = all(1 <= n <= 65535 for n in numbers)
        if not ok:
            raise UsageError(f"invalid {what} {text!r}: expected [IP:]HOST:CONTAINER[/tcp|udp], e.g. 8000:8000")
        return cls(int(m.group("container")), int(m.group("host")) if m.group("host") else None,
                   m.group("ip"), m.group("proto") or "tcp")

    def __str__(self) -> str:
        out = str(self.container) if self.host is None else f"{self.host}:{self.container}"
        if self.host_ip:
            out = f"{self.host_ip}:{out}"
        return out if self.proto == "tcp" else f"{out}/{self.proto}"


@dataclass(frozen=True)
class Preset:
    """One host type's container flags, validated."""

    name: str
    description: str
    cards: Tuple[int, ...]
    min_cards: int
    devices: Tuple[str, ...]
    mounts: Tuple[Mount, ...]
    shm_size: int
    network: str
    ports: Tuple[Port, ...]
    env: Tuple[Tuple[str, str], ...]
    tag_suffixes: Tuple[str, ...]
    privileged: bool
    multi_node: bool

    @property
    def tag_pattern(self) -> str:
        """How the image tag this preset goes with looks, e.g. `vX.Y.Z-a3`."""
        return f"vX.Y.Z{self.tag_suffixes[0]}"

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "description": self.description,
            "cards": format_cards(self.cards),
            "min_cards": self.min_cards,
            "devices": list(self.devices),
            "mounts": [m.to_json() for m in self.mounts],
            "shm_size": docker_size(self.shm_size),
            "network": self.network,
            "ports": [str(p) for p in self.ports],
            "env": dict(self.env),
            "tag_suffixes": list(self.tag_suffixes),
            "privileged": self.privileged,
            "multi_node": self.multi_node,
        }


@dataclass(frozen=True)
class MultiNode:
    """What --multi-node changes: the network, and mounts added to the preset's."""

    network: str
    mounts: Tuple[Mount, ...]

    def to_json(self) -> dict:
        return {"network": self.network, "mounts": [m.to_json() for m in self.mounts]}


@dataclass(frozen=True)
class EnvPreset:
    """A named set of environment variables for --env-preset."""

    name: str
    description: str
    env: Tuple[Tuple[str, str], ...]

    def to_json(self) -> dict:
        return {"name": self.name, "description": self.description, "env": dict(self.env)}


@dataclass(frozen=True)
class PresetSet:
    """Every preset after merging the user's file over the built-in one."""

    presets: Tuple[Preset, ...]
    multi_node: MultiNode
    env_presets: Tuple[EnvPreset, ...]
    files: Tuple[str, ...]

    def names(self) -> List[str]:
        return [p.name for p in self.presets]

    def get(self, name: str) -> Preset:
        """The preset called `name`; raises UsageError listing the known ones."""
        for p in self.presets:
            if p.name == name:
                return p
        raise UsageError(f"unknown preset {name!r}; known presets: {', '.join(self.names())}")

    def env_preset(self, name: str) -> EnvPreset:
        """The env preset called `name`; raises UsageError listing the known ones."""
        for e in self.env_presets:
            if e.name == name:
                return e
        known = ", ".join(e.name for e in self.env_presets)
        raise UsageError(f"unknown --env-preset {name!r}; known: {known}")

    def to_json(self) -> dict:
        return {
            "files": list(self.files),
            "presets": [p.to_json() for p in self.presets],
            "multi_node": self.multi_node.to_json(),
            "env_presets": [e.to_json() for e in self.env_presets],
        }


@dataclass(frozen=True)
class RunOptions:
    """What the user asked for on top of a preset (all optional)."""

    devices: Optional[str] = None
    shm_size: Optional[str] = None
    privileged: bool = False
    network: Optional[str] = None
    name: Optional[str] = DEFAULT_NAME
    env_presets: Tuple[str, ...] = ()
    env: Tuple[str, ...] = ()
    volumes: Tuple[str, ...] = ()
    publish: Tuple[str, ...] = ()
    multi_node: bool = False
    detach: bool = False
    remove: bool = True
    interactive: bool = True
    command: Tuple[str, ...] = ()


@dataclass(frozen=True)
class RunSpec:
    """One container to start: everything `docker run` needs, as plain values."""

    preset: str
    image: str
    cards: Tuple[int, ...]
    devices: Tuple[str, ...]  # management devices; card nodes come from `cards`
    mounts: Tuple[Mount, ...]
    env: Tuple[Tuple[str, str], ...]
    shm_size: int
    network: Optional[str]  # None: Docker's default bridge
    ports: Tuple[Port, ...]
    privileged: bool
    privileged_by_preset: bool
    name: Optional[str]
    command: Tuple[str, ...]
    detach: bool = False
    remove: bool = True
    interactive: bool = True
    image_is_placeholder: bool = False

    @property
    def shm_size_text(self) -> str:
        return docker_size(self.shm_size)

    @property
    def device_paths(self) -> Tuple[str, ...]:
        """Card nodes in order, then the management devices."""
        return tuple(CARD_DEVICE.format(c) for c in self.cards) + self.devices

    def with_image(self, image: str, placeholder: bool = False) -> "RunSpec":
        return _replace(self, image=image, image_is_placeholder=placeholder)

    def to_json(self) -> dict:
        return {
            "preset": self.preset,
            "image": self.image,
            "image_is_placeholder": self.image_is_placeholder,
            "cards": list(self.cards),
            "devices": list(self.device_paths),
            "mounts": [m.to_json() for m in self.mounts],
            "env": dict(self.env),
            "shm_size": self.shm_size_text,
            "shm_size_bytes": self.shm_size,
            "network": self.network,
            "ports": [str(p) for p in self.ports],
            "privileged": self.privileged,
            "name": self.name,
            "command": list(self.command),
            "detach": self.detach,
            "remove": self.remove,
            "argv": render_argv(self),
            "command_line": render_command(self, one_line=True),
        }


def _replace(obj, **changes):
    from dataclasses import replace

    return replace(obj, **changes)


# --- small formats -----------------------------------------------------------


def parse_cards(text: Any) -> Tuple[int, ...]:
    """Parse `0-7`, `0,1`, `0-3,8` (or an int) into sorted card numbers; raises UsageError."""
    raw = str(text).strip()
    bad = UsageError(f"invalid card list {raw!r}: expected numbers and ranges like 0,1 or 0-7")
    cards = set()
    for part in raw.split(","):
        m = re.match(r"^\s*([0-9]+)\s*(?:-\s*([0-9]+)\s*)?$", part)
        if not m:
            raise bad
        lo, hi = int(m.group(1)), int(m.group(2) if m.group(2) is not None else m.group(1))
        if hi < lo or hi > 1023:
            raise bad
        cards.update(range(lo, hi + 1))
    return tuple(sorted(cards))


def format_cards(cards: Iterable[int]) -> str:
    """`(0,1,2,3,8)` -> `0-3,8`."""
    out: List[str] = []
    run: List[int] = []
    for c in sorted(cards):
        if run and c == run[-1] + 1:
            run.append(c)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [c]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)


def docker_size(n: int) -> str:
    """Bytes as docker writes sizes: `1g`, `256m`, `64k`, or plain bytes."""
    for unit, scale in (("g", 1 << 30), ("m", 1 << 20), ("k", 1 << 10)):
        if n % scale == 0:
            return f"{n // scale}{unit}"
    return str(n)


def parse_mount(value: Any, what: str = "mount") -> Mount:
    """A mount from `HOST[:CONTAINER][:ro|rw]` or `{host, container, readonly, create}`; raises UsageError."""
    if isinstance(value, dict):
        unknown = set(value) - {"host", "container", "readonly", "create"}
        if unknown:
            raise UsageError(f"invalid {what}: unknown key {sorted(unknown)[0]!r} "
                             "(expected host, container, readonly, create)")
        host = value.get("host")
        container = value.get("container", host)
        readonly, create = value.get("readonly", False), value.get("create", False)
        if not isinstance(readonly, bool) or not isinstance(create, bool):
            raise UsageError(f"invalid {what}: readonly and create must be true or false")
    elif isinstance(value, str):
        parts = value.split(":")
        readonly = False
        if len(parts) == 3 and parts[2] in ("ro", "rw"):
            readonly = parts.pop() == "ro"
        if len(parts) > 2:
            raise UsageError(f"invalid {what} {value!r}: expected /HOST/PATH[:/CONTAINER/PATH][:ro]")
        host, container, create = parts[0], parts[-1], False
    else:
        raise UsageError(f"invalid {what} {value!r}: expected \"/HOST:/CONTAINER\" "
                         "or a table {{ host = ..., container = ... }}")
    for p in (host, container):
        if not isinstance(p, str) or not p.startswith("/") or any(c.isspace() for c in p):
            raise UsageError(f"invalid {what} {value!r}: host and container paths must be absolute, without spaces")
    return Mount(host, container, readonly, create)


def parse_env(text: str) -> Tuple[str, str]:
    """`NAME=VALUE` -> (NAME, VALUE); raises UsageError."""
    name, sep, value = str(text).partition("=")
    if not sep or not _ENV_NAME_RE.match(name):
        raise UsageError(f"invalid --env {text!r}: expected NAME=VALUE")
    return name, value


def version_key(tag: str, suffixes: Sequence[str]) -> Optional[tuple]:
    """A sort key for a release tag `vX.Y.Z[rcN|.postN]<suffix>` whose suffix is in `suffixes`, else None."""
    m = _VERSION_TAG_RE.match(tag)
    if not m or m.group("suffix") not in suffixes:
        return None
    nums = tuple(int(x) for x in m.group("nums").split("."))
    nums = nums + (0,) * (4 - len(nums)) if len(nums) < 4 else nums
    if m.group("rc") is not None:
        stage = (0, int(m.group("rc")))
    elif m.group("post") is not None:
        stage = (2, int(m.group("post")))
    else:
        stage = (1, 0)
    # between equal versions prefer the preset's first suffix (Ubuntu before openEuler)
    return nums, stage, -list(suffixes).index(m.group("suffix"))


def pick_tag(tags: Iterable[str], suffixes: Sequence[str]) -> Optional[str]:
    """The highest release tag carrying one of `suffixes`, or None."""
    keyed = [(version_key(t, suffixes), t) for t in tags]
    keyed = [(k, t) for k, t in keyed if k is not None]
    return max(keyed)[1] if keyed else None


def tag_suffix(tag: str) -> Optional[str]:
    """The hardware/OS suffix of a release tag (`-a3-openeuler`), `""` for none, None if not a release tag."""
    m = _VERSION_TAG_RE.match(tag)
    return m.group("suffix") if m else None


# --- loading -----------------------------------------------------------------


def find_presets_file(option: Optional[str]) -> Optional[Path]:
    """The user's presets file: --presets, $IMGTOOL_PRESETS, ~/.config/imgtool/presets.toml, or None."""
    if option:
        return Path(option)
    env = os.environ.get("IMGTOOL_PRESETS")
    if env:
        return Path(env)
    user = Path(os.path.expanduser("~/.config/imgtool/presets.toml"))
    return user if user.is_file() else None


def load_presets(option: Optional[str] = None) -> PresetSet:
    """The built-in presets with the user's file merged over them; raises ConfigError (exit 2)."""
    layers = [_Layer(BUILTIN_PRESETS, *read_toml(BUILTIN_PRESETS))]
    user = find_presets_file(option)
    if user is not None:
        layers.append(_Layer(user, *read_toml(user)))
    return _build(layers)


@dataclass
class _Layer:
    path: Path
    data: Dict[str, Any]
    text: str

    def where(self, table: Optional[str], key: Optional[str] = None) -> str:
        line = _table_key_line(self.text, table, key)
        return f"{self.path}:{line}" if line else str(self.path)


# A resolved preset table: key -> (value, layer it came from, table name in that layer).
_Resolved = Dict[str, Tuple[Any, _Layer, str]]
_ORIGIN = "<origin>"


def _build(layers: List[_Layer]) -> PresetSet:
    for layer in layers:
        for key, value in layer.data.items():
            if key not in ("presets", "multi_node", "env_presets"):
                raise ConfigError(f"{layer.where(key)}: unknown key {key!r} "
                                  "(expected presets, multi_node, env_presets)")
            if not isinstance(value, dict):
                raise ConfigError(f"{layer.where(key)}: {key} must be a table ([{key}...])")
    resolved: Dict[str, _Resolved] = {}
    for layer in layers:
        resolved = _resolve_layer(layer, resolved)
    presets = tuple(_make_preset(name, table) for name, table in resolved.items())
    if not presets:
        raise ConfigError(f"{layers[-1].path}: no presets defined")

    multi: _Resolved = {}
    env_tables: Dict[str, _Resolved] = {}
    for layer in layers:
        mn = layer.data.get("multi_node", {})
        for key, value in mn.items():
            if key not in _MULTI_NODE_KEYS:
                raise ConfigError(f"{layer.where('multi_node', key)}: multi_node: unknown key {key!r} "
                                  f"(expected {', '.join(_MULTI_NODE_KEYS)})")
            multi[key] = (value, layer, "multi_node")
        for name, table in layer.data.get("env_presets", {}).items():
            label = f"env_presets.{name}"
            if not isinstance(table, dict):
                raise ConfigError(f"{layer.where(label)}: {label} must be a table")
            if not _NAME_RE.match(name):
                raise ConfigError(f"{layer.where(label)}: invalid env preset name {name!r}")
            merged = env_tables.setdefault(name, {})
            for key, value in table.items():
                if key not in _ENV_PRESET_KEYS:
                    raise ConfigError(f"{layer.where(label, key)}: {label}: unknown key {key!r} "
                                      "(expected description, env)")
                merged[key] = (value, layer, label)
    env_presets = tuple(_make_env_preset(n, t) for n, t in env_tables.items())
    return PresetSet(presets, _make_multi_node(multi, layers[0]), env_presets, tuple(str(la.path) for la in layers))


def _resolve_layer(layer: _Layer, below: Dict[str, _Resolved]) -> Dict[str, _Resolved]:
    """Apply one file's [presets.*] tables over the presets resolved so far (`extends` included)."""
    tables = layer.data.get("presets", {})
    out: Dict[str, _Resolved] = dict(below)
    done: Dict[str, _Resolved] = {}

    def resolve(name: str, stack: Tuple[str, ...]) -> _Resolved:
        if name in done:
            return done[name]
        label = f"presets.{name}"
        table = tables[name]
        if not isinstance(table, dict):
            raise ConfigError(f"{layer.where(label)}: {label} must be a table")
        if not _NAME_RE.match(name):
            raise ConfigError(f"{layer.where(label)}: invalid preset name {name!r} (letters, digits, '-', '_')")
        for key in table:
            if key not in _PRESET_KEYS:
                raise ConfigError(f"{layer.where(label, key)}: {label}: unknown key {key!r} "
                                  f"(expected {', '.join(_PRESET_KEYS)})")
        parent = table.get("extends")
        if parent is not None:
            if not isinstance(parent, str):
                raise ConfigError(f"{layer.where(label, 'extends')}: {label}.extends must be a preset name")
            if parent == name and name not in below:
                raise ConfigError(f"{layer.where(label, 'extends')}: {label}.extends: a preset cannot extend itself")
            if parent in stack:
                loop = " -> ".join(stack[stack.index(parent):] + (name, parent))
                raise ConfigError(f"{layer.where(label, 'extends')}: {label}.extends: loop {loop}")
            if parent in tables and parent != name:
                base = resolve(parent, stack + (name,))
            elif parent in below:
                base = below[parent]
            else:
                raise ConfigError(f"{layer.where(label, 'extends')}: {label}.extends: unknown preset {parent!r}")
        else:
            base = below.get(name, {})
        merged = dict(base)
        for key, value in table.items():
            if key != "extends":
                merged[key] = (value, layer, name)
        merged[_ORIGIN] = (None, layer, name)  # where the user last wrote this preset
        done[name] = merged
        return merged

    for name in tables:
        out[name] = resolve(name, ())
    return out


def _fail(origin: Tuple[Any, _Layer, str], key: str, problem: str, preset: str):
    _, layer, table = origin
    raise ConfigError(f"{layer.where('presets.' + table, key)}: presets.{preset}.{key}: {problem}")


def _make_preset(name: str, table: _Resolved) -> Preset:
    required = [k for k in _PRESET_KEYS if k not in ("extends",)]
    missing = [k for k in required if k not in table]
    if missing:
        _, layer, table_name = table[_ORIGIN]
        where = layer.where(f"presets.{table_name}")
        raise ConfigError(f"{where}: presets.{name}: missing {', '.join(missing)} "
                          "(a new preset needs every key, or extends = \"a2\")")

    def get(key, kind, check=None):
        origin = table[key]
        value = origin[0]
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            _fail(origin, key, f"must be {_PRESET_KEYS[key]}", name)
        if check is not None:
            try:
                return check(value)
            except UsageError as e:
                _fail(origin, key, e.message, name)
        return value

    def strings(key, check_each=None):
        values = get(key, list)
        out = []
        for v in values:
            if not isinstance(v, str):
                _fail(table[key], key, f"must be {_PRESET_KEYS[key]}", name)
            if check_each is not None:
                try:
                    v = check_each(v)
                except UsageError as e:
                    _fail(table[key], key, e.message, name)
            out.append(v)
        return tuple(out)

    def device(path):
        if not path.startswith("/dev/") or any(c.isspace() for c in path):
            raise UsageError(f"invalid device {path!r}: expected a path under /dev/")
        return path

    def mounts(values):
        if not isinstance(values, list):
            raise UsageError(f"must be {_PRESET_KEYS['mounts']}")
        return tuple(parse_mount(v) for v in values)

    def suffixes(values):
        out = []
        for v in values:
            if not isinstance(v, str) or (v and not re.match(r"^-[A-Za-z0-9_.-]+$", v)):
                raise UsageError(f"invalid tag suffix {v!r}: expected \"\" or like \"-a3\"")
            out.append(v)
        if not out:
            raise UsageError("needs at least one suffix (\"\" for none)")
        return tuple(out)

    def network(value):
        if not _NETWORK_RE.match(value):
            raise UsageError(f"invalid network {value!r}: expected bridge, host or a network name")
        return value

    card_list = get("cards", (str, int), parse_cards)
    min_cards = get("min_cards", int)
    if not 0 <= min_cards <= len(card_list):
        _fail(table["min_cards"], "min_cards", f"must be between 0 and the number of cards ({len(card_list)})", name)
    return Preset(
        name=name,
        description=" ".join(get("description", str).split()),
        cards=card_list,
        min_cards=min_cards,
        devices=strings("devices", device),
        mounts=get("mounts", list, mounts),
        shm_size=get("shm_size", str, lambda v: parse_size(v, "size")),
        network=get("network", str, network),
        ports=strings("ports", Port.parse),
        env=get("env", dict, _env_pairs),
        tag_suffixes=get("tag_suffixes", list, suffixes),
        privileged=get("privileged", bool),
        multi_node=get("multi_node", bool),
    )


def _env_pairs(values: Dict[str, Any]) -> Tuple[Tuple[str, str], ...]:
    out = []
    for k, v in values.items():
        if not _ENV_NAME_RE.match(k):
            raise UsageError(f"invalid variable name {k!r}")
        if isinstance(v, bool) or not isinstance(v, (str, int)):
            raise UsageError(f"{k} must be a string (quote it: {k} = \"...\")")
        out.append((k, str(v)))
    return tuple(out)


def _make_multi_node(table: _Resolved, builtin: _Layer) -> MultiNode:
    def fail(key, problem):
        layer = table[key][1] if key in table else builtin
        raise ConfigError(f"{layer.where('multi_node', key)}: multi_node.{key}: {problem}")

    for key in _MULTI_NODE_KEYS:
        if key not in table:
            fail(key, "missing")
    network = table["network"][0]
    if not isinstance(network, str) or not _NETWORK_RE.match(network):
        fail("network", "must be a network name like \"host\"")
    values = table["mounts"][0]
    if not isinstance(values, list):
        fail("mounts", "must be an array of mounts")
    try:
        mounts = tuple(parse_mount(v) for v in values)
    except UsageError as e:
        fail("mounts", e.message)
    return MultiNode(network, mounts)


def _make_env_preset(name: str, table: _Resolved) -> EnvPreset:
    label = f"env_presets.{name}"

    def fail(key, problem):
        origin = table.get(key) or next(iter(table.values()))
        raise ConfigError(f"{origin[1].where(label, key if key in table else None)}: {label}.{key}: {problem}")

    for key in _ENV_PRESET_KEYS:
        if key not in table:
            fail(key, "missing")
    if not isinstance(table["description"][0], str):
        fail("description", "must be a string")
    if not isinstance(table["env"][0], dict):
        fail("env", "must be a table of NAME = \"value\"")
    try:
        env = _env_pairs(table["env"][0])
    except UsageError as e:
        fail("env", e.message)
    return EnvPreset(name, table["description"][0], env)


def _table_key_line(text: str, table: Optional[str], key: Optional[str] = None) -> Optional[int]:
    """Best-effort line of `key` inside `[table]` (dotted, names maybe quoted), or of the header."""
    lines = text.splitlines()
    if table is None:
        return None
    parts = table.split(".")
    part_res = [rf"\s*(?:{re.escape(p)}|\"{re.escape(p)}\"|'{re.escape(p)}')\s*" for p in parts]
    header = re.compile(r"^\s*\[" + r"\.".join(part_res) + r"[\].]")  # [table] or its first [table.sub]
    start = next((i for i, ln in enumerate(lines) if header.match(ln)), None)
    if start is None:
        # a top-level key such as `presets = 1`
        return key_line(text, parts[0]) if len(parts) == 1 and key is None else None
    if key is None:
        return start + 1
    pat = re.compile(rf"^\s*[\"']?{re.escape(key)}[\"']?\s*=")
    for i in range(start + 1, len(lines)):
        if re.match(r"^\s*\[", lines[i]):
            break
        if pat.match(lines[i]):
            return i + 1
    return start + 1


# --- building a run ----------------------------------------------------------


def build_spec(presets: PresetSet, preset_name: str, options: RunOptions, image: str = "") -> RunSpec:
    """The container the user asked for: preset + options, validated; raises UsageError."""
    preset = presets.get(preset_name)
    if options.devices is None or options.devices.strip().lower() == "all":
        cards = preset.cards
    else:
        try:
            cards = parse_cards(options.devices)
        except UsageError:
            raise UsageError(f"invalid --devices {options.devices!r}: expected card numbers like 0,1 or 0-7, or all")
        outside = [c for c in cards if c not in preset.cards]
        if outside:
            raise UsageError(f"invalid --devices {options.devices!r}: card {outside[0]} is outside preset "
                             f"{preset.name}'s range {format_cards(preset.cards)}")
    if len(cards) < preset.min_cards:
        raise UsageError(f"invalid --devices {options.devices!r}: preset {preset.name} needs at least "
                         f"{preset.min_cards} cards")
    shm = parse_size(options.shm_size, "--shm-size") if options.shm_size is not None else preset.shm_size

    mounts = list(preset.mounts)
    network = preset.network
    if options.multi_node:
        if not preset.multi_node:
            multi = [p.name for p in presets.presets if p.multi_node]
            raise UsageError(f"--multi-node does not apply to preset {preset.name}; it applies to: {', '.join(multi)}")
        network = presets.multi_node.network
        mounts += [m for m in presets.multi_node.mounts if m.container not in {x.container for x in mounts}]
    if options.network:
        if not _NETWORK_RE.match(options.network):
            raise UsageError(f"invalid --net {options.network!r}: expected host, bridge, none or a network name")
        network = options.network
    for v in options.volumes:
        m = parse_mount(v, "--volume")
        mounts = [x for x in mounts if x.container != m.container]
        mounts.append(Mount(m.host, m.container, m.readonly, create=False, user=True))

    env: Dict[str, str] = dict(preset.env)
    for name in options.env_presets:
        env.update(presets.env_preset(name).env)
    for item in options.env:
        k, v = parse_env(item)
        env[k] = v

    ports = preset.ports
    if options.publish:
        ports = tuple(Port.parse(p, "--publish") for p in options.publish)
    if network in ("host", "none") or network.startswith("container:"):
        ports = ()  # Docker discards published ports on these networks anyway
    if options.name is not None and not _CONTAINER_NAME_RE.match(options.name):
        raise UsageError(f"invalid --name {options.name!r}: "
                         "letters, digits, '_', '.', '-', starting with a letter or digit")

    return RunSpec(
        preset=preset.name,
        image=image,
        cards=tuple(cards),
        devices=preset.devices,
        mounts=tuple(mounts),
        env=tuple(env.items()),
        shm_size=shm,
        network=None if network in ("bridge", "default") else network,
        ports=tuple(ports),
        privileged=options.privileged or preset.privileged,
        privileged_by_preset=preset.privileged,
        name=options.name,
        command=tuple(options.command),
        detach=options.detach,
        remove=options.remove,
        interactive=options.interactive,
    )


def privileged_warning(spec: RunSpec) -> Optional[str]:
    """The stderr warning when the spec is privileged, else None."""
    if not spec.privileged:
        return None
    if spec.privileged_by_preset:
        return (f"preset {spec.preset} runs with --privileged, as the vllm-ascend docs do for this hardware: "
                f"{PRIVILEGED_EFFECT}")
    return f"--privileged: {PRIVILEGED_EFFECT}"


# --- images ------------------------------------------------------------------


def normalize_image(text: str, default_image: str) -> str:
    """What the user typed for an image, for Docker: a bare tag means `default_image:TAG`; raises UsageError."""
    text = (text or "").strip()
    if not text or text.startswith("-") or any(c.isspace() for c in text):
        raise UsageError(f"invalid image {text!r}: expected a tag (v0.11.0rc1-a3) or NAME[:TAG]")
    if "/" not in text and ":" not in text and "@" not in text:
        return str(ImageRef.parse(text, default_image))
    return text


def default_image_for(preset: Preset, default_image: str, local_tags: Optional[Sequence[str]]) -> Tuple[str, bool]:
    """(image, is_placeholder): the newest local tag of `default_image` for the preset, else a placeholder."""
    tag = pick_tag(local_tags or (), preset.tag_suffixes)
    if tag is not None:
        return f"{default_image}:{tag}", False
    return f"{default_image}:{PLACEHOLDER_TAG}{preset.tag_suffixes[0]}", True


def suffix_mismatch(preset: Preset, image: str, default_image: str) -> Optional[str]:
    """A warning when `image` is a release tag of `default_image` built for other hardware."""
    name, _, tag = image.rpartition(":")
    if name != default_image or "/" in tag:
        return None
    suffix = tag_suffix(tag)
    if suffix is None or suffix in preset.tag_suffixes:
        return None
    wanted = " or ".join(f"vX.Y.Z{s}" for s in preset.tag_suffixes[:2])
    return f"image tag {tag} does not look like one for preset {preset.name} (expected {wanted})"


# --- the host ------------------------------------------------------------------


def fit_to_host(spec: RunSpec, presets: PresetSet, devices_given: bool, allow_missing: bool,
                exists: Callable[[str], bool] = os.path.exists) -> Tuple[RunSpec, List[str]]:
    """The spec cut to what this host has: (spec, paths left out); raises ImgtoolError.

    Without an explicit --devices, the cards present within the preset's range are used.
    Missing management devices and host files are an error unless `allow_missing`, which
    leaves them (and absent cards) out; --volume paths must always exist.
    """
    preset = presets.get(spec.preset)
    present = tuple(c for c in spec.cards if exists(CARD_DEVICE.format(c)))
    absent_cards = [CARD_DEVICE.format(c) for c in spec.cards if c not in present]
    absent_devices = [d for d in spec.devices if not exists(d)]
    absent_mounts = [m for m in spec.mounts if not m.create and not exists(m.host)]
    user_missing = [m.host for m in absent_mounts if m.user]
    if user_missing:
        raise ImgtoolError(f"--volume host path not found: {', '.join(user_missing)}",
                           hint="create it first or fix the path")
    if allow_missing:
        left_out = absent_cards + absent_devices + [m.host for m in absent_mounts]
        kept = _replace(spec, cards=present, devices=tuple(d for d in spec.devices if d not in absent_devices),
                        mounts=tuple(m for m in spec.mounts if m not in absent_mounts))
        return kept, left_out
    hint = ("is the Ascend driver installed (npu-smi info)? "
            "--allow-missing-devices starts the container without what is absent")
    if not present:
        raise ImgtoolError(f"no Ascend cards found on this host: none of /dev/davinci[{format_cards(spec.cards)}] exist",
                           hint=hint)
    if not devices_given and len(present) < preset.min_cards:
        raise ImgtoolError(f"preset {preset.name} needs at least {preset.min_cards} cards; this host has "
                           f"{len(present)}: {', '.join(CARD_DEVICE.format(c) for c in present)}", hint=hint)
    missing = (absent_cards if devices_given else []) + absent_devices + [m.host for m in absent_mounts]
    if missing:
        raise ImgtoolError(f"not found on this host: {', '.join(missing)}", hint=hint)
    return _replace(spec, cards=present), []


# --- rendering -----------------------------------------------------------------


def render_groups(spec: RunSpec) -> List[List[str]]:
    """The `docker run` argv in groups, one group per line of the readable form."""
    head = ["docker", "run"]
    if spec.remove:
        head.append("--rm")
    head.append("-it")
    if spec.detach:
        head.append("-d")
    if spec.name:
        head += ["--name", spec.name]
    if spec.privileged:
        head.append("--privileged")
    if spec.network:
        head.append(f"--net={spec.network}")
    head.append(f"--shm-size={spec.shm_size_text}")
    groups = [head]
    groups += [["--device", d] for d in spec.device_paths]
    groups += [["-v", m.spec] for m in spec.mounts]
    groups += [["-e", f"{k}={v}"] for k, v in spec.env]
    groups += [["-p", str(p)] for p in spec.ports]
    groups.append([spec.image, *spec.command])
    return groups


def render_argv(spec: RunSpec) -> List[str]:
    """The `docker run` command as an argv list."""
    return [a for g in render_groups(spec) for a in g]


def render_command(spec: RunSpec, one_line: bool = False) -> str:
    """The shell-quoted command: one line, or one flag per line joined with backslashes."""
    lines = [" ".join(shlex.quote(a) for a in g) for g in render_groups(spec)]
    if one_line:
        return " ".join(lines)
    return " \\\n    ".join(lines)
