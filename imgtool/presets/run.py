"""A run: preset + the user's options -> `RunSpec`, cut to the host, rendered as `docker run`
or `podman run`.

Pure: the runtime's room (runtimes/docker.py, runtimes/podman.py, which runs the rendered command) is asked
about local images and starts the container;
the host's device nodes are looked at through an `exists` callable, so every decision
here can be tested without an NPU.
"""

import os
import shlex
from dataclasses import dataclass, replace
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from .. import modelcar
from ..errors import ImgtoolError, UsageError
from ..model import ImageRef, parse_size
from ..releases import TagInfo, pick_tag
from ..runtimes.base import RunProgram
from ..runtimes.choice import PROGRAMS
from .preset import (CONTAINER_NAME_RE, NETWORK_RE, Mount, Port, Preset, PresetSet, docker_size, format_cards, parse_cards, parse_env,
                     parse_mount)

CARD_DEVICE = "/dev/davinci{}"
# A tag that cannot be pulled by accident: docker rejects it at once as a reference.
PLACEHOLDER_TAG = "<version>"
DEFAULT_NAME = "vllm-ascend"


# The program rendered is the runtime room's (runtimes.base.RunProgram, one per runtime with a `run`): Podman 4.3
# takes every flag imgtool renders in Docker's syntax (--net is its alias of --network, --shm-size its units
# k/m/g); `podman run` pulls a missing image by default, so its program adds --pull=never: an offline host must
# get "image not known" at once, never a pull or a short-name prompt.
DEFAULT_PROGRAM = PROGRAMS[0]  # `docker run`: run-flags' syntax when no runtime answers

PRIVILEGED_EFFECT = (
    "it gives the container every host device and all kernel capabilities and turns off its "
    "seccomp/AppArmor confinement; use it only with an image you trust (vllm-ascend FAQ 20)"
)


# What the container is told so that nothing in it reaches for a hub: huggingface_hub and transformers read the HF
# cache only; vLLM reads VLLM_USE_MODELSCOPE as true only when it lowercases to "true" ("1" is false there).
HF_OFFLINE = (("HF_HUB_OFFLINE", "1"), ("TRANSFORMERS_OFFLINE", "1"))
MODELSCOPE_ENV = (("VLLM_USE_MODELSCOPE", "true"),)


# Where a model's modelcar image (imgtool/modelcar.py: its files under /models) is mounted when it is served as an
# image (a Kubernetes image volume, `--mount type=image`): its files are then at MODELCAR_MOUNT/models, the path
# served whether the runtime mounts the image's root there or (a subPath) its models/ at that path.
MODELCAR_MOUNT = "/mnt/modelcar"
MODELCAR_PATH = f"{MODELCAR_MOUNT}/{modelcar.ROOT}"


@dataclass(frozen=True)
class ServedModel:
    """A placed model a container serves: `folder` (all of the model: for the HF cache models--ORG--NAME, whose
    snapshot links reach its blobs/) is bound read-only at the same path inside, and `vllm serve PATH` is its
    command, served under its hub name. `target`: hf, modelscope or dir (a plain directory). Served as an image
    (`image`: its modelcar's name), the image is mounted at MODELCAR_MOUNT and PATH is MODELCAR_PATH."""

    name: str  # ORG/NAME: the name clients of the OpenAI API ask for (--served-model-name)
    target: str
    folder: str
    path: str
    hub: Optional[str] = None  # hf | modelscope: what the modelcar's name says (None: not known)
    commit: Optional[str] = None  # the placed commit (None: not known)
    image: Optional[str] = None  # the modelcar image mounted instead of the folder

    @property
    def modelcar(self) -> Optional[str]:
        """The name of this model commit's modelcar image (`models.local/hf/org/name:COMMIT-modelcar`), or None
        when the hub or the commit is not known."""
        from ..bundle.catalog import modelcar_reference

        if self.hub is None or self.commit is None:
            return None
        return modelcar_reference(self.hub, self.name, self.commit)

    def as_image(self) -> "ServedModel":
        """The model served from its modelcar image; raises UsageError when it has no modelcar name."""
        if self.modelcar is None:
            raise UsageError(f"{self.name} cannot be mounted as its modelcar image: the commit placed at {self.path} "
                             f"is not known (a download imgtool did not place)",
                             hint="imgtool load BUNDLE places it with its commit; --k8s-version 1.34 mounts the "
                                  "placed directory instead (hostPath)")
        return replace(self, image=self.modelcar, path=MODELCAR_PATH)

    @property
    def mount(self) -> Mount:
        return Mount(self.folder, self.folder, readonly=True, create=False, user=True)

    @property
    def image_target(self) -> str:
        return MODELCAR_MOUNT

    @property
    def image_mount(self) -> str:
        """`--mount` of the modelcar image for docker and podman run (read-only in both)."""
        return f"type=image,source={self.image},destination={MODELCAR_MOUNT}"

    @property
    def env(self) -> Tuple[Tuple[str, str], ...]:
        return MODELSCOPE_ENV if self.target == "modelscope" else HF_OFFLINE

    def command(self, extra: Sequence[str] = ()) -> Tuple[str, ...]:
        return ("vllm", "serve", self.path, "--served-model-name", self.name, *extra)

    def to_json(self) -> dict:
        out = {"name": self.name, "target": self.target, "folder": self.folder, "path": self.path}
        if self.image is not None:
            out["image"] = self.image
        return out


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
    program: RunProgram = DEFAULT_PROGRAM  # the runtime's `run`
    model: Optional[ServedModel] = None


