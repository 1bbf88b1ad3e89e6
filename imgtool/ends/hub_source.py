"""A registry's images and the hubs' models as one pipeline source (issue 48): fetch's one download thread brings
the images' layers, then each model's files (their members follow the images' in the archive), into the cache or
straight into their regions of an uncompressed bundle, each file checked against the hub's sha256 as it arrives."""

from typing import FrozenSet, List, Sequence, Tuple

from ..hubs import HubResolution
from ..model import Digest, PulledImage
from ..model_pull import pull_model
from ..progress import Progress
from ..puller import HUB_CONNECTIONS, HUB_JOBS
from ..store import Store
from .registry_source import RegistrySource


class RegistryAndHubs(RegistrySource):
    """`models`: each model's resolution narrowed to the files the bundle carries (model_pull.carrying); `jobs`: the
    registries' connections per source and at most at once, `hub_jobs`: each hub endpoint's, `hub_connections`: at
    most at once over a model's endpoints."""

    def __init__(self, pulled: Sequence[Tuple[PulledImage, list]], models: Sequence[HubResolution], store: Store,
                 progress: Progress, jobs: Tuple[int, int], hub_jobs: int = HUB_JOBS,
                 hub_connections: int = HUB_CONNECTIONS):
        super().__init__(pulled, store, progress, jobs,
                         what=" and ".join(w for w, n in (("registry", pulled), ("model hub", models)) if n))
        self.models = list(models)
        self.hub_jobs = hub_jobs  # connections per hub endpoint (puller.HUB_JOBS unless --connections)
        self.hub_connections = hub_connections  # at once over them (puller.HUB_CONNECTIONS unless --max-connections)

    def has(self) -> FrozenSet[Digest]:
        """The images' blobs and every carried model file."""
        return super().has() | frozenset(f.sha256 for res in self.models for f in res.snapshot.files
                                         if f.sha256 is not None)

    def _download(self, blobs: List[Digest], regions) -> None:
        if self.pulled:
            super()._download(blobs, regions)
        for res in self.models:
            if self.stop.is_set():
                return
            pull_model(res, self.store, self.progress, jobs=self.hub_jobs, connections=self.hub_connections, stats=self.stats,
                       order=blobs, cancel=self.stop, regions=regions)
