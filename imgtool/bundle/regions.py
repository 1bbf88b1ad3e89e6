"""Each downloaded byte written once (issue 38; docs/design.md "Written once").

A fetch into an uncompressed bundle knows the archive's layout from the manifests before the first byte: every
layer blob has its region in the parts. So the download writes each layer straight into its region of the unfinished
parts (`RegionPartial`, the store's partial with its bytes here), the writer writes the tar headers, the small members
and the padding around them and reads the slots bytes back only to hash the parts (`Hole`), and the cache keeps
where each blob is (`Store.locate`) instead of a second copy.

Resume: the plan lies beside the parts (`.imgtool-slots.json`) with each blob's record of done ranges
(`.imgtool-slots-<hex>.json`, the store's record format). A run into the same directory with the same plan keeps
both and downloads only what is missing, --force or not; any other plan starts the directory over. Both files go before
bundle.json is written: a bundle never holds them.
"""

import errno
import json
import os
import threading
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

from ..errors import ImgtoolError, StoreError
from ..fsutil import allocate, remove_quietly, write_atomic
from ..model import Digest, json_object
from ..store import MAX_RECORD, Partial, recorded_bytes
from ..worker import SIGNAL_SLICE
from .layout import Slot

REGIONS_PREFIX = ".imgtool-slots"  # what the writer counts as its own in an unfinished bundle
PLAN_NAME = REGIONS_PREFIX + ".json"
RECORD_PREFIX = REGIONS_PREFIX + "-"
HOLE_PIECE = 8 << 20  # the writer reads a placed blob back in pieces of this size (its progress moves with them)


class Hole:
    """`n` bytes of the archive a source already slots: the part sink reads them back (to hash) instead of writing;
    `tap`, when set, is given those bytes as they are read back (a model file's modelcar layer hashes)."""

    __slots__ = ("n", "tap")

    def __init__(self, n: int, tap: Optional[Callable[[bytes], None]] = None):
        self.n, self.tap = n, tap

    def __len__(self) -> int:
        return self.n


