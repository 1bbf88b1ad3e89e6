"""`imgtool inventory`: what this host's runtime (Docker, containerd, Podman) holds, as the document delta.py defines, written atomically.

The verb's core function; cli.py prints. Runs on the offline side, so from imgtool.pyz on
Python 3.7/3.8 too (no newer syntax or stdlib here).
"""

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from .delta import Inventory
from .errors import ImgtoolError, UsageError
from .fsutil import write_atomic
from .model import utc_time
from .runtime import Choice, open_runtime


@dataclass
class InventoryResult:
    inventory: Inventory
    data: bytes  # the document, as written to `path` or to be printed
    path: Optional[Path] = None  # where it was written; None: nowhere (standard output is the caller's)

    @property
    def layers(self) -> int:
        """Distinct layers (diff_ids) over all images."""
        return len({d for im in self.inventory.images for d in im.diff_ids})


def take_inventory(output: Optional[str] = None, choice: Optional[Choice] = None) -> InventoryResult:
    """Ask the runtime (`choice`: Docker, containerd, Podman; auto by default) for its images and their
    layers; with `output`, write the document there.

    Raises UsageError (no such directory for `output`, named before the runtime is asked), DaemonError,
    ImgtoolError (cannot write `output`).
    """
    path = Path(output) if output else None
    if path is not None and not path.absolute().parent.is_dir():
        raise UsageError(f"cannot write the inventory {output}: no such directory {path.absolute().parent}")
    runtime = open_runtime(choice or Choice(), timeout=120)
    try:
        facts = runtime.info()
        images = runtime.inventory()
    finally:
        runtime.close()
    about = {"version": facts.version, "arch": facts.arch, "driver": facts.driver, "image_store": facts.image_store,
             "runtime": facts.runtime}
    if facts.namespace:
        about["namespace"] = facts.namespace
    inv = Inventory(utc_time(time.time()), about, tuple(images))
    data = inv.to_bytes()
    if path is not None:
        try:
            write_atomic(path, data, 0o644)
        except OSError as e:
            raise ImgtoolError(f"cannot write the inventory {output}: {e.strerror or e}") from e
    return InventoryResult(inv, data, path)
