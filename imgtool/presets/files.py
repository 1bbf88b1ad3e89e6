"""Presets files: presets.toml (built in) with the user's file merged over it -> `PresetSet`.

Every problem is a ConfigError naming the file and line (`extends` chains, unknown keys,
bad values); the values themselves are checked by the parsers in `preset.py`.
"""

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, NoReturn, Optional, Tuple

from ..config import find_user_file, key_line, read_toml
from ..errors import ConfigError, UsageError
from ..model import parse_size
from ..schema import Key, Table, strings
from .preset import (ENV_NAME_RE, NETWORK_RE, EnvPreset, MultiNode, Port, Preset, PresetSet, parse_cards,
                     parse_mount, parse_resource_name)

BUILTIN_PRESETS = Path(__file__).with_name("presets.toml")

_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*\Z")

_MULTI_NODE_KEYS = ("network", "mounts")
_ENV_PRESET_KEYS = ("description", "env")


def _strings_of(check: Callable[[str], Any]) -> Callable[[List[Any]], Tuple[Any, ...]]:
    """An array of strings, each through `check` (UsageError: its message; a non-string: the key's text)."""
    return lambda values: tuple(check(v) for v in strings(values))


def _device(path: str) -> str:
    if not path.startswith("/dev/") or any(c.isspace() for c in path):
        raise UsageError(f"invalid device {path!r}: expected a path under /dev/")
    return path


def _suffixes(values: List[Any]) -> Tuple[str, ...]:
    for v in values:
        if not isinstance(v, str) or (v and not re.match(r"-[A-Za-z0-9_.-]+\Z", v)):
            raise UsageError(f"invalid tag suffix {v!r}: expected \"\" or like \"-a3\"")
    if not values:
        raise UsageError("needs at least one suffix (\"\" for none)")
    return tuple(values)


def _alias(value: str) -> str:
    if not _NAME_RE.match(value):
        raise UsageError(f"invalid alias {value!r} (letters, digits, '-', '_')")
    return value


def _network(value: str) -> str:
    if not NETWORK_RE.match(value):
        raise UsageError(f"invalid network {value!r}: expected bridge, host or a network name")
    return value


# What a [presets.NAME] table may hold; a new preset needs every key but extends, aliases and resource_name.
_PRESET = Table(
    Key("description", str, True, "a string", lambda v: " ".join(v.split())),
    Key("extends", str, False, "a preset name"),
    Key("cards", (str, int), True, 'a card range like "0-7"', parse_cards),
    Key("min_cards", int, True, "an integer"),
    Key("devices", list, True, "an array of device paths", _strings_of(_device)),
    Key("mounts", list, True, "an array of mounts", lambda vs: tuple(parse_mount(v) for v in vs)),
    Key("shm_size", str, True, 'a size like "1g"', lambda v: parse_size(v, "size")),
    Key("network", str, True, '"bridge" or "host"', _network),
    Key("ports", list, True, 'an array like ["8000:8000"]', _strings_of(Port.parse)),
    Key("env", dict, True, "a table of NAME = \"value\"", lambda v: _env_pairs(v)),
    Key("tag_suffixes", list, True, 'an array like ["-a3", "-a3-openeuler"]', _suffixes),
    Key("privileged", bool, True, "true or false"),
    Key("multi_node", bool, True, "true or false"),
    Key("aliases", list, False, 'an array of other names like ["950dt"]', _strings_of(_alias)),
    Key("resource_name", str, False, 'an extended resource like "huawei.com/Ascend910", or "" for none',
        lambda v: v and parse_resource_name(v)),
    wrong="must be {what}",
)


def find_presets_file(option: Optional[str]) -> Optional[Path]:
    """The user's presets file: --presets, $IMGTOOL_PRESETS, ~/.config/imgtool/presets.toml, or None."""
    return find_user_file(option, "IMGTOOL_PRESETS", "presets.toml")


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

    def fail(self, table: Optional[str] = None, label: str = "") -> Callable[[Optional[str], str], NoReturn]:
        """A `schema.Fail` naming the line of a key of `[table]` (top level: the key's own table or line)."""

        def fail(key: Optional[str], problem: str) -> NoReturn:
            where = self.where(table, key) if table is not None else self.where(key)
            raise ConfigError(f"{where}: {label}{problem}")

        return fail


# A resolved preset table: key -> (value, layer it came from, table name in that layer).
_Resolved = Dict[str, Tuple[Any, _Layer, str]]
_ORIGIN = "<origin>"


_FILE = Table(Key("presets", dict), Key("multi_node", dict), Key("env_presets", dict),
              wrong="{key} must be a table ([{key}...])")
_MULTI_NODE = Table(*(Key(k) for k in _MULTI_NODE_KEYS))
_ENV_PRESET = Table(*(Key(k) for k in _ENV_PRESET_KEYS))


