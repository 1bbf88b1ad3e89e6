"""The Podman room: RHEL-family and openEuler hosts' runtime, through `podman` run as a program (program.py).

`imgtool run --runtime podman` runs the rendered `podman run` here too: the terminal is podman's,
its exit code is returned, Ctrl-C and SIGTERM stop the container (as the Docker path does).
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
import re
import shutil
import stat
import sys
import tempfile
import threading
from typing import TYPE_CHECKING, Any, Callable, Dict, FrozenSet, Iterable, List, Mapping, Optional, Sequence, Tuple

from ..errors import DaemonError, ImgtoolError, LayerRefused, ProgramFailed, UsageError, one_line
from ..nodeconfig import Mirror, NodeFile, RuntimePart, toml_string
from ..fsutil import process_alive, remove_quietly, tree_size
from ..model import Digest, foreign_arch_warning, format_size
from ..program import QUICK, Process, ProcessTimeout, Program
from .base import Debris, ImageInfo, RunProgram, RuntimeInfo, Traits, Unfinished, tags_of

if TYPE_CHECKING:
    from .base import ContainerSpec

LOAD_TIMEOUT = 3600.0  # after the last byte: podman reads the copy and commits every layer
START_TIMEOUT = 600.0  # `podman run -d` returns once the container is created and started
STOP_GRACE = 10  # seconds `podman stop` gives the container before SIGKILL, as the Docker path does
INSTALL_HINT = ("install Podman (dnf install podman; Debian/Ubuntu: apt-get install podman), "
                "or choose another runtime with --runtime")


STAGED_PREFIX = "imgtool-load-"  # a load's own directory there: imgtool-load-<pid>-<random>/archive.tar (older: .tar)
_STAGED = re.compile(r"imgtool-load-([0-9]{1,10})-[A-Za-z0-9_]{1,32}(\.tar)?\Z")
_LEFT = "the archive copy and Podman's temporaries of an imgtool load that was cut short"
_LEFT_COPY = "the archive copy of an imgtool load that was cut short"  # a bare .tar: of an earlier imgtool


class _PodmanTraits(Traits):
    def describe(self, facts: RuntimeInfo) -> str:
        if facts.unmade:
            return (f"Podman {facts.version}, no storage yet ({facts.root_dir}): not asked more, as `podman info` would "
                    "create it")
        return f"Podman {facts.version}"

    def storage(self, facts: RuntimeInfo) -> Tuple[str, str, str]:
        where = f"containers-storage ({facts.driver}) under {facts.root_dir}"
        if facts.unmade:
            return "info", f"{where}: not there yet (Podman makes it on first use)", ""
        if facts.driver == "vfs":
            return "warn", where, "vfs copies every layer in full: overlay is the usual choice"
        return "ok", where, ""

    def space_advice(self, facts: RuntimeInfo) -> str:
        return SPACE_ADVICE

    def staged_words(self, facts: RuntimeInfo) -> str:
        return "the copy of the archive Podman loads from and the two Podman makes of its layers"


# how to make room where Podman keeps images, in its own tools' words (load.sh says the same: bundle/loadsh.py)
SPACE_ADVICE = "free space there (podman image prune, podman system df), or move Podman's graphroot (storage.conf)"
# Podman 4.3 loading an archive of A bytes (measured with the test services' Podman on generated images: A = 16, 24
# and 32 MiB, layers from incompressible to 2.4:1): its staging dir ($TMPDIR, else /var/tmp) holds 3.0 x A at its
# peak, imgtool's copy of the archive plus two copies Podman makes of the layers while it reads and applies them,
# all removed after; its graphroot holds what the layers unpack to (overlay: +0.4 % for big files, +5 % for many
# small ones). Podman 4.3 loads a layer that is not its diff_id's (measured): imgtool checks for it; Podman 5 refuses it
# itself (_refused_layer), and imgtool says so as it says 4.3's.
TRAITS = _PodmanTraits(
    title="Podman", load_command="podman load", zstd_since="3.0", checks_diff_ids=False, staged_copies=3,
    staging_advice="point TMPDIR at a directory with room for 3 times the archive",
    run_program=RunProgram("podman", "Podman", ("--pull=never",)),
    absent_advice="install podman from the OS media, and check `podman info` as this user")


class Podman:
    """The operations load, inventory and doctor need of Podman (runtime.Runtime); errors are DaemonError."""

    traits: Traits = TRAITS

    def __init__(self, timeout: Optional[float] = LOAD_TIMEOUT, staging_dir: str = "/var/tmp", quick: float = QUICK,
                 create: bool = True, env: Optional[Dict[str, str]] = None):
        self.timeout = timeout or LOAD_TIMEOUT
        self.quick = quick  # a listing, an inspect, `podman info`
        self.staging_dir = staging_dir  # where podman load would copy a piped archive ($TMPDIR, else /var/tmp)
        self.podman = Program(["podman"], "Podman", install_hint=INSTALL_HINT)
        # Every podman command but `--version` opens containers/storage first (podman's root command sets up its
        # runtime before any subcommand runs), and opening it makes the graphroot, runroot and their lock files:
        # `podman info` (and `podman version`) on a host where Podman never ran create /var/lib/containers/storage.
        # Asked not to create (doctor), a storage that storage.conf says is not there yet is left unmade.
        self.unmade = None if create else _unmade_storage(env or {}, os.geteuid())
        self._info = self._read_info() if self.unmade is None else self._version_only(*self.unmade)
        self._removing: List[threading.Thread] = []  # staged copies being unlinked (load_archive)

    def close(self) -> None:
        """Wait for the staged copies' removal (a process that exits waits for it as well)."""
        for thread in self._removing:
            thread.join()
        self._removing = []

    def __enter__(self) -> "Podman":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _json(self, args: List[str], what: str = "") -> Any:
        text = self.podman.run(args, timeout=self.quick, what=what)
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

    def _version_only(self, root: str, driver: str) -> dict:
        """What `podman --version` (which opens no storage) and storage.conf say, in `podman info`'s shape."""
        try:
            text = self.podman.run(["--version"], timeout=self.quick, what="--version")
        except ProgramFailed as e:
            raise DaemonError(f"cannot use Podman: {e.output}", hint="check `podman --version` as this user") from e
        version = text.strip().rsplit(" ", 1)[-1] if text.strip() else "unknown"
        return {"version": {"Version": version}, "store": {"graphRoot": root, "graphDriverName": driver or "overlay"}}

    def info(self) -> RuntimeInfo:
        from ..model import Platform

        host = self._info.get("host") or {}
        store = self._info.get("store") or {}
        version = self._info.get("version") or {}
        arch = Platform.from_json({"architecture": str(host.get("arch") or "")}).architecture
        return RuntimeInfo(traits=TRAITS, host="podman", version=str(version.get("Version") or "unknown"),
                           api_version=str(version.get("APIVersion") or ""),
                           driver=str(store.get("graphDriverName") or "unknown"),
                           root_dir=str(store.get("graphRoot") or ""), arch=arch or Platform.host().architecture,
                           os=str(host.get("os") or "linux"), local=True, image_store="containers-storage",
                           runtime="podman", staging_dir=self.staging_dir, staged_by_others=self._staged_by_others(),
                           reports_applied_diff_ids=self._records_readable(), unmade=self.unmade is not None)

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
        if self.unmade is not None:
            return {}  # no storage: no image, and `podman images` would make the storage
        out = {}
        for entry in self._json(["images", "--all", "--format", "json"], "images") or []:
            image_id = _sha(entry.get("Id"))
            names = tuple(n for n in entry.get("Names") or () if n)
            out[image_id] = ImageInfo(image_id, names, "", "", None, int(entry.get("Size") or 0))
        return out

    def _record_paths(self) -> Optional[Tuple[str, List[str]]]:
        """Where containers/storage keeps its records: (images.json, [layers.json, volatile-layers.json]);
        None when `podman info` names no storage root and driver."""
        store = self._info.get("store") or {}
        root, run_root, driver = (str(store.get(k) or "") for k in ("graphRoot", "runRoot", "graphDriverName"))
        if not root or not driver:
            return None
        layers = [os.path.join(root, f"{driver}-layers", "layers.json")]
        if run_root:
            layers.append(os.path.join(run_root, f"{driver}-layers", "volatile-layers.json"))
        return os.path.join(root, f"{driver}-images", "images.json"), layers

    def _records_readable(self) -> bool:
        """The storage's records can be read here (this user's storage, a known layout): a look at its root,
        not a read of the records, which load reads once, after the load."""
        paths = self._record_paths()
        return paths is not None and os.access(os.path.dirname(os.path.dirname(paths[0])), os.R_OK | os.X_OK)

    def _storage_records(self) -> Optional[Tuple[List[dict], Dict[str, dict]]]:
        """containers/storage's own records: its images (each with its top layer) and its layers (each with its
        parent and the `diff-digest` it computed while applying the layer); None when they cannot be read
        here (another user's storage, another layout)."""
        paths = self._record_paths()
        if paths is None:
            return None
        try:
            with open(paths[0], encoding="utf-8") as f:
                images = json.load(f)
            layers: Dict[str, dict] = {}
            for path in paths[1]:
                if os.path.exists(path):
                    with open(path, encoding="utf-8") as f:
                        layers.update((str(x.get("id")), x) for x in json.load(f) if isinstance(x, dict))
        except FileNotFoundError:
            return [], {}  # nothing stored yet: the files appear with the first image
        except (OSError, ValueError, TypeError, AttributeError):
            return None
        if not isinstance(images, list):
            return None
        return [x for x in images if isinstance(x, dict)], layers

    def incomplete(self, image_id: str, diff_ids: Sequence[str]) -> Optional[Unfinished]:
        """None: Podman records an image only once its layers are in place."""
        return None

    def finish(self, image_id: str) -> None:
        """Nothing to finish: see incomplete."""

    def pin(self, image_id: str) -> bool:
        """False: no kubelet reads Podman's images through a CRI that honours a pin."""
        return False

    def held_blobs(self, digests: Iterable[Digest]) -> FrozenSet[Digest]:
        """None: Podman keeps no blob by its digest that an archive could leave out (traits.reuses_blobs)."""
        return frozenset()

    def blob_head(self, digest: str, limit: int) -> Optional[bytes]:
        """None: Podman keeps no manifest's layers as blobs (inventory reads no modelcar's files here)."""
        return None

    def applied_diff_ids(self, image_id: str) -> Optional[List[str]]:
        """The diff_ids Podman's storage computed while it applied the image's layers, bottom first (its
        layers.json `diff-digest`: the content's, not the config's word); None when not known."""
        records = self._storage_records()
        if records is None:
            return None
        images, layers = records
        wanted = image_id.split(":")[-1]
        top = next((str(x.get("layer") or "") for x in images if x.get("id") == wanted), "")
        chain: List[str] = []
        while top:
            layer = layers.get(top)
            if layer is None or len(chain) > 1000:
                return None
            chain.append(str(layer.get("diff-digest") or ""))
            top = str(layer.get("parent") or "")
        chain.reverse()
        return chain if chain and all(chain) else None

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

    def load_archive(self, chunks: Iterable[bytes], platforms: Tuple[str, ...] = (), *,
                     images: Sequence[Tuple[str, str]] = ()) -> List[str]:
        """`podman load -i` of the tar stream, written whole to a directory of this load's own in the staging dir
        first (the copy podman itself would make of a pipe), so podman runs only when every chunk came; podman
        runs with that directory as its TMPDIR, so its own temporaries (it unpacks the archive into an oci*
        directory there, and stages layers in a storage* one) are this load's too. The directory is removed
        after, whatever happened; what a load killed midway left is removed by the next (remove_debris).
        Raises LayerRefused (Podman 5 refused a layer that is not its diff_id), DaemonError, or what the chunks
        raised (then podman never ran)."""
        try:
            work = tempfile.mkdtemp(prefix=f"{STAGED_PREFIX}{os.getpid()}-", dir=self.staging_dir)
        except OSError as e:
            raise DaemonError(f"cannot stage the archive for podman load in {self.staging_dir}: {e.strerror or e}",
                              hint="podman load needs the archive's size free there; set TMPDIR to another "
                                   "directory") from e
        path = os.path.join(work, "archive.tar")
        try:
            try:
                with open(path, "xb") as f:
                    for chunk in chunks:
                        f.write(chunk)
            except OSError as e:
                raise DaemonError(f"cannot stage the archive for podman load in {self.staging_dir}: "
                                  f"{e.strerror or e}", hint="podman load needs the archive's size free there; set "
                                                             "TMPDIR to another directory") from e
            from ..config import tool_environment

            podman = Program(["podman"], "Podman", env=_load_env(tool_environment(), work, os.geteuid()),
                             install_hint=INSTALL_HINT)
            try:
                return podman.run(["load", "--input", path], timeout=self.timeout, what="load").splitlines()
            except ProgramFailed as e:
                refused = _refused_layer(e)
                if refused is None:
                    raise
                raise refused from e
        finally:
            # on a thread of its own: freeing an archive-sized file's blocks took 0.2-0.4 s for 1.6 GB, which the
            # checks and tags after the load now overlap (docs/benchmarks.md, "Podman's load, the staged copy"); one
            # that cannot be removed is left to the next load's remove_debris (this pid is gone by then)
            remover = threading.Thread(target=_remove, args=(work,), name="staged-copy-unlink")
            remover.start()
            self._removing.append(remover)

    def _staged(self) -> List[Tuple[str, int, int]]:
        """(path, bytes, pid) of everything imgtool loads staged in the staging dir that is this user's: each
        load's directory (the archive copy and Podman's temporaries), and the bare archive copies earlier versions
        of imgtool staged (imgtool-load-<pid>-<random>.tar)."""
        found = []
        try:
            names = os.listdir(self.staging_dir)
        except OSError:
            return []
        for name in names:
            m = _STAGED.match(name)
            if not m:
                continue
            path = os.path.join(self.staging_dir, name)
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if st.st_uid != os.geteuid():
                continue
            if stat.S_ISREG(st.st_mode) and m.group(2):
                found.append((path, st.st_size, int(m.group(1))))
            elif stat.S_ISDIR(st.st_mode) and not m.group(2):
                found.append((path, tree_size(path), int(m.group(1))))
        return sorted(found)

    def _staged_by_others(self) -> Tuple[Tuple[str, int], ...]:
        return tuple((path, size) for path, size, pid in self._staged() if pid != os.getpid() and process_alive(pid))

    def debris(self) -> List[Debris]:
        """What earlier loads left in the staging dir when they were killed (their pid gone): the archive copy and
        Podman's own temporaries, with their size. Another live load's is never counted."""
        return [Debris(f"{path} ({format_size(size)}), {_left(path)} (pid {pid})", "the next imgtool load removes it",
                       size) for path, size, pid in self._staged() if not process_alive(pid)]

    def remove_debris(self) -> List[str]:
        """That debris removed (the file this user's, its pid gone); a line for each. Another live load's is never
        touched."""
        removed = []
        for path, size, pid in self._staged():
            if process_alive(pid) or not _remove(path):
                continue
            removed.append(f"removed {path} ({format_size(size)}), {_left(path)} (pid {pid})")
        return removed

    def left_behind(self) -> str:
        """Nothing it could not look at: a failed load's directory is removed by the load itself."""
        return ""

    # --- imgtool run / run-flags ----------------------------------------------------------------

    def local_tags(self, repository: str) -> List[str]:
        """Tags of `repository` in Podman's storage, sorted; raises DaemonError."""
        return tags_of(self.images_by_id().values(), repository)

    def _exists(self, *args: str) -> bool:
        return self.podman.status(list(args), timeout=self.quick) == 0

    def mounts_images(self) -> bool:
        """`podman run --mount type=image` (read-only unless rw=true): every Podman imgtool supports has it."""
        return True

    def has_image(self, ref: str) -> bool:
        """Whether Podman's storage holds an image by this name; raises DaemonError."""
        return self.unmade is None and self._exists("image", "exists", ref)

    def arch_warning(self, ref: str) -> Optional[str]:
        """The warning run/run-flags give when the local image `ref` is for another architecture than this
        host's; None when it fits or is not there. Raises DaemonError."""
        if not self._exists("image", "exists", ref):
            return None
        docs = self._inspect([ref])
        if not docs or not docs[0].get("Architecture"):
            return None
        return foreign_arch_warning(ref, _image(docs[0]).platform, self.info().arch, host="Podman")

    def run_container(self, spec: "ContainerSpec", argv_for: Callable[[bool], List[str]]) -> Tuple[int, str]:
        """Start `spec` with `podman run` and follow it: (its exit code, or 0 when detached; the container).
        `argv_for(interactive)` renders its `podman run` (presets.run.render_argv: this room renders nothing).

        The image must already be in Podman's storage (imgtool never pulls; the command says
        --pull=never too). Foreground: the terminal is podman's, so a session on a terminal is
        `podman run -it`, and podman's exit code is returned (the container's, or 125 when podman
        itself failed, after its `Error:` line). Raises UsageError when the image is not there,
        DaemonError when podman refuses, ImgtoolError when a cache directory cannot be made.
        """
        if not self._exists("image", "exists", spec.image):
            raise UsageError(f"image {spec.image} is not loaded in Podman",
                             hint="load it first (imgtool load BUNDLE_DIR), or check the name with `podman images`")
        if spec.name and self._exists("container", "exists", spec.name):
            raise DaemonError(f"a container named {spec.name} already exists",
                              hint=f"pass --name NEW_NAME, or remove the old one: podman rm -f {spec.name}")
        _make_cache_dirs(spec)
        interactive = bool(spec.interactive and not spec.detach and sys.stdin.isatty() and sys.stdout.isatty())
        argv = argv_for(interactive)
        if spec.detach:
            try:
                out = self.podman.run(argv[1:], timeout=START_TIMEOUT, what="run")
            except ProgramFailed as e:
                raise DaemonError(f"Podman refused to start the container: {one_line(e.output)}") from e
            return 0, spec.name or out.strip()[:12]
        return self._follow(argv[1:], spec.name), spec.name or ""

    def _follow(self, args: List[str], name: Optional[str]) -> int:
        """podman run in the foreground with our stdin, stdout and stderr; its exit code. On Ctrl-C or
        SIGTERM the container is stopped (STOP_GRACE), podman is waited for, and KeyboardInterrupt re-raised."""
        import signal
        import threading

        sys.stdout.flush()
        sys.stderr.flush()
        proc = self.podman.start(args)
        old = None
        if threading.current_thread() is threading.main_thread():
            def on_term(signum: int, frame: object) -> None:
                raise KeyboardInterrupt

            old = signal.signal(signal.SIGTERM, on_term)
        try:
            return proc.wait()  # no timeout: the container runs as long as its user wants
        except KeyboardInterrupt:
            self._stop(proc, name)
            raise
        finally:
            if old is not None:
                signal.signal(signal.SIGTERM, old)

    def _stop(self, proc: Process, name: Optional[str]) -> None:
        """Stop the container of a foreground `podman run` (by name; else podman itself), then wait for podman."""
        try:
            if name:
                self.podman.run(["stop", "-t", str(STOP_GRACE), name], timeout=STOP_GRACE + self.quick, what="stop")
            else:
                proc.terminate()  # podman passes the signal on to the container (--sig-proxy)
            proc.wait(timeout=STOP_GRACE + self.quick)
        except (DaemonError, ProcessTimeout):  # podman stop failed or podman did not end: it must not outlive us
            proc.kill()
            proc.wait()

    def inventory(self) -> list:
        """Every image with its layers: [delta.InventoryImage]; raises DaemonError."""
        from ..delta import InventoryImage
        from ..errors import UsageError
        from ..model import Digest

        ids = sorted(self.images_by_id())  # none while the storage is unmade
        out = []
        for d in self._inspect(ids) if ids else []:
            try:
                diff_ids = tuple(Digest.parse(x) for x in (d.get("RootFS") or {}).get("Layers") or [])
            except (UsageError, TypeError, AttributeError):
                continue
            image = _image(d)
            out.append(InventoryImage(image.id, image.tags, image.platform, diff_ids))
        return out


