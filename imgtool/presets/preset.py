"""A preset and the values it is made of: mounts, ports, cards, sizes, env; pure.

These are shared by the presets files (`files.py`, which builds them from TOML) and by a
run (`run.py`, which combines them with what the user asked for).
"""

import re
from dataclasses import dataclass, field
from typing import Any, Iterable, List, Optional, Set, Tuple

from ..errors import UsageError

# matched whole (\Z): `$` also matches before a final newline, and "NAME\n" passed --name, --net and -e
ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_NAME = r"[A-Za-z0-9][A-Za-z0-9_.-]*"  # what Docker takes as a container or network name
CONTAINER_NAME_RE = re.compile(rf"{_NAME}\Z")
NETWORK_RE = re.compile(rf"(?:{_NAME}|container:{_NAME})\Z")
# An extended resource: a domain prefix, "/", a name (Kubernetes' qualified name rules, e.g. huawei.com/Ascend910)
RESOURCE_NAME_RE = re.compile(r"^(?=.{1,253}/)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
                              r"/[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?\Z")
_PORT_RE = re.compile(r"^(?:(?P<ip>[0-9]{1,3}(?:\.[0-9]{1,3}){3}|\[[0-9a-fA-F:]+\]):)?"
                      r"(?:(?P<host>[0-9]{1,5}):)?(?P<container>[0-9]{1,5})(?:/(?P<proto>tcp|udp|sctp))?\Z")


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
        if m is None or not all(1 <= int(x) <= 65535 for x in (m.group("host"), m.group("container")) if x):
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
    aliases: Tuple[str, ...] = ()  # other names it answers to, e.g. 950dt for a5
    resource_name: str = ""  # the device plugin's extended resource for its NPUs (Kubernetes); "": none known

    @property
    def tag_patterns(self) -> Tuple[str, ...]:
        """How the image tags this preset goes with look, first the usual one: `vX.Y.Z-a3`, ..."""
        return tuple(f"vX.Y.Z{s}" for s in self.tag_suffixes)

    @property
    def tag_pattern(self) -> str:
        return self.tag_patterns[0]

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
            "aliases": list(self.aliases),
            "resource_name": self.resource_name or None,
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
        for p in self.presets:  # 950DT as the README writes it, too
            if name.lower() in (p.name.lower(), *(a.lower() for a in p.aliases)):
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


# --- small formats -----------------------------------------------------------


def parse_cards(text: Any) -> Tuple[int, ...]:
    """Parse `0-7`, `0,1`, `0-3,8` (or an int) into sorted card numbers; raises UsageError."""
    raw = str(text).strip()
    bad = UsageError(f"invalid card list {raw!r}: expected numbers and ranges like 0,1 or 0-7")
    cards: Set[int] = set()
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
    if not isinstance(host, str) or not isinstance(container, str) or \
            not all(p.startswith("/") and not any(c.isspace() for c in p) for p in (host, container)):
        raise UsageError(f"invalid {what} {value!r}: host and container paths must be absolute, without spaces")
    return Mount(host, container, readonly, create)


def parse_resource_name(text: str) -> str:
    """An extended resource name like `huawei.com/Ascend910`; raises UsageError."""
    if not RESOURCE_NAME_RE.match(text) or text.split("/")[0].endswith("kubernetes.io"):
        raise UsageError(f"invalid resource name {text!r}: expected DOMAIN/NAME outside kubernetes.io, "
                         "e.g. huawei.com/Ascend910")
    return text


def parse_env(text: str) -> Tuple[str, str]:
    """`NAME=VALUE` -> (NAME, VALUE); raises UsageError."""
    name, sep, value = str(text).partition("=")
    if not sep or not ENV_NAME_RE.match(name):
        raise UsageError(f"invalid --env {text!r}: expected NAME=VALUE")
    return name, value