def _build(layers: List[_Layer]) -> PresetSet:
    for layer in layers:
        _FILE.check(layer.data, layer.fail())
    resolved: Dict[str, _Resolved] = {}
    for layer in layers:
        resolved = _resolve_layer(layer, resolved)
    presets = tuple(_make_preset(name, table) for name, table in resolved.items())
    if not presets:
        raise ConfigError(f"{layers[-1].path}: no presets defined")
    _check_aliases(presets, resolved)
    multi: _Resolved = {}
    env_tables: Dict[str, _Resolved] = {}
    for layer in layers:
        mn = layer.data.get("multi_node", {})
        _MULTI_NODE.check_unknown(mn, layer.fail("multi_node", "multi_node: "))
        multi.update((key, (value, layer, "multi_node")) for key, value in mn.items())
        for name, table in layer.data.get("env_presets", {}).items():
            _merge_env_preset(layer, name, table, env_tables.setdefault(name, {}))
    env_presets = tuple(_make_env_preset(n, t) for n, t in env_tables.items())
    return PresetSet(presets, _make_multi_node(multi, layers[0]), env_presets, tuple(str(la.path) for la in layers))


def _check_aliases(presets: Tuple[Preset, ...], resolved: Dict[str, _Resolved]) -> None:
    """No alias names another preset (case does not count)."""
    taken = {p.name.lower(): p.name for p in presets}
    for p in presets:
        for a in p.aliases:
            if a.lower() in taken and taken[a.lower()] != p.name:
                _fail(resolved[p.name]["aliases"], "aliases", f"{a!r} already names preset {taken[a.lower()]}", p.name)
            taken[a.lower()] = p.name


def _merge_env_preset(layer: _Layer, name: str, table: Any, merged: _Resolved) -> None:
    """One file's [env_presets.NAME] over what the files below said of it."""
    label = f"env_presets.{name}"
    if not isinstance(table, dict):
        raise ConfigError(f"{layer.where(label)}: {label} must be a table")
    if not _NAME_RE.match(name):
        raise ConfigError(f"{layer.where(label)}: invalid env preset name {name!r}")
    _ENV_PRESET.check_unknown(table, layer.fail(label, f"{label}: "))
    merged.update((key, (value, layer, label)) for key, value in table.items())
    if not merged:  # an empty table: nothing to name a line by later
        raise ConfigError(f"{layer.where(label)}: {label} is empty (expected description, env)")


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
        _PRESET.check_unknown(table, layer.fail(label, f"{label}: "))
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
        # aliases name this preset only: one that extends it does not answer to them
        merged = {k: v for k, v in base.items() if k != "aliases" or parent in (None, name)}
        for key, value in table.items():
            if key != "extends":
                merged[key] = (value, layer, name)
        merged[_ORIGIN] = (None, layer, name)  # where the user last wrote this preset
        done[name] = merged
        return merged

    for name in tables:
        out[name] = resolve(name, ())
    return out


def _fail(origin: Tuple[Any, _Layer, str], key: str, problem: str, preset: str) -> NoReturn:
    _, layer, table = origin
    raise ConfigError(f"{layer.where('presets.' + table, key)}: presets.{preset}.{key}: {problem}")


def _make_preset(name: str, table: _Resolved) -> Preset:
    missing = [k for k in _PRESET.required if k not in table]
    if missing:
        _, layer, table_name = table[_ORIGIN]
        where = layer.where(f"presets.{table_name}")
        raise ConfigError(f"{where}: presets.{name}: missing {', '.join(missing)} "
                          "(a new preset needs every key, or extends = \"a2\")")

    def fail(key: Optional[str], problem: str) -> NoReturn:
        if key is None:
            _, layer, table_name = table[_ORIGIN]
            raise ConfigError(f"{layer.where(f'presets.{table_name}')}: presets.{name}: {problem}")
        _fail(table[key], key, problem, name)

    v = _PRESET.check({k: t[0] for k, t in table.items() if k not in (_ORIGIN, "extends")}, fail, unknown=False)
    if not 0 <= v["min_cards"] <= len(v["cards"]):
        fail("min_cards", f"must be between 0 and the number of cards ({len(v['cards'])})")
    return Preset(name=name, description=v["description"], cards=v["cards"], min_cards=v["min_cards"],
                  devices=v["devices"], mounts=v["mounts"], shm_size=v["shm_size"], network=v["network"],
                  ports=v["ports"], env=v["env"], tag_suffixes=v["tag_suffixes"], privileged=v["privileged"],
                  multi_node=v["multi_node"], aliases=v.get("aliases", ()), resource_name=v.get("resource_name", ""))


def _env_pairs(values: Dict[str, Any]) -> Tuple[Tuple[str, str], ...]:
    out = []
    for k, v in values.items():
        if not ENV_NAME_RE.match(k):
            raise UsageError(f"invalid variable name {k!r}")
        if isinstance(v, bool) or not isinstance(v, (str, int)):
            raise UsageError(f"{k} must be a string (quote it: {k} = \"...\")")
        out.append((k, str(v)))
    return tuple(out)


def _make_multi_node(table: _Resolved, builtin: _Layer) -> MultiNode:
    def fail(key: str, problem: str) -> NoReturn:
        layer = table[key][1] if key in table else builtin
        raise ConfigError(f"{layer.where('multi_node', key)}: multi_node.{key}: {problem}")

    for key in _MULTI_NODE_KEYS:
        if key not in table:
            fail(key, "missing")
    network = table["network"][0]
    if not isinstance(network, str) or not NETWORK_RE.match(network):
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

    def fail(key: str, problem: str) -> NoReturn:
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
