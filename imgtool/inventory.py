"""`imgtool inventory`: what this host's runtime (Docker, containerd, Podman) holds, and the models placed here, as the
document delta.py defines, written atomically.

The verb's core function; commands/ prints. Runs on the offline side, so from imgtool.pyz on
Python 3.7/3.8 too (no newer syntax or stdlib here).
"""

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Optional, Sequence

from . import config
from .delta import Inventory
from .errors import ImgtoolError, UsageError
from .fsutil import write_atomic
from .model import utc_time
from .placed import held_models

if TYPE_CHECKING:
    from .runtimes.base import Runtime


@dataclass
class InventoryResult:
    inventory: Inventory
    data: bytes  # the document, as written to `path` or to be printed
    path: Optional[Path] = None  # where it was written; None: nowhere (standard output is the caller's)

    @property
    def layers(self) -> int:
        """Distinct layers (diff_ids) over all images."""
        return len({d for im in self.inventory.images for d in im.diff_ids})


def check_output(output: Optional[str]) -> Optional[Path]:
    """Where the inventory goes (None: standard output); raises UsageError for a missing directory, before
    the runtime is asked anything."""
    path = Path(output) if output else None
    if path is not None and not path.absolute().parent.is_dir():
        raise UsageError(f"cannot write the inventory {output}: no such directory {path.absolute().parent}")
    return path


def take_inventory(runtime: "Runtime", path: Optional[Path] = None, models_dirs: Sequence[Path] = ()) -> InventoryResult:
    """Ask the runtime (Docker, containerd, Podman: opened by the caller) for its images and their
    layers, and list the models placed on this host (the Hugging Face and ModelScope caches, `models_dirs`: placed.py);
    with `path` (check_output's), write the document there. Raises DaemonError, ImgtoolError (cannot write `path`)."""
    facts = runtime.info()
    images = runtime.inventory()
    about = {"version": facts.version, "arch": facts.arch, "driver": facts.driver, "image_store": facts.image_store,
             "runtime": facts.runtime}
    if facts.namespace:
        about["namespace"] = facts.namespace
    models = held_models(config.hf_hub_cache(), config.modelscope_cache(), models_dirs)
    inv = Inventory(utc_time(time.time()), about, tuple(images), tuple(models))
    data = inv.to_bytes()
    if path is not None:
        try:
            write_atomic(path, data, 0o644)
        except OSError as e:
            raise ImgtoolError(f"cannot write the inventory {path}: {e.strerror or e}") from e
    return InventoryResult(inv, data, path)