class Regions:
    """Where each layer blob and model file of an uncompressed archive lies in its parts, the parts' files while the bundle is
    written, and which blobs have arrived (the source says; the writer waits)."""

    def __init__(self, out_dir: Path, archive_name: str, slots: Sequence[Slot], tar_size: int,
                 chunk_size: Optional[int], width: int):
        self.out_dir, self.tar_size = Path(out_dir), tar_size
        self.chunk = chunk_size if chunk_size and chunk_size < tar_size else tar_size
        count = -(-tar_size // self.chunk)
        self.parts: List[Tuple[str, int]] = [(f"{archive_name}.part{i + 1:0{width}d}",
                                              min(self.chunk, tar_size - i * self.chunk)) for i in range(count)]
        self.part_names = [name for name, _ in self.parts]  # as written; sealed, one part is renamed
        self.blobs: Dict[Digest, Tuple[int, int]] = {p.member.digest: (p.data_offset, p.member.size)
                                                     for p in slots if p.member.kind in ("layer", "model")}
        self.layout = {"archive": archive_name, "tar_size": tar_size, "parts": [list(p) for p in self.parts],
                       "blobs": {str(d): list(v) for d, v in sorted(self.blobs.items())}}
        self._fds: List[int] = []
        self.warnings: List[str] = []  # what making the directory ready left to say (writer.prepare_regions)
        self._cond = threading.Condition()
        self._arrived: set = set()
        self._ended = False
        self._error: Optional[BaseException] = None

    def holds(self, digest: Digest) -> bool:
        return digest in self.blobs

    # -- the directory ------------------------------------------------------------------------------------------

    def resumable(self) -> bool:
        """An earlier run left this very plan and all its parts (sizes as planned)."""
        try:
            kept = json_object((self.out_dir / PLAN_NAME).read_bytes(), MAX_RECORD, ValueError)
            return kept == self.layout and all((self.out_dir / name).stat().st_size == size
                                               for name, size in self.parts)
        except (OSError, ValueError):
            return False

    def open(self) -> None:
        """Make (or keep) every part at its planned size with its blocks reserved (a disk too small fails here, before
        a byte is downloaded), then write the plan beside them; raises OSError."""
        try:
            for name, size in self.parts:
                fd = os.open(str(self.out_dir / name), os.O_RDWR | os.O_CREAT, 0o644)
                self._fds.append(fd)
                if os.fstat(fd).st_size != size:
                    os.ftruncate(fd, size)
                allocate(fd, size)
            write_atomic(self.out_dir / PLAN_NAME, json.dumps(self.layout).encode(), 0o644)
        except OSError:
            self.close()
            raise

    def remove(self) -> None:
        """The parts and the plan this run made, after it could not make them all."""
        for name in [*self.part_names, PLAN_NAME]:
            remove_quietly(self.out_dir / name)

    def close(self) -> None:
        for fd in self._fds:
            os.close(fd)
        self._fds = []

    def cleanup(self) -> None:
        """The plan and the records, once every part is sealed (a bundle never holds them)."""
        for path in [self.out_dir / PLAN_NAME, *self.out_dir.glob(RECORD_PREFIX + "*")]:
            remove_quietly(path)

    def error(self, e: OSError) -> StoreError:
        if e.errno == errno.ENOSPC:
            return StoreError(f"no space left on the device holding the bundle ({self.out_dir})",
                              hint="free some space there, or write the bundle elsewhere with --output")
        return StoreError(f"cannot write the bundle {self.out_dir}: {e.strerror or e}",
                          hint="check permissions, or write the bundle elsewhere with --output")

    # -- the blobs' bytes ---------------------------------------------------------------------------------------

    def record_path(self, digest: Digest) -> Path:
        return self.out_dir / f"{RECORD_PREFIX}{digest.hex}.json"

    def partial(self, digest: Digest, size: int) -> "RegionPartial":
        return RegionPartial(self, digest, size)

    def partial_bytes(self, digest: Digest, size: int) -> int:
        """How many bytes of this blob an earlier run left in place (0 if none)."""
        return recorded_bytes(self.record_path(digest), digest, size)

    def at(self, digest: Digest, pos: int) -> Tuple[int, int, int]:
        """(fd, offset in that part, bytes left in that part) for byte `pos` of a placed blob."""
        offset = self.blobs[digest][0] + pos
        index = offset // self.chunk
        return self._fds[index], offset - index * self.chunk, self.chunk - (offset - index * self.chunk)

    def read_at(self, digest: Digest, offset: int, n: int) -> bytes:
        """`n` bytes at `offset` of a placed blob (fewer past its end)."""
        out = b""
        n = min(n, self.blobs[digest][1] - offset)
        while len(out) < n:
            fd, at, room = self.at(digest, offset + len(out))
            piece = os.pread(fd, min(n - len(out), room), at)
            if not piece:
                break
            out += piece
        return out

    def regions(self, digest: Digest, names: Sequence[str]) -> List[Tuple[Path, int, int]]:
        """The blob's (file, offset, length) pieces, the parts named `names` (as sealed: one part is renamed)."""
        start, size = self.blobs[digest]
        out, pos = [], start
        while pos < start + size:
            index, within = divmod(pos, self.chunk)
            n = min(size - (pos - start), self.chunk - within)
            out.append((self.out_dir / names[index], within, n))
            pos += n
        return out

    # -- arrivals -----------------------------------------------------------------------------------------------

    def arrived(self, digest: Digest) -> None:
        with self._cond:
            self._arrived.add(digest)
            self._cond.notify_all()

    def ended(self, error: Optional[BaseException]) -> None:
        """The source stopped placing blobs (`error`: why, raised to whoever waits for a blob that did not come)."""
        with self._cond:
            self._ended, self._error = True, error
            self._cond.notify_all()

    def holes(self, digest: Digest, size: int) -> Iterator[Hole]:
        """Once the source slots the blob (checked: its digest matched), its bytes as holes for the writer."""
        with self._cond:
            while digest not in self._arrived and not self._ended:
                self._cond.wait(SIGNAL_SLICE)  # in slices: Ctrl-C is handled at once
            if digest not in self._arrived:
                if self._error is not None:
                    raise self._error
                raise ImgtoolError(f"internal: the download ended without blob {digest}")
        for pos in range(0, size, HOLE_PIECE):
            yield Hole(min(HOLE_PIECE, size - pos))


class RegionPartial(Partial):
    """A blob being downloaded into its region of the unfinished archive (`Regions`): the store's partial, with its
    bytes in the parts and its record beside them. Committed, it stays (the record says it is whole) until the
    bundle is sealed."""

    def __init__(self, regions: Regions, digest: Digest, size: int):
        self.regions, self.digest, self.size = regions, digest, size
        self.path, self.state_path = regions.out_dir, regions.record_path(digest)
        self._fd = -1  # the parts' descriptors are the Regions'
        self._setup()

    def _error(self, e: OSError) -> StoreError:
        return self.regions.error(e)

    def _open(self) -> None:
        state = self._recorded()
        self.done = state or []
        if state is None:
            try:
                self._save()
            except OSError as e:
                raise self._error(e) from e

    def _pwrite(self, data, offset: int) -> int:
        fd, at, room = self.regions.at(self.digest, offset)
        return os.pwrite(fd, data[:room], at)

    def _pread(self, n: int, offset: int) -> bytes:
        fd, at, room = self.regions.at(self.digest, offset)
        return os.pread(fd, min(n, room), at)

    def _publish(self) -> Optional[Path]:
        self.closed = True
        self._close_state()  # the record stays: a rerun before the seal finds the blob whole
        return None

    def _announce(self) -> None:
        self.regions.arrived(self.digest)

    def _forget_data(self) -> None:
        """The bytes stay in the part (overwritten by the next download): only the record goes."""
