"""The containerd room: a Kubernetes node's runtime, through `ctr` run as a program (program.py).

`ctr --address A --namespace NS` (k8s.io by default: the namespace the kubelet's CRI plugin reads).
An image's ID here is its manifest digest (what `ctr images ls` lists as DIGEST); its names are
fully qualified (docker.io/library/x:1). An import reads the whole archive into the content store
under a lease before it creates an image record, so an archive cut short leaves no record; what it
ingested is removed here (`ctr content rm`), so a refused load leaves nothing behind.

An image record is not yet an image the kubelet can run: the import leaves the unpacking into the
snapshotter to imgtool (`--no-unpack`), which unpacks each image it loads with `ctr images mount`, the
one ctr command that runs an unpack under a lease the caller names: `imgtool-unpack.<pid>.<start>`,
so what a killed unpack leaves (that lease, its `extract-…` snapshot) is known for imgtool's own and is
removed by the next load, which finishes the unpack; nothing of another tool's is ever touched.
Standard library only (the offline side runs on Python 3.7).
"""

import json
import os
import shutil
import socket
import tempfile
from typing import Dict, FrozenSet, Iterable, List, Optional, Sequence, Set, Tuple

from ..errors import DaemonError, ProgramFailed, UsageError
from ..nodeconfig import HUB, Mirror, NodeFile, RuntimePart, toml_string
from ..model import Digest
from ..program import Program
from .base import Debris, ImageInfo, RuntimeInfo, Traits, Unfinished, tags_of


class _ContainerdTraits(Traits):
    def describe(self, facts: RuntimeInfo) -> str:
        return f"containerd {facts.version} at {facts.host}, namespace {facts.namespace}"

    def storage(self, facts: RuntimeInfo) -> Tuple[str, str, str]:
        return "ok", (f"containerd's content store and {facts.driver} snapshotter under {facts.root_dir}, "
                      f"namespace {facts.namespace}: image IDs are manifest digests"), ""

    def space_advice(self, facts: RuntimeInfo) -> str:
        return SPACE_ADVICE.format(namespace=facts.namespace or "k8s.io")


# how to make room where containerd keeps images, in its own tools' words (load.sh says the same: bundle/loadsh.py)
SPACE_ADVICE = ("free space there (ctr -n {namespace} images prune --all; on a Kubernetes node crictl rmi --prune), "
                "or move containerd's root (root in /etc/containerd/config.toml)")
# containerd keeps the compressed blobs in its content store and unpacks them into snapshots: nothing staged
TRAITS = _ContainerdTraits(
    title="containerd", load_command="ctr images import", zstd_since="1.5", digest_names=True, pins_for_kubelet=True,
    reuses_blobs=True,
    absent_advice="start it (systemctl start containerd), or give its socket with --address or CONTAINERD_ADDRESS; "
                  "run as root")

LOAD_TIMEOUT = 3600.0  # after the last byte: unpacking a 15 GB image into the snapshotter
INSTALL_HINT = "ctr comes with containerd (the containerd or containerd.io package)"
PINNED = "io.cri-containerd.pinned=pinned"  # the CRI plugin reports such images pinned (1.7+): no kubelet GC
LEASE_PREFIX = "imgtool-unpack."  # imgtool-unpack.<pid>.<its start time>: the lease of an unpack of imgtool's
# imgtool-load.<pid>.<its start time>.<n>: a lease that holds nothing and marks a load of imgtool's while it runs (made
# once the import has begun, deleted when the load ends, whatever the end): its labels name `ctr images import`'s own
# lease (MARK_CTR_LEASE) and the images the load registers (MARK_IMAGE<i>). One whose process is gone marks a load cut
# short (containerd, imgtool or ctr killed): the next load removes that lease and finishes those images; doctor lists them.
MARK_PREFIX = "imgtool-load."
MARK_CTR_LEASE = "imgtool.ctr-lease"
MARK_IMAGE = "imgtool.image."
MARK_AFTER = 1 << 20  # bytes fed to ctr before the mark is made: by then it has read from the pipe, so its lease exists
GC_EXPIRE = "containerd.io/gc.expire"
_UNITS = {"B": 1, "KiB": 1024, "MiB": 1024 ** 2, "GiB": 1024 ** 3, "TiB": 1024 ** 4,
          "kB": 1000, "KB": 1000, "MB": 1000 ** 2, "GB": 1000 ** 3, "TB": 1000 ** 4}


