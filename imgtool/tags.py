"""`imgtool tags`: list a repository's tags and say which hardware/OS variant each is.

What a tag says and how tags order is `releases.py` (shared with the run presets).
Mirrors that disable the tags API (DaoCloud does) are skipped with a note.
"""

import fnmatch
from dataclasses import dataclass
from typing import List, Optional, Sequence

from .errors import ImgtoolError, RegistryError, TagListingRefused
from .mirrors import Source, reachable
from .model import is_tag
from .releases import TagInfo


@dataclass
class TagList:
    source: Source
    tags: List[TagInfo]
    notes: List[str]


def list_tags(sources: Sequence[Source], repository_hint: str, pattern: Optional[str] = None) -> TagList:
    """Tags from the first source that lists them (newest first); raises RegistryError when none can."""
    notes, errors = [], []
    alive, dead = reachable(list(sources))
    for source in sources:
        if source.name in dead:
            notes.append(f"{source.name}: unreachable ({dead[source.name]}); skipped")
            errors.append(f"{source.describe()}: {dead[source.name]}")
    for source in sorted(alive, key=lambda s: not s.is_upstream):
        try:
            names = list(source.client.tags(source.repository))
        except ImgtoolError as e:
            message = e.message
            if isinstance(e, TagListingRefused):
                notes.append(f"{source.name}: does not list tags ({message}); skipped")
            else:
                notes.append(f"{source.name}: {message}; skipped")
            errors.append(f"{source.describe()}: {message}")
            continue
        # A listed name outside the distribution spec's tag grammar is no tag of this repository: it would
        # reach the terminal (escape sequences, a forged line), so it is left out and counted.
        tags = [n for n in names if is_tag(n)]
        if len(tags) < len(names):
            notes.append(f"{source.name}: {len(names) - len(tags)} listed name(s) are not tags "
                         "(the distribution spec's grammar); left out")
        infos = [TagInfo.parse(n) for n in tags if not pattern or fnmatch.fnmatch(n, pattern)]
        infos.sort(key=TagInfo.sort_key, reverse=True)
        return TagList(source, infos, notes)
    hint = ("check the network or proxy (HTTPS_PROXY), or the URLs in mirrors.toml (imgtool mirrors)" if not alive
            else "force a source that lists tags with --mirror NAME")
    raise RegistryError(f"no source lists the tags of {repository_hint}: " + "; ".join(errors), hint=hint)
