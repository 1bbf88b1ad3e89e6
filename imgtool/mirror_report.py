"""`imgtool mirrors`: every source probed for a reference (or the newest release), reachable or not.

A core function taking plain values and returning plain values; commands/ formats them.
"""

from dataclasses import dataclass
from typing import List, Optional

from .config import MirrorConfig
from .errors import ImgtoolError, NotFoundError
from .mirrors import Probe, ping_probes, probe, sources_for
from .model import ImageRef


@dataclass
class MirrorReport:
    """What `imgtool mirrors` found: the reference probed (None: reachability only) and each source."""

    ref: Optional[ImageRef]
    chosen: str  # how the reference was chosen when none was given ("" when given)
    probes: List[Probe]

    def failure(self, config_path: str) -> Optional[ImgtoolError]:
        """The error to exit with: no source reachable, or none serving the reference; else None."""
        from .errors import RegistryError

        detail = "; ".join(f"{p.source.name}: {p.error or 'no answer'}" for p in self.probes)
        if not any(p.reachable for p in self.probes):
            return RegistryError(f"no source is reachable: {detail}",
                                 hint=f"check the network or proxy (HTTPS_PROXY), or the URLs in {config_path}")
        if self.ref is not None and not any(p.digest for p in self.probes):
            return NotFoundError(f"no source serves {self.ref.tagged}: {detail}",
                                 hint="check the tag: imgtool tags lists them")
        return None


def mirror_report(config: MirrorConfig, text: Optional[str], timeout: float = 5.0) -> MirrorReport:
    """Probe every source for a reference; without one, for the newest release tag a source lists.

    The default image publishes no `latest`, so probing it would report every healthy mirror as
    "not found". When no source lists tags, only reachability (`/v2/`) is reported.
    """
    import dataclasses

    from .tags import TagList, list_tags

    if text:
        ref = config.parse_ref(text)
        return MirrorReport(ref, "", probe(sources_for(ref, config), ref, timeout, body=True))
    base = config.parse_ref("latest")
    sources = sources_for(base, config)
    try:
        listed: Optional[TagList] = list_tags(sources, base.name)
    except ImgtoolError:
        listed = None
    releases = [t for t in (listed.tags if listed else []) if t.release and not t.is_dev_build]
    if listed is None or not releases:
        return MirrorReport(None, "no source lists the tags", ping_probes(sources, timeout))
    newest = [t for t in releases if t.release == releases[0].release]
    tag = next((t for t in newest if not t.variant), newest[0]).tag
    ref = dataclasses.replace(base, tag=tag)
    return MirrorReport(ref, f"the newest release {listed.source.name} lists", probe(sources, ref, timeout, body=True))
