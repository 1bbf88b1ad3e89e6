"""`docker run` (and `podman run`) presets for Ascend hosts: presets.toml -> `Preset` -> `RunSpec` -> argv.

Four rooms: `preset.py` the values a preset is made of, `files.py` reading and merging
the presets files into a `PresetSet`, `run.py` a preset plus the user's options made into
one container, cut to the host and rendered, `k8s.py` the same container as a Kubernetes Pod or
Deployment (YAML). What an image tag says, and which is newest,
is `releases.py`'s (shared with `imgtool tags`). Callers import from here.
"""

from ..releases import pick_tag
from .files import BUILTIN_PRESETS, find_presets_file, load_presets
from .k8s import KINDS, KubeOptions, image_from_bundle, manifest, mounts_model_image, parse_kube_version, to_yaml
from .preset import (EnvPreset, Mount, MultiNode, Port, Preset, PresetSet, docker_size, format_cards, parse_cards,
                     parse_env, parse_mount, parse_resource_name)
from .run import (CARD_DEVICE, DEFAULT_NAME, MODELCAR_MOUNT, MODELCAR_PATH,
                  HF_OFFLINE, MODELSCOPE_ENV, PLACEHOLDER_TAG, PRIVILEGED_EFFECT, RunOptions,
                  RunSpec, ServedModel, build_spec,
                  default_image_for, explicit_cards, fit_to_host, normalize_image, privileged_warning, render_argv,
                  render_command, render_groups, suffix_mismatch)

__all__ = [
    "BUILTIN_PRESETS", "CARD_DEVICE", "KINDS", "KubeOptions", "image_from_bundle", "manifest", "to_yaml",
    "mounts_model_image", "parse_kube_version", "MODELCAR_MOUNT", "MODELCAR_PATH",
    "parse_resource_name", "DEFAULT_NAME", "PLACEHOLDER_TAG", "PRIVILEGED_EFFECT",
    "EnvPreset", "HF_OFFLINE", "MODELSCOPE_ENV", "Mount", "MultiNode", "Port", "Preset", "PresetSet", "RunOptions",
    "RunSpec", "ServedModel",
    "build_spec", "default_image_for", "docker_size", "explicit_cards", "find_presets_file", "fit_to_host",
    "format_cards", "load_presets", "normalize_image", "parse_cards", "parse_env", "parse_mount", "pick_tag",
    "privileged_warning", "render_argv", "render_command", "render_groups", "suffix_mismatch",
]