_CONF_TABLE = re.compile(r"^\s*\[\s*([A-Za-z0-9_.-]+)\s*\]\s*(?:#.*)?$")
_CONF_KEY = re.compile(r"""^\s*([A-Za-z0-9_]+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|'([^']*)')\s*(?:#.*)?$""")


def _storage_conf(path: str) -> Optional[Dict[str, str]]:
    """The string keys of storage.conf's [storage] table (graphroot, driver, rootless_storage_path), read as
    containers/storage's TOML would for these plain keys; None when the file is not there or not readable."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read(1 << 20).splitlines()
    except (OSError, UnicodeDecodeError):
        return None
    out: Dict[str, str] = {}
    table = ""
    for line in lines:
        m = _CONF_TABLE.match(line)
        if m:
            table = m.group(1)
            continue
        m = _CONF_KEY.match(line)
        if m and table == "storage":
            value = m.group(2) if m.group(2) is not None else m.group(3)
            out[m.group(1)] = value.replace('\\"', '"').replace("\\\\", "\\") if m.group(2) is not None else value
    return out


def _unmade_storage(env: Dict[str, str], euid: int) -> Optional[Tuple[str, str]]:
    """(graphroot, driver) when the storage Podman would open for this user is not there yet, as containers/storage
    finds it (CONTAINERS_STORAGE_CONF; rootless: $XDG_CONFIG_HOME/containers/storage.conf, else the system file's
    rootless_storage_path, else $XDG_DATA_HOME/containers/storage; root: /etc/containers/storage.conf, else
    /usr/share/containers/storage.conf, else /var/lib/containers/storage); None when it is there."""
    import pwd

    try:
        home = pwd.getpwuid(euid).pw_dir
    except KeyError:
        home = "/"
    system = _storage_conf("/etc/containers/storage.conf")
    if system is None:
        system = _storage_conf("/usr/share/containers/storage.conf")
    own_path = env.get("CONTAINERS_STORAGE_CONF") or (
        os.path.join(env.get("XDG_CONFIG_HOME") or os.path.join(home, ".config"), "containers", "storage.conf")
        if euid != 0 else "")
    own = _storage_conf(own_path) if own_path else None
    conf = own if own is not None else (system or {})
    if euid == 0:
        root = conf.get("graphroot") or "/var/lib/containers/storage"
    elif own is not None and own.get("graphroot"):
        root = own["graphroot"]
    else:
        data = env.get("XDG_DATA_HOME") or os.path.join(home, ".local", "share")
        root = (system or {}).get("rootless_storage_path") or os.path.join(data, "containers", "storage")
        for name, value in (("$HOME", home), ("$UID", str(euid))):
            root = root.replace(name, value)
    return None if os.path.isdir(root) else (root, conf.get("driver") or "")


def _make_cache_dirs(spec: "ContainerSpec") -> None:
    """The preset's own directories (`create`: /root/.cache), made when absent: Docker makes a missing
    bind-mount source, podman refuses with `statfs ...: no such file or directory`."""
    for mount in spec.mounts:
        if mount.create and not os.path.lexists(mount.host):
            try:
                os.makedirs(mount.host, exist_ok=True)
            except OSError as e:
                raise ImgtoolError(f"cannot create {mount.host} for the container: {(e.strerror or str(e)).lower()}",
                                   hint=f"create it yourself (mkdir -p {mount.host}), or run as root") from e


def _sha(value: object) -> str:
    text = str(value or "")
    return text if text.startswith("sha256:") else "sha256:" + text


def _image(d: dict) -> ImageInfo:
    return ImageInfo(_sha(d.get("Id")), tuple(t for t in d.get("RepoTags") or () if t), str(d.get("Os") or ""),
                     str(d.get("Architecture") or ""), d.get("Variant") or None, int(d.get("Size") or 0))


def _load_env(env: Mapping[str, str], work: str, euid: int) -> Dict[str, str]:
    """The environment `podman load` runs in: this one, with TMPDIR this load's own directory (where Podman puts
    the archive it unpacks and the layers it stages). Rootless Podman with no XDG_RUNTIME_DIR and no
    /run/user/<uid> of its own would place its runtime directory and containers/storage's run root under TMPDIR
    (podman-run-<uid>, storage-run-<uid>): there TMPDIR is left as it is, and Podman's temporaries go where they
    went before (the staging dir), not into the load's directory."""
    out = dict(env)
    if euid != 0 and not env.get("XDG_RUNTIME_DIR"):
        try:
            st = os.stat(f"/run/user/{euid}")
            own = st.st_uid == euid and stat.S_ISDIR(st.st_mode) and st.st_mode & 0o700 == 0o700
        except OSError:
            own = False
        if not own:
            return out
    out["TMPDIR"] = work
    return out


