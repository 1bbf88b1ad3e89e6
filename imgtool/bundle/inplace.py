"""Blobs of bundles read in place from their part files for `imgtool serve`, each checked against its digest.

A blob is hashed the first time it is asked for, and again whenever a part file holding it changed since
(its inode, size, mtime or ctime: a write, a re-copy); a mismatch is refused per request (BlobDamaged),
never handed out. The bytes themselves go out with sendfile from `open`'s file, at the catalog's spans.
"""

import hashlib
import os
import threading
from pathlib import Path
from typing import BinaryIO, Dict, Iterator, Sequence, Tuple

from ..errors import BlobDamaged
from ..fsutil import NotRegularFile, open_regular
from ..model import Digest
from .catalog import Blob, Catalog
from .format import BundleIndex, part_label


class InPlaceBlobs:
    """Blobs read in place from the bundles' part files, each blob's digest checked before it is first served
    (again when a part holding it changed since: its inode, size, mtime or ctime), a manifest's on every read."""

    def __init__(self, dirs: Sequence[Path], catalog: Catalog):
        self.dirs = [Path(d) for d in dirs]
        self.catalog = catalog
        self._lock = threading.Lock()
        self._locks: Dict[Digest, threading.Lock] = {}
        # digest -> (the stat of its parts when it was checked, whether it matched)
        self._checked: Dict[Digest, Tuple[tuple, bool]] = {}

    def _index(self, bundle: int) -> BundleIndex:
        return self.catalog.indexes[bundle]

    def _path(self, bundle: int, part: int) -> Path:
        return self.dirs[bundle] / self._index(bundle).parts[part].name

    def _problem(self, blob: Blob, part: int, what: str) -> BlobDamaged:
        index = self._index(blob.bundle)
        label = part_label(part, len(index.parts))
        return BlobDamaged(f"{blob.what} (blob {blob.digest.short}) cannot be served: {label} "
                       f"({index.parts[part].name}) of {self.dirs[blob.bundle]} {what}",
                       hint="run `imgtool verify` on the bundle and re-copy the parts it names")

    def _stamp(self, blob: Blob) -> tuple:
        """What identifies the contents of the parts holding the blob: a write changes it (mtime, ctime)."""
        out = []
        for part in sorted({s.part for s in self.catalog.spans(blob)}):
            try:
                st = os.stat(self._path(blob.bundle, part))
            except OSError as e:
                raise self._problem(blob, part, f"cannot be read ({e.strerror})") from None
            out.append((part, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
        return tuple(out)

    def check(self, blob: Blob) -> None:
        """Raise BlobDamaged unless the blob's bytes in the parts match its digest (hashed when first asked, and
        again when a part holding it changed since)."""
        with self._lock:
            lock = self._locks.setdefault(blob.digest, threading.Lock())
        with lock:
            stamp = self._stamp(blob)
            known = self._checked.get(blob.digest)
            if known is None or known[0] != stamp:
                sha = hashlib.sha256()
                for chunk in self.chunks(blob, 0, blob.size):
                    sha.update(chunk)
                known = (stamp, sha.hexdigest() == blob.digest.hex)
                if self._stamp(blob) == stamp:  # a part changing while it was read is checked again next time
                    self._checked[blob.digest] = known
            if not known[1]:
                raise self._damaged(blob)

    def _damaged(self, blob: Blob) -> BlobDamaged:
        index = self._index(blob.bundle)
        parts = sorted({s.part for s in self.catalog.spans(blob)})
        where = ", ".join(part_label(p, len(index.parts)) for p in parts)
        return BlobDamaged(f"{blob.what} (blob {blob.digest.short}) is damaged in {self.dirs[blob.bundle]} "
                       f"({where}): its sha256 differs from its digest; it is not served",
                       hint="run `imgtool verify` on the bundle and re-copy the parts it names")

    def chunks(self, blob: Blob, start: int, end: int, size: int = 4 * 1024 * 1024) -> Iterator[bytes]:
        """Bytes [start, end) of the blob from the parts; raises BlobDamaged (a part missing or short)."""
        for span in self.catalog.spans(blob, start, end):
            with self.open(blob, span.part) as f:
                f.seek(span.offset)
                left = span.length
                while left:
                    data = f.read(min(size, left))
                    if not data:
                        raise self._problem(blob, span.part, "is truncated")
                    left -= len(data)
                    yield data

    def open(self, blob: Blob, part: int) -> BinaryIO:
        try:
            return open_regular(self._path(blob.bundle, part))
        except NotRegularFile as e:
            raise self._problem(blob, part, f"is not a regular file ({e.kind})") from None
        except OSError as e:
            raise self._problem(blob, part, f"cannot be read ({e.strerror})") from None

    def read(self, blob: Blob) -> bytes:
        """A small blob (a manifest) whole, its digest checked on every read; raises BlobDamaged."""
        data = b"".join(self.chunks(blob, 0, blob.size))
        if Digest.of(data) != blob.digest:
            raise self._damaged(blob)
        return data
