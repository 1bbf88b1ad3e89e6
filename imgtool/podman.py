"""The Podman room: RHEL-family and openEuler hosts' runtime, through `podman` run as a program (program.py).

An image's ID here is its config digest (as in Docker's graphdriver store); a name without a registry
is stored under localhost/ (podman tag x:1 -> localhost/x:1). `podman load` from a pipe copies the
whole archive to a temporary file under /var/tmp before it reads it, and then commits layers as it
reads them: an archive cut short after whole layers leaves those layers in its storage. So this
room writes that copy itself (same place, same space), and runs `podman load -i` only on a
finished, checked archive: Podman never sees a byte of a refused one.
Standard library only (the offline side runs on 3.7).
"""

import json
import os
import tempfile
from typing import Dict, Iterable, List, Optional, Tuple

from .errors import DaemonError, ProgramFailed
from .program import Program
from .runtime import ImageInfo, RuntimeInfo

LOAD_TIMEOUT = 3600.0  # after the last byte: podman reads the copy and commits every layer
INSTALL_HINT = "install podman from the OS media (yum install podman, apt install podman)"


class Podman:
    """The operations load, inventory and doctor need of Podman (runtime.Runtime); errors are DaemonError."""

    def __init__(self, timeout: Optional[float] = LOAD_TIMEOUT, staging_dir: str = "/var/tmp"):
        self.timeout = timeout or LOAD_TIMEOUT
        self.staging_dir = staging_dir  # where podman load would copy a piped archive ($TMPDIR, else /var/tmp)
        self.podman = Program(["podman"], "Podman", install_hint=INSTALL_HINT)
        self._info = self._read_info()

    def close(self) -> None:
        pass

    def __enter__(self) -> "Podman":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _json(self, args: List[str], what: str = ""):
        text = self.podman.run(args, what=what)
        try:
            return json.loads(text or "null")
        except ValueError as e:
            raise DaemonError(f"Podman: `podman {what or ' '.join(args[:2])}` did not print JSON: {e}") from e

    def _read_info(self) -> dict:
        try:
            doc = self._json(["info", "--format", "json"], "info")
        except ProgramFailed as e:
            raise DaemonError(f"cannot use Podman: {e.output}", hint="check `podman info` as this user") from e
        return doc if isinstance(doc, dict) else {}

    def info(self) -> RuntimeInfo:
        from .model import Platform

        host = self._info.get("host") or {}
        store = self._info.get("store") or {}
        version = self._info.get("version") or {}
        arch = Platform.from_json({"architecture": str(host.get("arch") or "")}).architecture
        return RuntimeInfo(host="podman", version=str(version.get("Version") or "unknown"),
                           api_version=str(version.get("APIVersion") or ""),
                           driver=str(store.get("graphDriverName") or "unknown"),
                           root_dir=str(store.get("graphRoot") or ""), arch=arch or Platform.host().architecture,
                           os=str(host.get("os") or "linux"), local=True, image_store="containers-storage",
                           runtime="podman", staging_dir=self.staging_dir)

    def _inspect(self, ids: List[str]) -> List[dict]:
        try:
            docs = self._json(["image", "inspect", "--format", "json"] + ids, "image inspect")
        except ProgramFailed:
            if len(ids) == 1:
                return []  # no such image
            return [d for one in ids for d in self._inspect([one])]  # one of them went away meanwhile
        return [d for d in docs or [] if isinstance(d, dict)]

    def image_info(self, image_id: str) -> Optional[ImageInfo]:
        docs = self._inspect([image_id])
        return _image(docs[0]) if docs else None

    def images_by_id(self) -> Dict[str, ImageInfo]:
        out = {}
        for entry in self._json(["images", "--all", "--format", "json"], "images") or []:
            image_id = _sha(entry.get("Id"))
            names = tuple(n for n in entry.get("Names") or () if n)
            out[image_id] = ImageInfo(image_id, names, "", "", None, int(entry.get("Size") or 0))
        return out

    def stored_name(self, name: str) -> str:
        """Podman's form of a name: one without a registry is localhost/'s (x:1 -> localhost/x:1)."""
        first, sep, _ = name.partition("/")
        if not sep or ("." not in first and ":" not in first and first != "localhost"):
            name = "localhost/" + name
        if ":" not in name.rsplit("/", 1)[-1]:
            name += ":latest"
        return name

    def tag(self, image_id: str, name: str) -> None:
        self.podman.run(["tag", image_id, name], what=f"tag {name}")

    def remove_image(self, image_id: str) -> None:
        try:
            self.podman.run(["rmi", "--force", image_id], what="rmi")
        except ProgramFailed:
            if self.image_info(image_id) is not None:
                raise

    def load_archive(self, chunks: Iterable[bytes], platforms: Tuple[str, ...] = ()) -> List[str]:
        """`podman load -i` of the tar stream, written whole to the staging dir first (the copy podman itself
        would make of a pipe), so podman runs only when every chunk came; the copy is removed after.
        Raises DaemonError, or what the chunks raised (then podman never ran)."""
        try:
            fd, path = tempfile.mkstemp(prefix="imgtool-load-", suffix=".tar", dir=self.staging_dir)
        except OSError as e:
            raise DaemonError(f"cannot stage the archive for podman load in {self.staging_dir}: {e.strerror or e}",
                              hint="podman load needs the archive's size free there; set TMPDIR to another "
                                   "directory") from e
        try:
            try:
                with os.fdopen(fd, "wb") as f:
                    for chunk in chunks:
                        f.write(chunk)
            except OSError as e:
                raise DaemonError(f"cannot stage the archive for podman load in {self.staging_dir}: "
                                  f"{e.strerror or e}", hint="podman load needs the archive's size free there; set "
                                                             "TMPDIR to another directory") from e
            return self.podman.run(["load", "--input", path], timeout=self.timeout, what="load").splitlines()
        finally:
            os.unlink(path)

    def inventory(self) -> list:
        """Every image with its layers: [delta.InventoryImage]; raises DaemonError."""
        from .delta import InventoryImage
        from .errors import UsageError
        from .model import Digest

        ids = sorted(self.images_by_id())
        out = []
        for d in self._inspect(ids) if ids else []:
            try:
                diff_ids = tuple(Digest.parse(x) for x in (d.get("RootFS") or {}).get("Layers") or [])
            except (UsageError, TypeError, AttributeError):
                continue
            image = _image(d)
            out.append(InventoryImage(image.id, image.tags, image.platform, diff_ids))
        return out


def _sha(value) -> str:
    text = str(value or "")
    return text if text.startswith("sha256:") else "sha256:" + text


def _image(d: dict) -> ImageInfo:
    return ImageInfo(_sha(d.get("Id")), tuple(t for t in d.get("RepoTags") or () if t), str(d.get("Os") or ""),
                     str(d.get("Architecture") or ""), d.get("Variant") or None, int(d.get("Size") or 0))
