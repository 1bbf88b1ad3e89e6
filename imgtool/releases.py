"""vllm-ascend image tags: what a tag says (release, hardware, OS) and how releases order.

A tag is a release (`v0.22.1rc1`, `v0.10.0`, `v0.9.1.post1`, `.devN` too) plus an optional
suffix naming the hardware (`-a3`, `-310p`, `-a5`) and/or the OS (`-openeuler`). Pure: the
one ordering here serves `imgtool tags` (a registry's list, newest first) and the run
presets (the newest local image for a preset).
"""

import re
from dataclasses import dataclass
from typing import Iterable, Optional, Sequence, Tuple

_RELEASE = re.compile(r"^(?P<release>v(?P<nums>[0-9]+(?:\.[0-9]+)*)"
                      r"(?:rc(?P<rc>[0-9]+)|\.post(?P<post>[0-9]+)|\.dev(?P<dev>[0-9]+))?)"
                      r"(?:-(?P<variant>.+))?$")
_DEV, _RC, _FINAL, _POST = -1, 0, 1, 2  # the order of a version's stages
HARDWARE = {"": "a2", "a2": "a2", "a3": "a3", "310p": "300i-duo", "a5": "a5", "950dt": "a5"}


@dataclass(frozen=True)
class TagInfo:
    tag: str
    release: Optional[str]  # None for main, nightly-main, latest and unknown shapes
    hardware: Optional[str]  # preset name: a2, a3, 300i-duo, a5
    os: Optional[str]
    variant: str  # the suffix as written, without its dash ("", "a3-openeuler", ...)
    version: Optional[Tuple] = None  # the release's order, see `parse`

    @classmethod
    def parse(cls, tag: str) -> "TagInfo":
        m = _RELEASE.match(tag)
        if not m:
            return cls(tag, None, None, None, "")
        suffix = m.group("variant") or ""
        parts = suffix.split("-") if suffix else []
        os_name = "openeuler" if "openeuler" in parts else "ubuntu"
        hw_parts = [p for p in parts if p != "openeuler"]
        hw_key = hw_parts[0] if len(hw_parts) == 1 else ("" if not hw_parts else None)
        hardware = HARDWARE.get(hw_key) if hw_key is not None else None
        return cls(tag, m.group("release"), hardware, os_name, suffix, _version(m))

    @property
    def suffix(self) -> Optional[str]:
        """The suffix as the tag writes it (`-a3-openeuler`), `""` for none, None if not a release."""
        if self.release is None:
            return None
        return f"-{self.variant}" if self.variant else ""

    @property
    def is_dev_build(self) -> bool:
        """A `.devN` release: listed by `imgtool tags`, never chosen as a default image."""
        return self.version is not None and self.version[1][0] == _DEV

    def sort_key(self) -> Tuple:
        """Releases by version then variant, the other tags before them: sort reversed for newest first."""
        if self.version is None:
            return (0, (), self.tag)
        return (1, self.version, self.variant)


def _version(m: "re.Match") -> Tuple:
    # v0.9 == v0.9.0; v1.0.0.dev1 < v1.0.0rc1 < v1.0.0rc2 < v1.0.0 < v1.0.0.post1
    nums = tuple(int(x) for x in m.group("nums").split("."))
    nums += (0,) * (4 - len(nums))
    if m.group("dev") is not None:
        stage = (_DEV, int(m.group("dev")))
    elif m.group("rc") is not None:
        stage = (_RC, int(m.group("rc")))
    elif m.group("post") is not None:
        stage = (_POST, int(m.group("post")))
    else:
        stage = (_FINAL, 0)
    return nums, stage


def pick_tag(tags: Iterable[str], suffixes: Sequence[str]) -> Optional[str]:
    """The highest release tag carrying one of `suffixes` (the first one wins a tie; no dev builds), or None."""
    order = list(suffixes)
    keyed = []
    for tag in tags:
        info = TagInfo.parse(tag)
        if info.suffix is not None and info.suffix in order and not info.is_dev_build:
            keyed.append(((info.version, -order.index(info.suffix)), tag))
    return max(keyed)[1] if keyed else None
