"""`imgtool tags`: list a repository's tags and say which hardware/OS variant each is.

vllm-ascend tags are a release (`v0.22.1rc1`, `v0.9.1.post1`) plus an optional suffix
naming the hardware (`-a3`, `-310p`, `-a5`) and/or the OS (`-openeuler`). Mirrors that
disable the tags API (DaoCloud does) are skipped with a note.
"""

import fnmatch
import re
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

from .errors import ImgtoolError, RegistryError
from .mirrors import Source

_RELEASE = re.compile(r"^(v\d+(?:\.\d+)*(?:rc\d+|\.post\d+|\.dev\d+)?)(?:-(.+))?$")
HARDWARE = {"": "a2", "a2": "a2", "a3": "a3", "310p": "300i-duo", "a5": "a5", "950dt": "a5"}
OSES = {"": "ubuntu", "openeuler": "openeuler"}


@dataclass(frozen=True)
class TagInfo:
    tag: str
    release: Optional[str]  # None for main, nightly-main, latest and unknown shapes
    hardware: Optional[str]  # preset name: a2, a3, 300i-duo, a5
    os: Optional[str]
    variant: str  # the suffix as written ("", "a3-openeuler", ...)

    @classmethod
    def parse(cls, tag: str) -> "TagInfo":
        m = _RELEASE.match(tag)
        if not m:
            return cls(tag, None, None, None, "")
        release, suffix = m.group(1), m.group(2) or ""
        parts = suffix.split("-") if suffix else []
        os_name = "openeuler" if "openeuler" in parts else "ubuntu"
        hw_parts = [p for p in parts if p != "openeuler"]
        hw_key = hw_parts[0] if len(hw_parts) == 1 else ("" if not hw_parts else None)
        return cls(tag, release, HARDWARE.get(hw_key) if hw_key is not None else None, os_name, suffix)

    def sort_key(self) -> Tuple:
        if not self.release:  # main, latest...: after the releases when sorted newest first
            return (0, (), self.tag)
        nums = [int(x) for x in re.findall(r"\d+", self.release)]
        pre = 0 if "rc" in self.release else 1  # v1.0.0rc1 < v1.0.0
        base = tuple(nums[:3]) + (pre,) + tuple(nums[3:])
        return (1, base, self.variant)


@dataclass
class TagList:
    source: Source
    tags: List[TagInfo]
    notes: List[str]


def list_tags(sources: Sequence[Source], repository_hint: str, pattern: Optional[str] = None) -> TagList:
    """Tags from the first source that lists them (newest first); raises RegistryError when none can."""
    notes, errors = [], []
    for source in sorted(sources, key=lambda s: not s.is_upstream):
        try:
            names = list(source.client.tags(source.repository))
        except ImgtoolError as e:
            message = e.message
            if "tag listing refused" in message:
                notes.append(f"{source.name}: does not list tags ({message}); skipped")
            else:
                notes.append(f"{source.name}: {message}; skipped")
            errors.append(f"{source.describe()}: {message}")
            continue
        infos = [TagInfo.parse(n) for n in names if not pattern or fnmatch.fnmatch(n, pattern)]
        infos.sort(key=TagInfo.sort_key, reverse=True)
        return TagList(source, infos, notes)
    raise RegistryError(f"no source lists the tags of {repository_hint}: " + "; ".join(errors))