@dataclass(frozen=True)
class RunSpec:
    """One container to start: everything `docker run` (or `podman run`) needs, as plain values."""

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
    interactive: bool = True  # -it (rendered with -d too: detached like `docker run -itd`)
    image_is_placeholder: bool = False
    program: RunProgram = DEFAULT_PROGRAM  # the runtime's `run`: the program rendered
    model: Optional[ServedModel] = None

    def for_program(self, program: RunProgram) -> "RunSpec":
        return replace(self, program=program)

    def for_terminal(self, interactive: bool) -> "RunSpec":
        """The spec as started here: -it only when the session is on a terminal."""
        return replace(self, interactive=interactive)

    @property
    def shm_size_text(self) -> str:
        return docker_size(self.shm_size)

    @property
    def device_paths(self) -> Tuple[str, ...]:
        """Card nodes in order, then the management devices."""
        return tuple(CARD_DEVICE.format(c) for c in self.cards) + self.devices

    def with_model_image(self) -> "RunSpec":
        """The spec with its model served from the modelcar image (ServedModel.as_image) instead of the placed
        directory: that mount left out, `vllm serve` pointed into the image."""
        old = self.model
        if old is None:
            return self
        new = old.as_image()
        command = self.command
        if command[:3] == ("vllm", "serve", old.path):
            command = command[:2] + (new.path,) + command[3:]
        return replace(self, model=new, command=command, mounts=tuple(m for m in self.mounts if m != old.mount))

    def with_image(self, image: str, placeholder: bool = False) -> "RunSpec":
        return replace(self, image=image, image_is_placeholder=placeholder)

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
            "model": self.model.to_json() if self.model is not None else None,
            "argv": render_argv(self),
            "command_line": render_command(self, one_line=True),
        }


# --- building a run ----------------------------------------------------------


# Options checked on their own: (option, attribute, whether a value is refused, why).
_OPTION_RULES: Tuple[Tuple[str, str, Callable[[Optional[str]], bool], str], ...] = (
    ("--net", "network", lambda v: bool(v) and not NETWORK_RE.match(v or ""),
     "expected host, bridge, none or a network name"),
    ("--name", "name", lambda v: v is not None and not CONTAINER_NAME_RE.match(v),
     "letters, digits, '_', '.', '-', starting with a letter or digit"),
)


def build_spec(presets: PresetSet, preset_name: str, options: RunOptions, image: str = "") -> RunSpec:
    """The container the user asked for: preset + options, validated; raises UsageError."""
    preset = presets.get(preset_name)
    cards = _cards(preset, options.devices)
    shm = parse_size(options.shm_size, "--shm-size") if options.shm_size is not None else preset.shm_size
    network, mounts = _network_and_mounts(presets, preset, options)
    for option, attr, refused, why in _OPTION_RULES:
        if refused(getattr(options, attr)):
            raise UsageError(f"invalid {option} {getattr(options, attr)!r}: {why}")
    env: Dict[str, str] = dict(preset.env)
    for name in options.env_presets:
        env.update(presets.env_preset(name).env)
    if options.model is not None:
        env.update(options.model.env)
    env.update(parse_env(item) for item in options.env)
    ports = tuple(Port.parse(p, "--publish") for p in options.publish) if options.publish else preset.ports
    if network in ("host", "none") or network.startswith("container:"):
        ports = ()  # Docker discards published ports on these networks anyway
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
        command=_command(options),
        detach=options.detach,
        remove=options.remove,
        interactive=options.interactive,
        program=options.program,
        model=options.model,
    )


def _command(options: RunOptions) -> Tuple[str, ...]:
    """The container's command: with a model, `vllm serve PATH` and the words after -- that are options
    (`-- --tensor-parallel-size 2`), or the words after -- when they are a command of their own (`-- bash`)."""
    words = tuple(options.command)
    if options.model is None or (words and not words[0].startswith("-")):
        return words
    return options.model.command(words)


def _cards(preset: Preset, devices: Optional[str]) -> Tuple[int, ...]:
    """The cards --devices names within the preset's range (the preset's own without it); raises UsageError."""
    if not explicit_cards(devices):
        cards = preset.cards
    else:
        try:
            cards = parse_cards(devices)
        except UsageError:
            raise UsageError(f"invalid --devices {devices!r}: expected card numbers like 0,1 or 0-7, or all") from None
        outside = [c for c in cards if c not in preset.cards]
        if outside:
            raise UsageError(f"invalid --devices {devices!r}: card {outside[0]} is outside preset "
                             f"{preset.name}'s range {format_cards(preset.cards)}")
    if len(cards) < preset.min_cards:
        raise UsageError(f"invalid --devices {devices!r}: preset {preset.name} needs at least "
                         f"{preset.min_cards} cards")
    return tuple(cards)


