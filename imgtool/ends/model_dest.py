"""The models of a bundle placed on the offline host (issue 48): a destination fed by the archive's one forward read.

A bundle's archive holds the images' members, then each model's files (bundle/layout.py `bundle_members`). `imgtool
load` sends the runtime the images only (ends/runtime_dest.py lays out its own archive from the images), and the
model members that follow go to the placer (placer.py `stage_model`) from the same read: each byte read once (an
uncompressed bundle's model files are not read by the archive's reader at all: it checks their headers, padding and
place and hands the placer where each file's bytes lie, which the placer copies in the kernel and hashes from the
copy: each byte read once, hashed once). The placer checks every file against its size and sha256 as it writes it to
a staging directory beside the model's name; nothing is renamed to a model's name until the whole bundle was read and
checked (the archive's trailer, every deferred digest) and the images were loaded: a damaged part anywhere places
nothing, and what was staged and checked stays for the next load to resume. Python 3.7 (the pyz places models through
this).
"""

from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple, Union

from .. import config
from ..bundle.archive import Archive
from ..bundle.format import BundleIndex, BundleModel
from ..bundle.layout import Slot
from ..errors import ImgtoolError, UsageError
from ..filecopy import Regions
from ..model import Digest
from ..dirlock import lock_output
from ..placer import Placed, StagedModel, model_folder, placed_already, stage_model
from ..progress import Progress
from ..weights import ModelFile

TARGETS = ("hf", "modelscope")


@dataclass(frozen=True)
class ModelChoice:
    """Where load places a bundle's models: `target` (hf, modelscope; None: an hf: model to the Hugging Face cache, a
    modelscope: one to ModelScope's), `models_dir` (a plain directory, for every model), `force` (place without
    enough free space, and over a directory imgtool did not place)."""

    target: Optional[str] = None
    models_dir: Optional[Path] = None
    force: bool = False

    def where(self, model: BundleModel) -> Tuple[str, Path]:
        """(the placer's target, its root) for `model`; raises UsageError for a model no hub names (a local
        directory's) when no destination was chosen."""
        if self.models_dir is not None:
            return "dir", Path(self.models_dir)
        target = self.target or model.model_ref.hub
        if target == "hf":
            return "hf", config.hf_hub_cache()
        if target == "modelscope":
            return "modelscope", config.modelscope_cache()
        raise UsageError(f"{model.ref} comes from no hub, so it has no cache of its own: say where to place it",
                         hint="load with --models hf, --models modelscope or --models-dir DIR")


class ModelDestination:
    """The models of `index` to place as `choice` says; which of them are placed whole already is asked first (a
    second load of an unchanged model reads none of its bytes). `stage(archive)` writes and checks the others from
    the archive's forward read, `commit()` makes every model visible, `release()` (every other path) leaves what was
    staged for the next load."""

    def __init__(self, index: BundleIndex, choice: ModelChoice, progress: Progress):
        self.index, self.choice, self.progress = index, choice, progress
        self.where = [(m,) + choice.where(m) for m in index.models]
        self.pending = [(m, t, r) for m, t, r in self.where
                        if not placed_already(m.snapshot(), t, r, m.model_ref.revision)]
        self.staged: List[StagedModel] = []
        self.locks: Dict[Path, ExitStack] = {}

    @property
    def moves(self) -> bool:
        """Whether a model's bytes must be read (one is not placed whole yet)."""
        return bool(self.pending)

    def stage(self, archive: Archive) -> None:
        """Every model not placed yet written to its staging directory and checked, from `archive` read forward (the
        members before each read and checked as they pass); raises PlacementDamaged (exit 3), ImgtoolError, what the
        archive raises. The staged models stay staged until commit() or release()."""
        slots = {p.member.digest: p for p in archive.slots if p.member.kind == "model"}
        for model, target, root in self.pending:
            folder = model_folder(model.snapshot(), target, root)
            if folder not in self.locks:  # one lock per folder, held to the end: two models may share one
                self.locks[folder] = ExitStack()
                self.locks[folder].enter_context(lock_output(folder, "load"))
            self.progress.note(f"placing {model.ref} ({len(model.files)} files) into {root} ...")
            read = _Reader(archive, slots, model, self.staged)
            self.staged.append(stage_model(model.snapshot(), target, root, read, model.model_ref.revision,
                                           self.choice.force, locked=True))

    def commit(self) -> List[Placed]:
        """Each model under its name: the staged ones renamed, the unchanged ones' refs/ looked after; returns what
        each placement did. Raises ImgtoolError."""
        staged = {id(m): s for (m, _, _), s in zip(self.pending, self.staged)}
        out = []
        try:
            for model, target, root in self.where:
                held = staged.pop(id(model), None)
                if held is not None:
                    out.append(held.commit())
                else:  # placed whole already: nothing is read (a model changed since the check is refused)
                    snapshot = model.snapshot()
                    locked = model_folder(snapshot, target, root) in self.locks
                    out.append(stage_model(snapshot, target, root, _unread(model), model.model_ref.revision,
                                           self.choice.force, locked=locked).commit())
        finally:
            for s in staged.values():
                s.release()
            self._unlock()
        return out

    def release(self) -> None:
        """Every staged model left staged (a later load resumes it), its folder's lock released."""
        for s in self.staged:
            s.release()
        self._unlock()

    def _unlock(self) -> None:
        for lock in self.locks.values():
            lock.close()
        self.locks.clear()


class _Reader:
    """A model file's bytes for the placer: its member of the archive, read forward (an uncompressed archive's member
    is handed over by where it lies in the parts, its data not read here: the placer copies it in the kernel and
    checks the bytes it copied); a file whose bytes the archive holds once but a model names twice (or an earlier
    model staged) is copied from the staged twin."""

    def __init__(self, archive: Archive, slots: Dict[Digest, Slot], model: BundleModel, staged: List[StagedModel]):
        self.archive, self.slots, self.model, self.staged = archive, slots, model, staged

    def __call__(self, f: ModelFile) -> Union[Iterator[bytes], Regions]:
        assert f.sha256 is not None
        slot = self.slots.get(f.sha256)
        if slot is not None and slot.offset >= self.archive.offset:
            if self.archive.can_pass_over:
                return self.archive.passed_over(slot)
            return self.archive.blob(slot)
        twin = next((s.staged(f.sha256.hex) for s in self.staged if s.staged(f.sha256.hex) is not None), None)
        if twin is None:
            raise ImgtoolError(f"{self.model.ref}: {f.path}: this bundle does not carry its bytes (a delta bundle "
                               "leaves out the files the other side holds); nothing was placed",
                               hint="place the model's earlier revision (the bundle this one is a delta of) first")
        return Regions(((str(twin), 0, f.size),))


def _unread(model: BundleModel):
    def read(f: ModelFile) -> Iterator[bytes]:
        raise ImgtoolError(f"{model.ref} changed in its destination while this load ran: {f.path} is not as it was",
                           hint="load again")
    return read