class Containerd:
    """The operations load, inventory and doctor need of containerd (runtime.Runtime); errors are DaemonError."""

    traits: Traits = TRAITS

    def __init__(self, address: str, namespace: str, timeout: Optional[float] = LOAD_TIMEOUT,
                 snapshotter: str = ""):
        self.address = address
        self.namespace = namespace
        self.timeout = timeout or LOAD_TIMEOUT
        self.snapshotter = snapshotter or "overlayfs"  # ctr's default (CONTAINERD_SNAPSHOTTER overrides it)
        _reachable(address)
        self.ctr = Program(["ctr", "--address", address, "--namespace", namespace], "containerd",
                           install_hint=INSTALL_HINT)
        self._version = self._server_version()
        self._unpacks = 0  # unpacks run by this process: each under a lease of its own
        self._marks = 0
        self._mark: Optional[Tuple[str, str, Tuple[Tuple[str, str], ...]]] = None  # (lease, ctr's lease, images)

    def close(self) -> None:
        """The load's mark deleted: the load ended here, and it removed what it left (else the mark stays, and the
        next load or doctor finds it)."""
        if self._mark is not None:
            try:
                self.ctr.run(["leases", "delete", self._mark[0]], what="leases delete")
                self._mark = None
            except DaemonError:
                pass  # containerd gone: the mark stays for the next load

    def __enter__(self) -> "Containerd":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _server_version(self) -> str:
        try:
            text = self.ctr.run(["version"], timeout=30)
        except ProgramFailed as e:
            raise DaemonError(f"cannot reach containerd at {self.address}: {e.output}",
                              hint="start it (systemctl start containerd), or give its socket with --address "
                                   "or CONTAINERD_ADDRESS") from e
        server = text.split("Server:", 1)[-1]
        for line in server.splitlines():
            key, _, value = line.strip().partition(":")
            if key == "Version":
                return value.strip()
        return "unknown"

    def info(self) -> RuntimeInfo:
        """Version, snapshotter, root dir and architecture of containerd; raises DaemonError."""
        from ..model import Platform

        roots, platform = _plugins(self.ctr.run(["plugins", "ls", "--detailed"]), self.snapshotter)
        content = roots.get("content", "")
        arch = Platform.parse(platform).architecture if platform else Platform.host().architecture
        return RuntimeInfo(traits=TRAITS, host=self.address, version=self._version, api_version="", driver=self.snapshotter,
                           root_dir=os.path.dirname(content) if content else "", arch=arch, os="linux", local=True,
                           image_store="containerd", runtime="containerd", namespace=self.namespace)

    def local_tags(self, repository: str) -> List[str]:
        """Tags of `repository` in this namespace, sorted (run-flags --format k8s: the newest for a preset); raises
        DaemonError."""
        return tags_of(self.images_by_id().values(), repository)

    # --- images ---------------------------------------------------------------------------------

    def _listing(self) -> List[Tuple[str, str, str, int]]:
        """`ctr images ls`: (name, target digest, platforms, size) of every image record."""
        return [(name, digest, platforms, size) for name, digest, platforms, size, _ in self._rows()]

    def _rows(self) -> List[Tuple[str, str, str, int, str]]:
        """`ctr images ls`: (name, target digest, platforms, size, labels) of every image record."""
        out = []
        for line in self.ctr.run(["images", "ls"]).splitlines()[1:]:
            f = line.split()
            if len(f) < 6:
                continue
            size = int(float(f[3]) * _UNITS.get(f[4], 1)) if _number(f[3]) else 0
            out.append((f[0], f[2], f[5], size, f[6] if len(f) > 6 else ""))
        return out

    def pinned(self) -> Set[str]:
        """The image IDs that carry the CRI's pinned label on a name."""
        return {digest for _, digest, _, _, labels in self._rows() if PINNED in labels.split(",")}

    def _leases(self) -> Dict[str, Tuple[str, Dict[str, str]]]:
        """`ctr leases ls`: every lease's (created at, labels) by its ID."""
        out: Dict[str, Tuple[str, Dict[str, str]]] = {}
        for line in self.ctr.run(["leases", "ls"], what="leases ls").splitlines()[1:]:
            f = line.split()
            if f:
                labels = f[2] if len(f) > 2 else ""
                out[f[0]] = (f[1] if len(f) > 1 else "", dict(x.partition("=")[::2] for x in labels.split(",") if "=" in x))
        return out

    def _cut_short(self, leases: Dict[str, Tuple[str, Dict[str, str]]]) -> List[Tuple[str, str, str, Dict[str, str]]]:
        """(lease, pid, created at, labels) of imgtool's marks and unpack leases whose process is gone."""
        out = []
        for lease, (created, labels) in sorted(leases.items()):
            for prefix in (MARK_PREFIX, LEASE_PREFIX):
                if lease.startswith(prefix) and not _alive(lease[len(prefix):]):
                    out.append((lease, lease[len(prefix):].partition(".")[0], created, labels))
        return out

    def _half_loaded(self, labels: Dict[str, str]) -> List[Tuple[str, str]]:
        """(its name, what it lacks) of each image a mark names that containerd holds but not all of."""
        named: Dict[str, List[str]] = {}
        for name, digest, _, _ in self._listing():
            named.setdefault(digest, []).append(name)
        out = []
        for key, image_id in sorted(labels.items()):
            if not key.startswith(MARK_IMAGE) or image_id not in named:
                continue
            diff_ids = self._diff_ids_of(image_id)
            missing = self.incomplete(image_id, diff_ids) if diff_ids is not None else \
                Unfinished("its config cannot be read", needs_import=True)
            if missing is not None:
                name = sorted(named[image_id], key=lambda n: (n.startswith("sha256:"), "@" in n, n))[0]
                out.append((name, missing.reason))
        return out

    def debris(self) -> List[Debris]:
        """What loads of imgtool's cut short left (their process gone), read only: ctr's import lease and what it
        holds, the images they left half-loaded, the leases of unpacks of imgtool's. Raises DaemonError."""
        leases = self._leases()
        out = []
        for lease, pid, created, labels in self._cut_short(leases):
            if lease.startswith(LEASE_PREFIX):
                out.append(Debris(f"lease {lease} of an unpack of imgtool's that was cut short (pid {pid}, {created}) "
                                  "holds the layers it had unpacked", "the next imgtool load removes it"))
                continue
            theirs = labels.get(MARK_CTR_LEASE, "")
            if theirs in leases:
                until = leases[theirs][1].get(GC_EXPIRE, "")
                out.append(Debris(f"lease {theirs} of an imgtool load that was cut short (pid {pid}, {created}) holds "
                                  f"what containerd had received of it{f' until {until}' if until else ''}",
                                  "the next imgtool load removes it"))
            for name, reason in self._half_loaded(labels):
                out.append(Debris(f"{name} is half-loaded ({reason}), but the kubelet takes it for present: an imgtool "
                                  f"load was cut short (pid {pid}, {created})",
                                  "run imgtool load DIR again, DIR the bundle that holds it: it finishes it"))
        return out

    def remove_debris(self) -> List[str]:
        """What loads of imgtool's cut short left, removed: ctr's import lease and what only it held, the leases of
        unpacks and their unfinished snapshots; an image such a load left half-loaded is said, and finished when
        its bundle is loaded (`incomplete`, `finish`), which then removes the load's mark. Nothing of another
        tool's, nor of a load still running, is touched. One listing when there is nothing."""
        try:
            leases = self._leases()
        except DaemonError:
            return []  # the load's own first call says why
        said = []
        for lease, pid, _, labels in self._cut_short(leases):
            if lease.startswith(LEASE_PREFIX):
                if self._delete_lease(lease):
                    said.append(f"removed containerd lease {lease}, with the layers an unpack of imgtool's that was "
                                f"cut short (pid {pid}) had unpacked")
                continue
            theirs = labels.get(MARK_CTR_LEASE, "")
            if theirs in leases and self._delete_lease(theirs):
                said.append(f"removed containerd lease {theirs}, with what containerd had received of an imgtool load "
                            f"that was cut short (pid {pid})")
            half = self._half_loaded(labels)
            for name, reason in half:
                said.append(f"{name} is half-loaded in containerd ({reason}): an imgtool load was cut short (pid "
                            f"{pid}); loading its bundle finishes it")
            if not half:
                self._delete_lease(lease)
        return said

    def _delete_lease(self, lease: str) -> bool:
        """Delete a lease, and with it (--sync: the garbage collection that follows) what only it held."""
        try:
            self.ctr.run(["leases", "delete", "--sync", lease], what="leases delete")
            return True
        except DaemonError:
            return False  # it expires by itself (ctr's: 24 h) and containerd's GC then collects what it held

    def left_behind(self) -> str:
        """What this process's load, failed where containerd no longer answered, may have left there (by its
        mark); "" when its mark was never made."""
        if self._mark is None:
            return ""
        try:
            _reachable(self.address)
            return ""  # it answers: the load removed what it left (load_archive, bundle.landing.land)
        except DaemonError:
            pass
        _, theirs, images = self._mark
        names = ", ".join(sorted({name for name, _ in images}))
        held = f"lease {theirs} with what it had received" if theirs else "what it had received, under ctr's lease"
        return (f"it may hold {held}" + (f", and {names} named but not unpacked if it had registered "
                                          f"{'them' if len(images) > 1 else 'it'} (the kubelet would take "
                                          f"{'them' if len(images) > 1 else 'it'} for present)" if names else "")
                + "; imgtool knows these for its own: the next imgtool load removes and finishes them, and imgtool "
                  "doctor lists them")

    def pin(self, image_id: str) -> bool:
        """Label every name of the image `io.cri-containerd.pinned=pinned`: the CRI plugin (1.7+) then reports it
        pinned and the kubelet's image GC leaves it; raises DaemonError."""
        for name in sorted({n for n, digest, _, _ in self._listing() if digest == image_id}):
            self.ctr.run(["images", "label", name, PINNED], what=f"images label {name}")
        return True

    def images_by_id(self) -> Dict[str, ImageInfo]:
        """Every image by its ID (manifest digest), from one listing; raises DaemonError."""
        names: Dict[str, List[str]] = {}
        rows: Dict[str, Tuple[str, int]] = {}
        for name, digest, platforms, size in self._listing():
            names.setdefault(digest, [])
            if not name.startswith("sha256:") and "@" not in name:  # tags only, as Docker's RepoTags: not the
                names[digest].append(name)  # CRI plugin's own sha256:<config> ref, nor NAME@DIGEST names
            rows[digest] = (platforms, size)
        out = {}
        for digest, (platforms, size) in rows.items():
            parts = (platforms.split(",")[0].split("/") + ["", "", ""])[:3] if "," not in platforms else ["", "", ""]
            out[digest] = ImageInfo(digest, tuple(names[digest]), parts[0], parts[1], parts[2] or None, size)
        return out

    def image_info(self, image_id: str) -> Optional[ImageInfo]:
        return self.images_by_id().get(image_id)

    def held_blobs(self, digests: Iterable[Digest]) -> FrozenSet[Digest]:
        """Those of `digests` the content store holds; raises DaemonError."""
        there = self._blobs()
        return frozenset(d for d in digests if str(d) in there)

    def blob_head(self, digest: str, limit: int) -> Optional[bytes]:
        """The first `limit` bytes of a blob of the content store (a modelcar layer's tar head: the file's size), the
        rest never read; None when it holds no such blob. Raises DaemonError."""
        return self.ctr.head(["content", "get", digest], limit)

    def applied_diff_ids(self, image_id: str) -> Optional[List[str]]:
        """None: containerd checks every layer against its diff_id itself while it unpacks."""
        return None

    def incomplete(self, image_id: str, diff_ids: Sequence[str]) -> Optional[Unfinished]:
        """What is missing of a recorded image, or None when it is complete (manifest, config and every layer
        in the content store) and unpacked (its top layer chain a committed snapshot of the snapshotter,
        which its config holds on to); raises DaemonError."""
        from ..delta import chain_ids

        manifest = self._content(image_id)
        if manifest is None or "layers" not in manifest:
            return Unfinished("its manifest is not in the content store", needs_import=True)
        config = str((manifest.get("config") or {}).get("digest") or "")
        blobs = self._labels()
        wanted = [config] + [str(x.get("digest") or "") for x in manifest.get("layers") or [] if isinstance(x, dict)]
        missing = [d for d in wanted if d not in blobs]
        if missing:
            return Unfinished(f"{len(missing)} of its blobs are not in the content store", needs_import=True)
        if not diff_ids:
            return None
        top = str(chain_ids(tuple(Digest.parse(d) for d in diff_ids))[-1])
        try:
            info = json.loads(self.ctr.run(["snapshots", "--snapshotter", self.snapshotter, "info", top],
                                           what="snapshots info"))
        except ProgramFailed:
            return Unfinished(f"it is not unpacked into {self.snapshotter}")
        except ValueError:
            info = {}
        if str(info.get("Kind") or info.get("kind") or "").lower() not in ("committed", "2"):
            return Unfinished(f"it is not unpacked into {self.snapshotter}")
        if blobs.get(config, {}).get(f"containerd.io/gc.ref.snapshot.{self.snapshotter}") != top:
            return Unfinished(f"its unpacked layers in {self.snapshotter} are not recorded with it")
        return None

    def _labels(self) -> Dict[str, Dict[str, str]]:
        """`ctr content ls`: every blob's labels by digest."""
        out: Dict[str, Dict[str, str]] = {}
        for line in self.ctr.run(["content", "ls"]).splitlines()[1:]:
            f = line.split("\t")
            if not f or not f[0].startswith("sha256:"):
                continue
            labels = f[-1] if len(f) >= 4 else ""
            out[f[0]] = dict(x.partition("=")[::2] for x in labels.split(",") if "=" in x)
        return out

    def finish(self, image_id: str) -> None:
        """Unpack a recorded, complete image into the snapshotter under a lease of imgtool's, then remove what
        earlier unpacks of imgtool's, stopped midway (containerd or imgtool killed), left: their leases and
        with them their unfinished snapshots. Raises DaemonError when the image is still not unpacked."""
        rows = [(n, platforms) for n, digest, platforms, _ in self._listing() if digest == image_id]
        if not rows:
            raise DaemonError(f"cannot unpack {image_id[:19]}: containerd has no such image")
        name, platforms = sorted(rows, key=lambda r: (r[0].startswith("sha256:"), "@" in r[0], r[0]))[0]
        self._unpacks += 1
        lease = f"{LEASE_PREFIX}{_process_mark(os.getpid())}.{self._unpacks}"
        where = tempfile.mkdtemp(prefix="imgtool-unpack-")
        try:  # the target does not exist: ctr unpacks under the lease it names, then fails to mount and lets go
            args = ["images", "mount", "--snapshotter", self.snapshotter]
            if platforms.count("/") in (1, 2) and "," not in platforms:  # one platform (not "-", not a list)
                args += ["--platform", platforms]
            said = self.ctr.outcome(args + [name, lease], self.timeout, cwd=where)
        finally:
            shutil.rmtree(where, ignore_errors=True)
        self._drop_stale_leases()
        diff_ids = self._diff_ids_of(image_id)
        missing = self.incomplete(image_id, diff_ids) if diff_ids is not None else Unfinished("its config cannot be read")
        if missing:
            raise DaemonError(f"containerd could not unpack {name} ({missing.reason}): {said}",
                              hint="check containerd's log and free space, then load again")

    def _diff_ids_of(self, image_id: str) -> Optional[List[str]]:
        manifest = self._content(image_id) or {}
        config = self._content(str((manifest.get("config") or {}).get("digest") or ""))
        found = None if config is None else _diff_ids(config)
        return None if found is None else [str(d) for d in found]

    def _drop_stale_leases(self) -> None:
        """Delete imgtool's unpack leases whose process is gone (never another's, never a live one's), and the
        marks of loads cut short whose images are all whole now; the garbage collection that follows (--sync)
        removes the snapshots only they held."""
        try:
            stale = self._cut_short(self._leases())
        except DaemonError:
            return
        for lease, _, _, labels in stale:
            if lease.startswith(LEASE_PREFIX) or not self._half_loaded(labels):
                self._delete_lease(lease)

    def stored_name(self, name: str) -> str:
        """containerd's form of a name: fully qualified, as Docker's reference normalization gives it."""
        return normalize(name)

    def tag(self, image_id: str, name: str) -> None:
        """Name the image `name` (moved from another image if it had it); raises DaemonError."""
        refs = [n for n, digest, _, _ in self._listing() if digest == image_id]
        if not refs:
            raise DaemonError(f"cannot tag {image_id[:19]} as {name}: containerd has no such image")
        self.ctr.run(["images", "tag", "--force", refs[0], normalize(name)], what=f"images tag {name}")

    def remove_image(self, image_id: str) -> None:
        """Remove every name of the image and let containerd collect its content; raises DaemonError."""
        refs = [n for n, digest, _, _ in self._listing() if digest == image_id]
        if refs:
            self.ctr.run(["images", "rm", "--sync"] + refs, what="images rm")

    def load_archive(self, chunks: Iterable[bytes], platforms: Tuple[str, ...] = (), *,
                     images: Sequence[Tuple[str, str]] = ()) -> List[str]:
        """`ctr images import` of a tar stream into the namespace, unpacked into the snapshotter.

        `platforms`: the platforms the archive's images are for (one: --platform it; several:
        --all-platforms). No import-DATE@sha256 names (no --digests): images carry the names the
        archive's index.json gives. When the import fails or the stream is cut short, what it left
        (image records, blobs) that was not here before is removed. Once the import has begun, the load is
        marked (a lease of imgtool's naming ctr's lease and `images`, (name, ID) each) until it ends (close), so
        that what it leaves when it is cut short is known for imgtool's. Raises DaemonError, or what the
        chunks raised.
        """
        args = ["images", "import", "--no-unpack"]  # unpacked under imgtool's own lease: finish()
        if len(set(platforms)) == 1:
            args += ["--platform", platforms[0]]
        elif platforms:
            args += ["--all-platforms"]
        if self.snapshotter:
            args += ["--snapshotter", self.snapshotter]
        before_images = {n for n, _, _, _ in self._listing()}
        before_blobs = self._blobs()
        before_leases = set(self._leases())

        def marked() -> Iterable[bytes]:
            fed, tried = 0, False
            for chunk in chunks:
                if fed >= MARK_AFTER and not tried:  # the chunks before it written: ctr has read from the pipe
                    tried = True
                    self._make_mark(before_leases, tuple(images))
                yield chunk
                fed += len(chunk)
            if not tried:
                self._make_mark(before_leases, tuple(images))

        try:
            return self.ctr.feed(args + ["-"], marked(), self.timeout, "images import")
        except BaseException:
            self._forget(before_images, before_blobs)
            raise

    def _make_mark(self, before: Set[str], images: Tuple[Tuple[str, str], ...]) -> None:
        """Mark the running load (MARK_PREFIX): ctr's lease is the one lease that came since `before` with no label
        but its expiry (none is named when that is not one alone: another tool's is never taken for it)."""
        try:
            new = [lease for lease, (_, labels) in self._leases().items()
                   if lease not in before and set(labels) == {GC_EXPIRE}]
            theirs = new[0] if len(new) == 1 else ""
            self._marks += 1
            lease = f"{MARK_PREFIX}{_process_mark(os.getpid())}.{self._marks}"
            labels = [f"{MARK_CTR_LEASE}={theirs}"] if theirs else []
            labels += [f"{MARK_IMAGE}{i}={image_id}" for i, (_, image_id) in enumerate(images)]
            self.ctr.run(["leases", "create", "--id", lease, "--expires", "0"] + labels, what="leases create")
            self._mark = (lease, theirs, images)
        except DaemonError:
            pass  # unmarked: what a cut-short load leaves is then not known for imgtool's (ctr's lease expires in 24 h)

    def _blobs(self) -> Set[str]:
        return {line.strip() for line in self.ctr.run(["content", "ls", "--quiet"]).splitlines() if line.strip()}

    def _forget(self, images: Set[str], blobs: Set[str]) -> None:
        """After a failed import: remove the image records and blobs that were not there before it."""
        try:
            new = [n for n, _, _, _ in self._listing() if n not in images]
            if new:
                self.ctr.run(["images", "rm", "--sync"] + new, what="images rm")
            left = sorted(self._blobs() - blobs)
            if left:
                self.ctr.run(["content", "rm"] + left, what="content rm")
        except DaemonError:
            pass  # the import's own error is the story; containerd's GC collects unreferenced blobs later

    # --- inventory ------------------------------------------------------------------------------

    def _content(self, digest: str) -> Optional[dict]:
        try:
            data = self.ctr.run(["content", "get", digest], what="content get")
        except ProgramFailed:
            return None  # not in the content store (an index's other platforms)
        try:
            doc = json.loads(data)
        except ValueError:
            return None
        return doc if isinstance(doc, dict) else None

    def inventory(self) -> list:
        """Every image of the namespace with its layers: [delta.InventoryImage], one per platform manifest
        present (an index's), by manifest digest; raises DaemonError."""
        from ..delta import InventoryImage

        out = []
        pinned = self.pinned()
        for digest, info in self.images_by_id().items():
            doc = self._content(digest)
            if doc is None:
                continue
            for image_id, manifest, platform in self._platform_manifests(digest, doc, info.platform):
                config = self._content(str((manifest.get("config") or {}).get("digest") or ""))
                diff_ids = None if config is None else _diff_ids(config)
                if config is None or diff_ids is None:
                    continue
                if not platform:
                    platform = "/".join(str(config.get(k)) for k in ("os", "architecture", "variant") if config.get(k))
                out.append(InventoryImage(image_id, info.tags, platform, diff_ids, pinned=digest in pinned,
                                          documents=(manifest, config)))
        return out

    def _platform_manifests(self, digest: str, doc: dict, platform: str) -> List[Tuple[str, dict, str]]:
        """(manifest digest, manifest, platform) of an image: itself, or an index's platforms whose manifests
        the content store holds."""
        if "manifests" not in doc:
            return [(digest, doc, platform)]
        out = []
        for entry in doc.get("manifests") or []:
            if not isinstance(entry, dict):
                continue
            child = self._content(str(entry.get("digest") or ""))
            p = entry.get("platform") or {}
            name = "/".join(x for x in (p.get("os"), p.get("architecture"), p.get("variant")) if x)
            if child is not None:
                out.append((str(entry.get("digest")), child, name))
        return out