def _network_and_mounts(presets: PresetSet, preset: Preset, options: RunOptions) -> Tuple[str, List[Mount]]:
    """The network (--multi-node's, then --net) and the mounts (--multi-node's added, --volume over them)."""
    mounts = list(preset.mounts)
    network = preset.network
    if options.multi_node:
        if not preset.multi_node:
            multi = [p.name for p in presets.presets if p.multi_node]
            raise UsageError(f"--multi-node does not apply to preset {preset.name}; it applies to: {', '.join(multi)}")
        network = presets.multi_node.network
        mounts += [m for m in presets.multi_node.mounts if m.container not in {x.container for x in mounts}]
    if options.network:
        network = options.network
    if options.model is not None and options.model.image is None:  # before --volume: a -v to the same container
        # path replaces it, as it does a preset's
        mounts = [x for x in mounts if x.container != options.model.mount.container] + [options.model.mount]
    for v in options.volumes:
        m = parse_mount(v, "--volume")
        mounts = [x for x in mounts if x.container != m.container]
        mounts.append(Mount(m.host, m.container, m.readonly, create=False, user=True))
    return network, mounts


def explicit_cards(devices: Optional[str]) -> bool:
    """Whether --devices names cards, rather than leaving them to the preset (absent or `all`)."""
    return devices is not None and devices.strip().lower() != "all"


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
    suffix = TagInfo.parse(tag).suffix
    if suffix is None or suffix in preset.tag_suffixes:
        return None
    wanted = " or ".join(preset.tag_patterns[:2])
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
    absent = _Absent(spec, exists)
    user_missing = [m.host for m in absent.mounts if m.user]
    if user_missing:
        raise ImgtoolError(f"--volume host path not found: {', '.join(user_missing)}",
                           hint="create it first or fix the path")
    if allow_missing:
        kept = replace(spec, cards=absent.present, devices=tuple(d for d in spec.devices if d not in absent.devices),
                       mounts=tuple(m for m in spec.mounts if m not in absent.mounts))
        return kept, absent.cards + absent.devices + [m.host for m in absent.mounts]
    hint = ("is the Ascend driver installed (npu-smi info)? "
            "--allow-missing-devices starts the container without what is absent")
    if not absent.present:
        raise ImgtoolError(f"no Ascend cards found on this host: none of /dev/davinci[{format_cards(spec.cards)}] exist",
                           hint=hint)
    if not devices_given and len(absent.present) < preset.min_cards:
        raise ImgtoolError(f"preset {preset.name} needs at least {preset.min_cards} cards; this host has "
                           f"{len(absent.present)}: {', '.join(CARD_DEVICE.format(c) for c in absent.present)}", hint=hint)
    missing = (absent.cards if devices_given else []) + absent.devices + [m.host for m in absent.mounts]
    if missing:
        raise ImgtoolError(f"not found on this host: {', '.join(missing)}", hint=hint)
    return replace(spec, cards=absent.present), []


class _Absent:
    """What of a spec this host lacks: card nodes, management devices, host paths to mount (not created)."""

    def __init__(self, spec: RunSpec, exists: Callable[[str], bool]) -> None:
        self.present = tuple(c for c in spec.cards if exists(CARD_DEVICE.format(c)))
        self.cards = [CARD_DEVICE.format(c) for c in spec.cards if c not in self.present]
        self.devices = [d for d in spec.devices if not exists(d)]
        self.mounts = [m for m in spec.mounts if not m.create and not exists(m.host)]


# --- rendering -----------------------------------------------------------------


def render_groups(spec: RunSpec) -> List[List[str]]:
    """The `docker run` (or `podman run`: spec.program) argv in groups, one group per line of the readable form."""
    head = [spec.program.name, "run"]
    if spec.remove:
        head.append("--rm")
    if spec.interactive or spec.detach:
        head.append("-it")
    if spec.detach:
        head.append("-d")
    head += spec.program.extra
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
    if spec.model is not None and spec.model.image is not None:
        groups.append(["--mount", spec.model.image_mount])
    groups += [["-e", f"{k}={v}"] for k, v in spec.env]
    groups += [["-p", str(p)] for p in spec.ports]
    if spec.model is not None and spec.command:  # `vllm serve PATH ...` on a line of its own: what is served
        groups += [[spec.image], list(spec.command)]
    else:
        groups.append([spec.image, *spec.command])
    return groups


def render_argv(spec: RunSpec) -> List[str]:
    """The `docker run` (or `podman run`) command as an argv list."""
    return [a for g in render_groups(spec) for a in g]


def render_command(spec: RunSpec, one_line: bool = False) -> str:
    """The shell-quoted command: one line, or one flag per line joined with backslashes."""
    lines = [" ".join(shlex.quote(a) for a in g) for g in render_groups(spec)]
    if one_line:
        return " ".join(lines)
    return " \\\n    ".join(lines)