# Podman 5 checks each layer of a docker-archive against its config's diff_id while it copies it (4.3 does not): a
# layer that differs fails the load (exit 125) with this among the reasons of every format it tried, one a line
# (`* docker-archive: ... Digest did not match, expected sha256:<diff_id>, got sha256:<content's>`), and its last
# line is another format's (`* dir: ... not a directory`)
_DIGEST_REFUSED = re.compile(r"^\*\s*docker-archive:.*\bDigest did not match, expected (sha256:[0-9a-f]{64}), "
                             r"got (sha256:[0-9a-f]{64})")


def _refused_layer(e: ProgramFailed) -> Optional[LayerRefused]:
    """Podman's refusal of a layer that is not its diff_id, read from `podman load`'s reasons; None for another
    failure. The archive's bytes were checked on the way in, so the layer's content is as the bundle has it."""
    for line in e.said:
        m = _DIGEST_REFUSED.match(line)
        if m:
            return LayerRefused(f"Podman refused a layer whose content is not its diff_id {m.group(1)[:19]}",
                                diff_id=m.group(1), found=m.group(2))
    return None


def _left(path: str) -> str:
    return _LEFT_COPY if path.endswith(".tar") else _LEFT



def _remove(path: str) -> bool:
    """Remove a file or a directory tree (never following a link out of it); True when it is gone."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
        return not os.path.lexists(path)
    return remove_quietly(path)


# --- what a node's Podman needs to pull from `imgtool serve` (nodeconfig.py asks each room) ----------------------

PODMAN_DROP_IN = "/etc/containers/registries.conf.d/imgtool-serve.conf"


def mirror_part(mirror: Mirror) -> RuntimePart:
    """A registries.conf.d drop-in naming serve as each registry's mirror (and the CA under TLS)."""

    entries = [f"[[registry]]\nprefix = {toml_string(registry)}\nlocation = {toml_string(registry)}\n\n"
               f"[[registry.mirror]]\nlocation = {toml_string(mirror.address)}\n" + ("" if mirror.tls else "insecure = true\n")
               for registry in mirror.registries]
    files = [NodeFile(PODMAN_DROP_IN, "\n".join(entries))] if entries else []
    ca_path = f"/etc/containers/certs.d/{mirror.address}/ca.crt"
    if mirror.tls and mirror.ca_pem is not None:
        files.append(NodeFile(ca_path, mirror.ca_pem))
    notes = ("images keep their names; `podman pull quay.io/...` asks the mirror first (Podman 2.1+ reads "
             "registries.conf.d; an older one: append the same lines to /etc/containers/registries.conf)",)
    return RuntimePart("podman", "Podman, Buildah, CRI-O, skopeo (containers-registries.conf(5))", tuple(files), notes,
                       ca_path)