def _process_mark(pid: int) -> str:
    """<pid>.<its start time in clock ticks since boot>: a process, never mistaken for a later one of that pid."""
    return f"{pid}.{_start_time(pid)}"


def _start_time(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode("ascii", "replace")
    except OSError:
        return ""
    fields = stat.rpartition(")")[2].split()
    return fields[19] if len(fields) > 19 else ""  # field 22 of stat; fields[0] is field 3


def _alive(mark: str) -> bool:
    """The process a lease's mark names still runs (the same pid, started at the same time)."""
    pid, _, rest = mark.partition(".")
    start = rest.partition(".")[0]
    return pid.isdigit() and bool(start) and _start_time(int(pid)) == start


def _diff_ids(config: dict) -> Optional[Tuple[Digest, ...]]:
    """A config's rootfs diff_ids, or None when they are not a list of digests."""
    try:
        return tuple(Digest.parse(x) for x in (config.get("rootfs") or {}).get("diff_ids") or [])
    except (UsageError, TypeError, AttributeError):
        return None


def _reachable(address: str) -> None:
    """Raise DaemonError, in words, unless containerd's socket accepts a connection (before ctr waits on it)."""
    where = f"cannot reach containerd at {address}"
    hint = "start it (systemctl start containerd), or give its socket with --address or CONTAINERD_ADDRESS"
    s = socket.socket(socket.AF_UNIX)
    try:
        s.settimeout(10)
        s.connect(address)
    except FileNotFoundError:
        raise DaemonError(f"{where}: the socket does not exist (containerd is not running)", hint=hint) from None
    except PermissionError:
        raise DaemonError(f"{where}: permission denied", hint="run as root (containerd's socket is root's)") from None
    except ConnectionRefusedError:
        raise DaemonError(f"{where}: connection refused (containerd is not running)", hint=hint) from None
    except OSError as e:
        raise DaemonError(f"{where}: {(e.strerror or str(e)).lower()}", hint=hint) from None
    finally:
        s.close()


def normalize(name: str) -> str:
    """A name as containerd stores it (Docker's normalization): x:1 -> docker.io/library/x:1,
    user/x -> docker.io/user/x:latest, host:5000/x stays."""
    first, sep, _ = name.partition("/")
    if not sep or ("." not in first and ":" not in first and first != "localhost"):
        name = "docker.io/" + (name if sep else "library/" + name)
    last = name.rsplit("/", 1)[-1]
    if ":" not in last and "@" not in last:
        name += ":latest"
    return name


def _number(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def _plugins(text: str, snapshotter: str) -> Tuple[Dict[str, str], str]:
    """`ctr plugins ls --detailed` -> ({plugin id: its exported root}, the snapshotter's platform)."""
    roots: Dict[str, str] = {}
    platforms: Dict[str, str] = {}
    current = ""
    for line in text.splitlines():
        key, _, value = line.strip().partition(":")
        words = line.split()
        if key == "ID":
            current = value.strip()
        elif key == "Platforms" and current:
            platforms[current] = value.strip().split(",")[0]
        elif len(words) == 2 and words[0] == "root" and current:
            roots.setdefault(current, words[1])
    return roots, platforms.get(snapshotter, "")


# --- what a node's containerd needs to pull from `imgtool serve` (nodeconfig.py asks each room) ------------------

CERTS_D = "/etc/containerd/certs.d"  # containerd 2.x reads it by default; 1.6/1.7's CRI when config_path names it
_HUB_SERVER = "https://registry-1.docker.io"  # containerd's name for Docker Hub's registry


def mirror_part(mirror: Mirror) -> RuntimePart:
    """A hosts.toml per upstream registry naming serve as its mirror (and the CA beside it under TLS)."""

    files = []
    for registry in mirror.registries:
        server = _HUB_SERVER if registry == HUB else f"https://{registry}"
        hosts = (f"server = {toml_string(server)}\n\n[host.{toml_string(mirror.url)}]\n"
                 "  capabilities = [\"pull\", \"resolve\"]\n")
        if mirror.tls:
            hosts += "  ca = \"ca.crt\"\n"  # relative: the directory of this hosts.toml
        files.append(NodeFile(f"{CERTS_D}/{registry}/hosts.toml", hosts))
        if mirror.tls and mirror.ca_pem is not None:
            files.append(NodeFile(f"{CERTS_D}/{registry}/ca.crt", mirror.ca_pem))
    notes = (f"1.6 and 1.7 read these files only when /etc/containerd/config.toml has config_path = \"{CERTS_D}\" "
             "under [plugins.\"io.containerd.grpc.v1.cri\".registry] (2.x reads them by default); a change to "
             "hosts.toml needs no restart, one to config.toml does",
             "pods keep their image names (quay.io/...:TAG or @sha256:...); the mirror is asked first, the upstream "
             "registry only when it fails (unreachable offline)",
             "k3s and RKE2 write these files themselves, from /etc/rancher/k3s/registries.yaml (rke2/registries.yaml): "
             f"mirrors: {{{mirror.registries[0] if mirror.registries else 'quay.io'}: {{endpoint: [\"{mirror.url}\"]}}}}, "
             "and restart")
    return RuntimePart("containerd", "containerd (Kubernetes nodes; ctr --hosts-dir, crictl, the kubelet)",
                       tuple(files), notes, f"{CERTS_D}/<registry>/ca.crt")
