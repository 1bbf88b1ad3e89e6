#!/usr/bin/env python3
"""Side-by-side benchmarks: imgtool against the ways users move vllm-ascend images today.

One run, one image, every tool on the same bytes, alternating and repeated (median of --runs):

  fetch        imgtool fetch --arch arm64 (fresh cache) vs skopeo copy to oci: and docker-archive:,
               the FAQ recipe (docker pull --platform linux/arm64 + docker save | gzip), and the raw
               limit (curl, every blob at once, straight to disk)
  verify       imgtool verify (full and --quick) vs sha256sum -c SHA256SUMS
  load         imgtool load vs docker load -i of the same archive (image removed between runs)
  constrained  the same fetches through a proxy that limits each TCP connection to --rate MB/s
  over-download  bytes a proxy in front of the registry sent for imgtool fetch, against the blob
               bytes: cold, and SIGKILL halfway + rerun; on loopback and on the constrained link
  memory       peak RSS of every imgtool command at two image sizes
  serve        1, 4 and 8 concurrent `skopeo copy … oci:` pulls from `imgtool serve` of the fetched bundle
               against the same image in the distribution registry; the server's CPU and peak RSS
  delta        imgtool fetch of the next release with --base the first one's bundle: its bytes
               against the full bundle's

The image is shaped like vllm-ascend (17 gzip layers, one CANN-like layer holding ~40 % of the
bytes, ~2.3:1) and generated from --seed at --scale by scripts/benchimage.py (never host files;
the same tars on every machine), with its zstd twin and its next release (top layers changed),
streamed to disk (memory does not grow with --scale) and cached in --work-dir by seed and scale;
then pushed to a local distribution registry as a two-arch manifest list. The disk the run needs
is checked first (the run is refused, naming what it needs and what is free).

    scripts/bench.py                        # --scale 0.25: ~1.6 GB gzip; starts its own services, writes docs/benchmarks.md
    scripts/bench.py --scale 1              # the real size (~6.5 GB gzip, ~15 GB unpacked): once per round
    scripts/bench.py --quick --output x.md  # tiny image, one run: seconds (CI keeps it working)

Services: with every IMGTOOL_TEST_* variable set (eval "$(scripts/services.sh env)") the running
ones are used; otherwise `scripts/services.sh up` runs with IMGTOOL_SERVICES_DIR=--services-dir and
`down` at the end. Not product code: imgtool/ never imports it.
"""

import argparse
import json
import os
import platform
import secrets
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import requests

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchimage  # noqa: E402  (scripts/ is not a package)
from imgtool.puller import JOBS as IMGTOOL_JOBS  # noqa: E402  (fetch's connections per source: the link's floor)

ROOT = Path(__file__).resolve().parent.parent
MiB = 1024 * 1024
MB = 1000 * 1000
DOCKER_MANIFEST = benchimage.DOCKER_MANIFEST
DOCKER_LIST = benchimage.DOCKER_LIST
QUICK_SCALE = 0.0005  # --quick: ~7.5 MB unpacked, the same 17 layers (checks the script, not speed)


_T0 = time.monotonic()


def log(msg: str) -> None:
    print(f"bench: [{time.monotonic() - _T0:6.1f}s] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# running commands


class Result:
    def __init__(self, seconds: float, rss_kb: int, rc: int, out: str):
        self.seconds, self.rss_kb, self.rc, self.out = seconds, rss_kb, rc, out


TIME = "/usr/bin/time"


def run(cmd, env=None, cwd=None, shell=False, check=True, rss=False) -> Result:
    """Run a command; its wall time and, with rss, its peak RSS in KiB.

    The peak comes from GNU time (`%M`), not from this process's wait4: Linux folds the forking
    parent's high-water mark into a child's ru_maxrss across exec, which would report this
    script's own memory. Without /usr/bin/time, /proc/PID/status VmHWM is polled instead.
    """
    rss_file = None
    if rss and not shell and os.path.exists(TIME):
        rss_file = Path(f"/tmp/.bench-rss-{os.getpid()}")
        cmd = [TIME, "-f", "%M", "-o", str(rss_file)] + list(cmd)
    t0 = time.monotonic()
    with open(os.devnull, "rb") as devnull:
        p = subprocess.Popen(cmd, env=env, cwd=cwd, shell=shell, stdin=devnull,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             executable="/bin/bash" if shell else None)
    out_chunks = []
    reader = threading.Thread(target=lambda: out_chunks.append(p.stdout.read()), daemon=True)
    reader.start()
    hwm = 0
    while rss and rss_file is None and p.poll() is None:
        try:
            for line in open(f"/proc/{p.pid}/status"):
                if line.startswith("VmHWM:"):
                    hwm = max(hwm, int(line.split()[1]))
        except (OSError, ValueError):
            pass
        time.sleep(0.02)
    p.wait()
    seconds = time.monotonic() - t0
    reader.join()
    if rss_file is not None:
        try:
            hwm = int(rss_file.read_text().split()[-1])
        except (OSError, ValueError, IndexError):
            hwm = 0
        rss_file.unlink(missing_ok=True)
    usage_kb = hwm
    out = b"".join(out_chunks).decode("utf-8", "replace")
    if check and p.returncode != 0:
        shown = cmd if isinstance(cmd, str) else " ".join(map(str, cmd))
        raise RuntimeError(f"{shown} exited {p.returncode}:\n{out[-3000:]}")
    return Result(seconds, usage_kb, p.returncode, out)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far (/proc/PID/stat)."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def proc_status(pid: int, key: str) -> int:
    """A kB value of /proc/PID/status (VmHWM, VmRSS)."""
    for line in open(f"/proc/{pid}/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def listener_pid(port: int) -> Optional[int]:
    """The process listening on a loopback TCP port (the registry), found through /proc; None when not ours to see."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = open(table).read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            f = row.split()
            if f[3] == "0A" and int(f[1].rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                inodes.add(f[9])
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:[") and link[8:-1] in inodes:
                    return int(pid)
        except OSError:
            continue
    return None


def imgtool_cmd() -> List[str]:
    exe = Path(sys.executable).with_name("imgtool")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "imgtool"]


def version_of(cmd: Sequence[str]) -> str:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=20).stdout.strip()
        return out.splitlines()[0] if out else "?"
    except (OSError, subprocess.TimeoutExpired):
        return "not installed"


# ---------------------------------------------------------------------------------------------
# services


class Env:
    """Where the registry and the dockerds are (engines: name -> docker host, from IMGTOOL_TEST_ENGINES)."""

    def __init__(self, registry: str, docker_host: str, engines: str = "", containerds: str = "", podman: str = "",
                 podmans: str = ""):
        self.registry, self.docker_host = registry, docker_host
        self.engines = dict(item.split("=", 1) for item in engines.split() if "=" in item)
        self.containerds = dict(item.split("=", 1) for item in containerds.split() if "=" in item)  # version -> socket
        # version -> the private podman's directory (bin/podman, storage.conf, containers.conf): 4.3, and 5.8 when
        # the services run it (IMGTOOL_TEST_PODMANS); IMGTOOL_TEST_PODMAN alone is 4.3's
        self.podmans = dict(item.split("=", 1) for item in podmans.split() if "=" in item)
        if podman and not self.podmans:
            self.podmans = {"4.3": podman}


# The other engines of the test matrix, whose load is measured against their own `docker load`:
# engine name -> (row key prefix, task name). The first engine (20.10) is the "load" task itself.
ENGINE_LOADS = {"26.1": ("load26", "load (Docker 26.1)"),
                "26.1-containerd": ("load26c", "load (Docker 26.1, containerd store)"),
                "28.5": ("load28", "load (Docker 28.5)")}


@contextmanager
def services(args):
    names = ("IMGTOOL_TEST_REGISTRY_PLAIN", "IMGTOOL_TEST_DOCKER_HOST")
    if not args.own_services and all(os.environ.get(n) for n in names):
        log(f"using the running test services (registry {os.environ[names[0]]})")
        yield Env(os.environ[names[0]], os.environ[names[1]], os.environ.get("IMGTOOL_TEST_ENGINES", ""),
                  os.environ.get("IMGTOOL_TEST_CONTAINERDS", ""), os.environ.get("IMGTOOL_TEST_PODMAN", ""),
                  os.environ.get("IMGTOOL_TEST_PODMANS", ""))
        return
    sdir = args.services_dir
    env = dict(os.environ, IMGTOOL_SERVICES_DIR=sdir)
    script = str(ROOT / "scripts" / "services.sh")
    log(f"starting services in {sdir}")
    subprocess.run(["bash", script, "up"], env=env, check=True)
    try:
        values = {}
        for line in Path(sdir, "env.sh").read_text().splitlines():
            if line.startswith("export "):
                k, _, v = line[len("export "):].partition("=")
                values[k] = v.strip("'\"")
        yield Env(values[names[0]], values[names[1]], values.get("IMGTOOL_TEST_ENGINES", "").replace("\\ ", " "),
                  values.get("IMGTOOL_TEST_CONTAINERDS", "").replace("\\ ", " "), values.get("IMGTOOL_TEST_PODMAN", ""),
                  values.get("IMGTOOL_TEST_PODMANS", "").replace("\\ ", " "))
    finally:
        log("stopping services")
        subprocess.run(["bash", script, "down"], env=env, check=False)


# ---------------------------------------------------------------------------------------------
# the test image: generated from a seed (scripts/benchimage.py), streamed to files, cached


def build_image(work: Path, scale: float, seed: str, level: int = 6, full: bool = True) -> dict:
    """The vllm-ascend-shaped two-arch image at `scale`, its zstd twin and its next release; cached by
    seed and scale in `work` (see benchimage.py)."""
    got = benchimage.cached(work, seed, scale, level, full)
    if got is not None:
        return got
    t0 = time.monotonic()
    meta = benchimage.build(work, seed, scale, level, full=full)
    log(f"  generated {seed} at scale {scale:g} in {time.monotonic() - t0:.0f}s")
    return meta


def _free(path: Path) -> Tuple[int, int]:
    """(device, free bytes) of the file system holding `path` (or its nearest existing parent)."""
    while not path.exists() and path.parent != path:
        path = path.parent
    st = os.statvfs(path)
    return os.stat(path).st_dev, st.f_bavail * st.f_frsize


Need = Tuple[str, int, Path]  # what, bytes, where


def disk_plan(args, big: Tuple[str, float], small: Tuple[str, float], work: Path,
              services_dir: Path) -> Tuple[List[Need], List[List[Need]]]:
    """What a run writes, by place, before it writes it: what stays the whole run, and the phases,
    of which one at a time holds its bytes.

    Staying: the images not yet cached (the big one with its zstd twin and next release, the small
    one gzip only: work dir), their copies in the registry (services dir), the kept bundle. Phases:
    a fetch of the zstd twin rewriting it (its blobs, the gzip rewrite, the bundle); a runtime
    holding the image (Docker stages the archive under <root>/tmp and unpacks it; containerd keeps
    the blobs and unpacks them: services dir); an export (Docker holding the image, the gzip layers
    in the cache, the bundle)."""
    stay: List[Need] = []
    for (seed, scale), full in ((big, True), (small, False)):
        b = benchimage.planned_bytes(scale)
        blobs = b["gzip"] + (b["zstd"] + b["next"] if full else 0)
        if benchimage.cached(work, seed, scale, args.gzip_level, full) is None:
            stay.append((f"the generated image at scale {scale:g}", blobs, work))
        stay.append((f"its copy in the registry (scale {scale:g})", blobs, services_dir))
    b = benchimage.planned_bytes(big[1])
    stay.append(("the kept bundle", b["gzip"], work))
    phases = [[("a fetch of the zstd twin with --layers compat (cache, rewrite, bundle)", b["zstd"] + 2 * b["gzip"], work)],
              [("a runtime loading the image (staged archive + unpacked layers)", b["gzip"] + b["unpacked"], services_dir)],
              [("Docker holding the image for export", b["unpacked"], services_dir),
               ("the export's cache and bundle", 2 * b["gzip"], work)]]
    return stay, phases


def _size(n: int) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e9 else f"{n / 1e6:.0f} MB"


def check_disk(stay: Sequence[Need], phases: Sequence[Sequence[Need]]) -> None:
    """Refuse the run before anything is written when a file system lacks what the plan puts on it:
    per file system, what stays plus its biggest phase (several places on one file system count together)."""
    dev_of: Dict[Path, int] = {}
    free: Dict[int, int] = {}
    for _, _, where in list(stay) + [x for ph in phases for x in ph]:
        dev_of[where], free[dev_of[where]] = _free(where)
    short = []
    for dev in free:
        mine = [x for x in stay if dev_of[x[2]] == dev]
        peak = max(([x for x in ph if dev_of[x[2]] == dev] for ph in phases), key=lambda xs: sum(n for _, n, _ in xs))
        items = mine + peak
        total = sum(n for _, n, _ in items)
        if total > free[dev]:
            regions = sorted({str(w) for _, _, w in items})
            short.append(f"{_size(total)} needed on the file system of {' and '.join(regions)}, {_size(free[dev])} free ("
                         + "; ".join(f"{what}: {_size(n)}" for what, n, _ in items) + ")")
    if short:
        raise SystemExit("bench: not enough disk for this run: " + "; ".join(short)
                         + "\nbench: free space there, point --work-dir/--services-dir elsewhere, or use a smaller --scale")


def _json(obj) -> bytes:
    return json.dumps(obj, indent=3).encode()


def push_image(registry: str, repo: str, tag: str, meta: dict) -> None:
    base = f"http://{registry}/v2/{repo}"
    blobs = Path(meta["dir"]) / "blobs"
    s = requests.Session()
    s.trust_env = False
    for im in meta["images"].values():
        for digest in [im["config"]] + [x["digest"] for x in im["layers"]]:
            if s.head(f"{base}/blobs/{digest}").status_code == 200:
                continue
            r = s.post(f"{base}/blobs/uploads/")
            r.raise_for_status()
            loc = r.headers["Location"]
            loc = loc if "://" in loc else f"http://{registry}{loc}"
            with open(blobs / digest.split(":")[1], "rb") as fh:
                r = s.put(f"{loc}{'&' if '?' in loc else '?'}digest={digest}", data=fh,
                          headers={"Content-Type": "application/octet-stream"})
            r.raise_for_status()
        mbytes = (blobs / im["manifest"].split(":")[1]).read_bytes()
        s.put(f"{base}/manifests/{im['manifest']}", data=mbytes,
              headers={"Content-Type": DOCKER_MANIFEST}).raise_for_status()
    lbytes = (blobs / meta["index"].split(":")[1]).read_bytes()
    s.put(f"{base}/manifests/{tag}", data=lbytes, headers={"Content-Type": DOCKER_LIST}).raise_for_status()


OCI_MANIFEST = benchimage.OCI_MANIFEST


def build_zstd_twin(meta: dict) -> dict:
    """The arm64 image as a builder that switched to zstd publishes it: the same config (image ID) and
    tars, every layer zstd (level 3) in an OCI manifest; made in the same pass as the gzip image."""
    return meta["zstd"]


def next_release(meta: dict) -> dict:
    """The next release's image (its top layers changed, the CANN layer and the rest shared) as a meta
    push_image takes."""
    return dict(meta, index=meta["next"]["index"], images=meta["next"]["images"])


def push_zstd(registry: str, repo: str, meta: dict, z: dict) -> None:
    base = f"http://{registry}/v2/{repo}"
    blobs = Path(meta["dir"]) / "blobs"
    s = requests.Session()
    s.trust_env = False
    for digest in [z["config"]] + [x["digest"] for x in z["layers"]]:
        r = s.post(f"{base}/blobs/uploads/")
        r.raise_for_status()
        loc = r.headers["Location"]
        loc = loc if "://" in loc else f"http://{registry}{loc}"
        with open(blobs / digest.split(":")[1], "rb") as fh:
            s.put(f"{loc}{'&' if '?' in loc else '?'}digest={digest}", data=fh,
                  headers={"Content-Type": "application/octet-stream"}).raise_for_status()
    mbytes = (blobs / z["manifest"].split(":")[1]).read_bytes()
    s.put(f"{base}/manifests/v1", data=mbytes, headers={"Content-Type": OCI_MANIFEST}).raise_for_status()


def arm(meta: dict) -> dict:
    return meta["images"]["arm64"]


def compressed_size(meta: dict) -> int:
    im = arm(meta)
    return im["config_size"] + sum(x["size"] for x in im["layers"])


def unpacked_size(meta: dict) -> int:
    return sum(x["unpacked"] for x in arm(meta)["layers"])


# ---------------------------------------------------------------------------------------------
# a per-connection rate limit (the constrained link)


PROXY_CHUNK = 256 * 1024  # 13 ms at 20 MB/s: fewer wake-ups, the same rate
F_SETPIPE_SZ = 1031


class _Splice:
    """Bytes from one socket to another through a pipe, never copied through Python (os.splice: Linux, Python
    3.10+), so the proxy takes as little of the 2 cores as it can from the tools it measures. The descriptors
    stay valid until both directions ended (ThrottleProxy._serve closes the sockets)."""

    def __init__(self, src, dst):
        self.src, self.dst = src.fileno(), dst.fileno()
        self.r, self.w = os.pipe()
        try:
            import fcntl

            fcntl.fcntl(self.w, F_SETPIPE_SZ, PROXY_CHUNK)
        except OSError:  # a smaller pipe moves the same bytes in more steps
            pass

    def once(self, most: int, wrote) -> int:
        """At most `most` bytes moved; `wrote(k)` as each piece is written to dst (a client that stops reading
        blocks the rest: what is in its send queue is counted, what waits in the pipe is not)."""
        n = os.splice(self.src, self.w, most)
        left = n
        while left:
            k = os.splice(self.r, self.dst, left)
            wrote(k)
            left -= k
        return n

    def close(self) -> None:
        os.close(self.r)
        os.close(self.w)


TCPI_BYTES_ACKED = 120  # offset of tcpi_bytes_acked (u64) in Linux's struct tcp_info (4.1 and later)


def _acked(sock) -> int:
    """Bytes of this TCP connection the peer acknowledged (TCP_INFO; 0 once the socket is gone)."""
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
    except OSError:
        return 0
    return struct.unpack_from("Q", info, TCPI_BYTES_ACKED)[0] if len(info) >= TCPI_BYTES_ACKED + 8 else 0


class ThrottleProxy:
    """TCP proxy; each accepted connection's server->client bytes are held to `rate` bytes/s (0: no limit).

    It counts what it forwards: `sent`, the server->client bytes written to clients (what a registry
    in its place would have written), and `connections`, the TCP connections accepted; `in_flight()` is
    what of `sent` the clients' host has not acknowledged yet (still in the proxy's send queues).
    """

    def __init__(self, upstream: str, rate: float):
        self.upstream = upstream.rsplit(":", 1)
        self.rate = rate
        self.sent = 0
        self.connections = 0
        self.clients: set = set()  # the client sockets open now
        self.acked = 0  # bytes the clients' host acknowledged on the connections closed so far
        self.lock = threading.Lock()
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(128)
        self.address = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.stopping = False
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self):
        while not self.stopping:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            with self.lock:
                self.connections += 1
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client):
        try:
            server = socket.create_connection((self.upstream[0], int(self.upstream[1])))
        except OSError:
            client.close()
            return
        with self.lock:
            self.clients.add(client)
        up = threading.Thread(target=self._pipe, args=(client, server, None, False), daemon=True)
        up.start()
        self._pipe(server, client, self.rate, True)
        up.join()  # the sockets are closed only once neither direction uses their descriptors
        with self.lock:
            self.clients.discard(client)
            self.acked += _acked(client)
        client.close()
        server.close()

    def _pipe(self, src, dst, rate, count):
        due = time.monotonic()  # when the bytes sent so far may have left at `rate`
        move = _Splice(src, dst) if hasattr(os, "splice") else None  # zero-copy: the proxy is not the bottleneck
        try:
            def wrote(k: int) -> None:
                if count:
                    with self.lock:
                        self.sent += k

            while True:
                n = move.once(PROXY_CHUNK, wrote) if move else self._copy(src, dst, wrote)
                if not n:
                    break
                if rate:
                    # an idle (kept-alive) connection earns at most 50 ms of credit, not a burst
                    now = time.monotonic()
                    due = max(due, now - 0.05) + n / rate
                    if due > now:
                        time.sleep(due - now)
        except OSError:
            pass
        finally:
            if move:
                move.close()
            for s in (src, dst):  # ends the other direction's blocking read; _serve closes them
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def in_flight(self) -> int:
        """Bytes written to the clients' sockets that their host has not acknowledged (SIOCOUTQ: unsent plus
        unacknowledged), summed over the open connections: `sent` minus this is what the clients received."""
        import fcntl
        import termios

        total = 0
        with self.lock:
            for sock in self.clients:
                try:
                    total += struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0" * 4))[0]
                except OSError:
                    pass
        return total

    def received(self) -> int:
        """Bytes the clients' host acknowledged, over every connection: what a fetch killed now had received.
        Not `sent` less in_flight(): `sent` counts a write once it returns, and a write blocked half-way on a
        full send queue has already put part of itself there."""
        with self.lock:
            return self.acked + sum(_acked(sock) for sock in self.clients)

    @staticmethod
    def _copy(src, dst, wrote) -> int:
        data = memoryview(src.recv(PROXY_CHUNK))
        while data:
            k = dst.send(data)
            wrote(k)
            data = data[k:]
        return len(data.obj)

    def close(self):
        self.stopping = True
        self.sock.close()


# ---------------------------------------------------------------------------------------------
# the contestants


class Bench:
    def __init__(self, args, env: Env, meta: dict, repo: str):
        self.args, self.env, self.meta, self.repo = args, env, meta, repo
        self.tmp = Path(args.work_dir) / f"run-{os.getpid()}"
        self.tmp.mkdir(parents=True, exist_ok=True)
        self.base_env = {k: v for k, v in os.environ.items() if not k.startswith("DOCKER_")}
        self.base_env.update(DOCKER_HOST=env.docker_host, DOCKER_CLI_HINTS="false")
        self.docker = ["docker", "-H", env.docker_host]
        self.skopeo = ["skopeo", "--override-arch", "arm64", "--override-os", "linux"]
        self.times: Dict[str, List[float]] = {}
        self.rss: Dict[str, List[int]] = {}
        self.sent: Dict[str, List[Tuple[int, str]]] = {}  # over-download: (bytes the registry sent, note) per run
        # per link (constrained?), each kill: (bytes imgtool's host received, bytes sent by the kill, bytes sent in all)
        self.kills: Dict[bool, List[Tuple[int, int, int]]] = {}
        self.cpu: Dict[str, List[float]] = {}  # CPU seconds (user + sys) of a timed process, per run
        self.bundle: Optional[Path] = None
        self.bundle_size = self.archive_size = 0
        self.delta_sizes: List[int] = []  # bytes of each delta bundle of the next release
        self.stage_rates: Dict[str, float] = {}  # stage_rates(): CPU seconds per byte of each stage

    def ref(self, registry: Optional[str] = None) -> str:
        return f"{registry or self.env.registry}/{self.repo}:v1"

    def fresh(self, name: str) -> Path:
        p = self.tmp / name
        shutil.rmtree(p, ignore_errors=True)
        return p

    def record(self, key: str, res: Result, rss: bool = False) -> None:
        self.times.setdefault(key, []).append(res.seconds)
        if rss:
            self.rss.setdefault(key, []).append(res.rss_kb)
        log(f"  {key}: {res.seconds:.2f}s" + (f", peak RSS {res.rss_kb / 1024:.0f} MiB" if rss else ""))

    # -- fetch ---------------------------------------------------------------------------------

    def imgtool_fetch(self, registry=None, keep=False, mirrors: Optional[Path] = None, known: bool = False,
                      cpu_key: Optional[str] = None) -> Result:
        """A cold fetch (empty cache); `known`: the cache holds only the layers' diff_ids (what a fetch of them
        remembers), so the fetch downloads and writes but does not unpack a layer to check it: the cost of
        the diff_id check, which skopeo does not make, is left out. `cpu_key`: the process's CPU seconds go to
        self.cpu[cpu_key] (`_timed_cpu`)."""
        out = self.fresh("kept-bundle" if keep else "bundle")
        cache = self.fresh("cache")
        if known:
            shutil.copytree(self.tmp / "diffids", cache / "diffids")
        env = dict(self.base_env, IMGTOOL_CACHE=str(cache))
        cmd = imgtool_cmd() + ["-q", "fetch", self.ref(registry), "--arch", "arm64", "-o", str(out), "--no-tool",
                               "--created", "2025-01-01T00:00:00Z"] + (["--mirrors", str(mirrors)] if mirrors else [])
        res = _timed_cpu(self, cpu_key, cmd, env=env, rss=True) if cpu_key else run(cmd, env=env, rss=True)
        if keep and (cache / "diffids").is_dir():
            shutil.rmtree(self.tmp / "diffids", ignore_errors=True)
            shutil.copytree(cache / "diffids", self.tmp / "diffids")
        shutil.rmtree(cache, ignore_errors=True)
        if keep:
            self.bundle = out
        else:
            shutil.rmtree(out, ignore_errors=True)
        return res

    def imgtool_fetch_zstd(self, key: str, mode: str) -> Result:
        """fetch of the zstd twin with --layers MODE; the CPU time of the process goes to self.cpu[key]."""
        import resource

        out, cache = self.fresh("bundle"), self.fresh("cache")
        env = dict(self.base_env, IMGTOOL_CACHE=str(cache))
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        res = run(imgtool_cmd() + ["-q", "fetch", f"{self.env.registry}/{self.repo}-zstd:v1", "--arch", "arm64",
                                   "-o", str(out), "--no-tool", "--created", "2025-01-01T00:00:00Z",
                                   "--layers", mode], env=env, rss=True)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        self.cpu.setdefault(key, []).append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
        shutil.rmtree(cache, ignore_errors=True)
        shutil.rmtree(out, ignore_errors=True)
        return res

    def delta_fetch(self) -> Result:
        """fetch of the next release (:v2) with --base the kept :v1 bundle: only the changed layers;
        the delta bundle's bytes go to self.delta_sizes."""
        out, cache = self.fresh("delta"), self.fresh("cache")
        env = dict(self.base_env, IMGTOOL_CACHE=str(cache))
        res = run(imgtool_cmd() + ["-q", "fetch", f"{self.env.registry}/{self.repo}:v2", "--arch", "arm64",
                                   "-o", str(out), "--base", str(self.bundle), "--no-tool",
                                   "--created", "2025-01-01T00:00:00Z"], env=env, rss=True)
        self.delta_sizes.append(sum(f.stat().st_size for f in out.iterdir() if f.is_file()))
        shutil.rmtree(cache, ignore_errors=True)
        shutil.rmtree(out, ignore_errors=True)
        return res

    def skopeo_oci(self, registry=None) -> Result:
        out = self.fresh("oci")
        res = run(self.skopeo + ["copy", "-q", "--src-tls-verify=false", f"docker://{self.ref(registry)}", f"oci:{out}:v1"],
                  env=self.base_env)
        shutil.rmtree(out, ignore_errors=True)
        return res

    def skopeo_archive(self) -> Result:
        out = self.fresh("archive")
        out.mkdir()
        res = run(self.skopeo + ["copy", "-q", "--src-tls-verify=false", f"docker://{self.ref()}",
                                 f"docker-archive:{out}/image.tar:{self.repo}:v1"], env=self.base_env)
        shutil.rmtree(out, ignore_errors=True)
        return res

    def docker_rmi(self, registry=None, host: Optional[str] = None) -> None:
        docker = ["docker", "-H", host] if host else self.docker
        run(docker + ["rmi", "-f", self.ref(registry)], env=self.base_env, check=False)
        run(docker + ["rmi", "-f", arm(self.meta)["config"]], env=self.base_env, check=False)

    def faq_recipe(self) -> Tuple[Result, Result]:
        self.docker_rmi()
        out = self.fresh("faq")
        out.mkdir()
        pull = run(self.docker + ["pull", "-q", "--platform", "linux/arm64", self.ref()], env=self.base_env)
        save = run(f"set -o pipefail; {' '.join(self.docker)} save {self.ref()} | gzip > {out}/image.tar.gz",
                   env=self.base_env, shell=True)
        self.docker_rmi()
        shutil.rmtree(out, ignore_errors=True)
        return pull, save

    def docker_pull(self, registry) -> Result:
        self.docker_rmi(registry)
        res = run(self.docker + ["pull", "-q", "--platform", "linux/arm64", self.ref(registry)], env=self.base_env)
        self.docker_rmi(registry)
        return res

    def curl_raw(self, registry=None, sync=False) -> Result:
        out = self.fresh("curl")
        out.mkdir()
        im = arm(self.meta)
        cmd = ["curl", "-sS", "-f", "-Z", "--parallel-max", "16"]
        for digest in [im["config"]] + [x["digest"] for x in im["layers"]]:
            cmd += ["-o", str(out / digest.split(":")[1]),
                    f"http://{registry or self.env.registry}/v2/{self.repo}/blobs/{digest}"]
        if sync:  # the durable raw limit: the same, plus fsync of every file (what a bundle needs)
            cmd = ["bash", "-c", 'curl "$@" && sync -- "$0"/*', str(out)] + cmd[1:]
        res = run(cmd, env=self.base_env)
        shutil.rmtree(out, ignore_errors=True)
        return res

    def two_sources(self, registry: str, mirror: str) -> Path:
        """A mirrors.toml naming two sources of the same content for `registry`: itself and `mirror`."""
        path = self.tmp / "two-sources.toml"
        path.write_text(f'default_image = "{registry}/{self.repo}"\n'
                        f'[[mirrors]]\nname = "registry"\nregistry = "{registry}"\nurl = "http://{registry}"\n'
                        'insecure = true\nupstream = true\n'
                        f'[[mirrors]]\nname = "mirror"\nregistry = "{registry}"\nurl = "http://{mirror}"\n'
                        'insecure = true\n')
        return path

    def run_constrained(self) -> None:
        """The constrained link: every connection held to --rate; imgtool from one source and from two (the
        registry and a mirror of it, each behind its own proxy), skopeo and docker from one."""
        a = self.args
        log(f"constrained link ({a.rate:g} MB/s per connection)")
        proxy = ThrottleProxy(self.env.registry, a.rate * MB)
        mirror = ThrottleProxy(self.env.registry, a.rate * MB)
        two = self.two_sources(proxy.address, mirror.address)
        try:
            self.alternate([("slow.imgtool", lambda: self.imgtool_fetch(proxy.address), True),
                            ("slow2.imgtool", lambda: self.imgtool_fetch(proxy.address, mirrors=two), True),
                            ("slow.skopeo_oci", lambda: self.skopeo_oci(proxy.address), False),
                            ("slow.docker_pull", lambda: self.docker_pull(proxy.address), False)][:4 if a.docker_pull else 3],
                           a.runs)
        finally:
            proxy.close()
            mirror.close()

    def overdownload(self, rate: float, kill: bool) -> Tuple[int, str]:
        """Bytes a counting proxy (each connection held to `rate` bytes/s, 0: none) sent for imgtool fetch
        from a fresh cache; with `kill`, the fetch is SIGKILLed once half the blob bytes went out and the
        same command run again, as a user would (both counted): same cache, same output directory, whose unfinished
        bundle holds the layers written in place and their partial downloads. Returns (bytes, what happened); a kill also
        goes to self.kills[rate > 0]: (bytes imgtool's host had received by the kill, bytes the proxy wrote by the
        kill, bytes sent in all). The two first differ by what the proxy's send queues held: the registry sent it,
        imgtool never saw it, and the rerun asks for it as for any byte still missing."""
        out, cache = self.fresh("bundle"), self.fresh("cache")
        env = dict(self.base_env, IMGTOOL_CACHE=str(cache))
        proxy = ThrottleProxy(self.env.registry, rate)
        cmd = imgtool_cmd() + ["-q", "fetch", self.ref(proxy.address), "--arch", "arm64", "-o", str(out),
                               "--no-tool", "--created", "2025-01-01T00:00:00Z"]
        note = ""
        try:
            if kill:
                half = compressed_size(self.meta) // 2
                with open(os.devnull, "wb") as devnull:
                    p = subprocess.Popen(cmd, env=env, stdout=devnull, stderr=devnull)
                # Polled, not timed: the kill lands at the same byte count on any machine.
                while proxy.sent < half and p.poll() is None:
                    time.sleep(0.001)
                p.send_signal(signal.SIGKILL)
                p.wait()
                time.sleep(0.2)  # the proxy's last writes to the dead connections
                killed_at, received = proxy.sent, proxy.received()
                note = f"killed after {killed_at / MB:.0f} MB" if p.returncode == -signal.SIGKILL else "finished before the kill"
            run(cmd, env=env)
            time.sleep(0.1)
            if kill:
                self.kills.setdefault(rate > 0, []).append((received, killed_at, proxy.sent))
            return proxy.sent, note
        finally:
            proxy.close()
            shutil.rmtree(cache, ignore_errors=True)
            shutil.rmtree(out, ignore_errors=True)

    # -- verify / load -------------------------------------------------------------------------

    def archive_path(self) -> Path:
        doc = json.loads((self.bundle / "bundle.json").read_text())
        return self.bundle / doc["archive"]["name"]

    def imgtool_load(self, host: Optional[str] = None) -> Result:
        self.docker_rmi(host=host)
        env = dict(self.base_env, DOCKER_HOST=host) if host else self.base_env
        return run(imgtool_cmd() + ["-q", "load", str(self.bundle)], env=env, rss=True)

    def docker_load(self, host: Optional[str] = None) -> Result:
        self.docker_rmi(host=host)
        docker = ["docker", "-H", host] if host else self.docker
        return run(docker + ["load", "-q", "-i", str(self.archive_path())], env=self.base_env)

    # -- load into the runtimes of nodes without Docker ------------------------------------------

    def podman_env(self, p: str) -> dict:
        """The environment of the private podman in directory `p` (scripts/services.sh: 4.3's, 5.8's)."""
        return dict(self.base_env, PATH=f"{p}/bin:{os.environ.get('PATH', '/usr/bin:/bin')}",
                    CONTAINERS_STORAGE_CONF=f"{p}/storage.conf", CONTAINERS_CONF=f"{p}/containers.conf",
                    DOCKER_HOST="unix:///nonexistent/docker.sock", CONTAINERD_ADDRESS="/nonexistent/containerd.sock")

    def runtime_rmi(self, sock: Optional[str], podman: str = "") -> None:
        """Remove the image from containerd at `sock` (all its names, content collected), or from the Podman in
        directory `podman`."""
        names = [f"quay.io/{self.repo}:v1", self.ref(), arm(self.meta)["config"]]
        if sock:
            ctr = ["ctr", "--address", sock, "-n", "k8s.io"]
            listed = run(ctr + ["images", "ls", "-q"], env=self.ctr_env(sock), check=False).out.split()
            doomed = [n for n in listed if n in names or n.startswith(f"{self.env.registry}/{self.repo}")
                      or n.startswith(f"quay.io/{self.repo}")]
            if doomed:
                run(ctr + ["images", "rm", "--sync"] + doomed, env=self.ctr_env(sock), check=False)
        else:
            run(["podman", "rmi", "-f"] + names, env=self.podman_env(podman), check=False)

    def ctr_env(self, sock: str) -> dict:
        """The environment of a node whose containerd listens at `sock`: its own ctr first on PATH where the
        services keep one beside the socket (containerd 2.x's: its ctr imports through the transfer service)."""
        own = Path(sock).parent / "bin"
        path = os.environ.get("PATH", "/usr/bin:/bin")
        return dict(self.base_env, PATH=f"{own}:{path}" if (own / "ctr").exists() else path,
                    DOCKER_HOST="unix:///nonexistent/docker.sock", CONTAINERD_ADDRESS=sock)

    def imgtool_load_runtime(self, sock: Optional[str], podman: str = "") -> Result:
        """imgtool load --runtime auto on a node without Docker: containerd at `sock`, else the Podman in `podman`."""
        self.runtime_rmi(sock, podman)
        env = self.podman_env(podman) if sock is None else self.ctr_env(sock)
        return run(imgtool_cmd() + ["-q", "load", str(self.bundle)], env=env, rss=True)

    def ctr_import(self, sock: str) -> Result:
        self.runtime_rmi(sock)
        return run(["ctr", "--address", sock, "-n", "k8s.io", "images", "import", "--platform", "linux/arm64",
                    str(self.archive_path())], env=self.ctr_env(sock))

    def podman_load(self, podman: str) -> Result:
        self.runtime_rmi(None, podman)
        return run(["podman", "load", "-q", "-i", str(self.archive_path())], env=self.podman_env(podman))

    def export(self, out: Path) -> Result:
        shutil.rmtree(out, ignore_errors=True)
        cache = self.fresh("export-cache")  # not the user's cache: a scale-1 export leaves GBs of layers there
        try:
            return run(imgtool_cmd() + ["-q", "export", self.ref(), "-o", str(out), "--no-tool"],
                       env=dict(self.base_env, IMGTOOL_CACHE=str(cache)), rss=True)
        finally:
            shutil.rmtree(cache, ignore_errors=True)

    # -- serve ---------------------------------------------------------------------------------

    def serve_start(self) -> Tuple[subprocess.Popen, str]:
        """`imgtool serve` of the kept bundle on a free loopback port: (process, HOST:PORT)."""
        p = subprocess.Popen(imgtool_cmd() + ["-q", "serve", str(self.bundle), "--listen", "127.0.0.1:0"],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, text=True,
                             env=self.base_env)
        first = p.stdout.readline()
        if " at http://" not in first:
            p.kill()
            p.wait()
            raise RuntimeError(f"imgtool serve did not start: {first!r}")
        return p, first.split(" at http://", 1)[1].split("/", 1)[0]

    def pulls(self, registry: str, n: int) -> Result:
        """n `skopeo copy … oci:` of the image from `registry` at once: the wall time of the batch."""
        outs = [self.fresh(f"pull{i}") for i in range(n)]
        t0 = time.monotonic()
        with ThreadPoolExecutor(n) as pool:
            done = list(pool.map(lambda out: run(self.skopeo + ["copy", "-q", "--src-tls-verify=false",
                                                                f"docker://{registry}/{self.repo}:v1", f"oci:{out}:v1"],
                                                 env=self.base_env), outs))
        seconds = time.monotonic() - t0
        for out in outs:
            shutil.rmtree(out, ignore_errors=True)
        return Result(seconds, 0, max(r.rc for r in done), "")

    def serve_pulls(self) -> None:
        """1/4/8 pulls at once from `imgtool serve` and from the registry, alternating; each server's CPU seconds
        (user + sys, from /proc) per batch go to self.cpu, serve's peak RSS and the registry's RSS to self.rss."""
        proc, hostport = self.serve_start()
        registry_pid = listener_pid(int(self.env.registry.rsplit(":", 1)[1]))

        def timed(n: int, key: str, pid: Optional[int], where: str) -> Result:
            before = cpu_seconds(pid) if pid else 0.0
            res = self.pulls(where, n)
            if pid:
                self.cpu.setdefault(key, []).append(cpu_seconds(pid) - before)
            return res

        try:
            self.pulls(hostport, 1)  # untimed: each blob's digest is checked once, when first served
            self.pulls(self.env.registry, 1)
            for n in SERVE_PULLS:
                self.alternate([(f"pull{n}.serve", lambda n=n: timed(n, f"pull{n}.serve", proc.pid, hostport), False),
                                (f"pull{n}.registry", lambda n=n: timed(n, f"pull{n}.registry", registry_pid,
                                                                        self.env.registry), False)],
                               self.args.runs)
            self.rss.setdefault("serve", []).append(proc_status(proc.pid, "VmHWM"))
            if registry_pid:  # its peak would be its pushes': what it holds after the pulls
                self.rss.setdefault("registry", []).append(proc_status(registry_pid, "VmRSS"))
        finally:
            proc.send_signal(signal.SIGTERM)  # a background job ignores SIGINT; serve stops on SIGTERM as on Ctrl-C
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    # -- the plan ------------------------------------------------------------------------------

    def alternate(self, contestants: Sequence[Tuple[str, callable, bool]], runs: int) -> None:
        for r in range(runs):
            order = list(contestants[r % len(contestants):]) + list(contestants[:r % len(contestants)])
            for key, fn, rss in order:
                # Untimed: write back what the previous contestant left dirty (the FAQ recipe leaves
                # gigabytes), so no tool pays for another's write-back in its own fsyncs.
                os.sync()
                out = fn()
                if isinstance(out, tuple):  # the FAQ recipe: pull, then save | gzip
                    pull, save = out
                    self.record("fetch.faq.pull", pull)
                    self.record("fetch.faq.save", save)
                    self.record(key, Result(pull.seconds + save.seconds, 0, 0, ""))
                else:
                    self.record(key, out, rss)

    def run_loads(self, export: bool = False) -> None:
        """Load into every runtime against its own load (Docker engines, containerd, Podman), alternating;
        with `export`, the loaded image is exported back into a bundle (memory + time) in between."""
        a = self.args
        if not a.only_podman:
            self.run_docker_loads(export)
        for version, podman in sorted(self.env.podmans.items()):
            key = "podman" if version == "4.3" else f"podman{version}"  # 4.3's keys as in the reports before 5.8
            log(f"load on Podman {version}")
            self.alternate([(f"{key}.imgtool", lambda p=podman: self.imgtool_load_runtime(None, p), True),
                            (f"{key}.podman", lambda p=podman: self.podman_load(p), False)], a.runs)
            self.runtime_rmi(None, podman)

    def run_docker_loads(self, export: bool) -> None:
        """run_loads' Docker engines and containerds."""
        a = self.args
        log("load")
        self.alternate([("load.imgtool", self.imgtool_load, True), ("load.docker", self.docker_load, False)], a.runs)
        if export:  # the image is loaded now: export it back into a bundle (memory + time)
            self.imgtool_load()
            self.record("export.imgtool", self.export(self.tmp / "export"), rss=True)
            shutil.rmtree(self.tmp / "export", ignore_errors=True)
        self.docker_rmi()
        for engine, (key, _) in ENGINE_LOADS.items():
            host = self.env.engines.get(engine)
            if host is None:
                log(f"load on Docker {engine}: not running (see IMGTOOL_TEST_ENGINES), skipped")
                continue
            log(f"load on Docker {engine}")
            self.alternate([(f"{key}.imgtool", lambda h=host: self.imgtool_load(h), True),
                            (f"{key}.docker", lambda h=host: self.docker_load(h), False)], a.runs)
            self.docker_rmi(host=host)

        for version, sock in sorted(self.env.containerds.items()):
            log(f"load on containerd {version}")
            self.alternate([(f"ctrd{version}.imgtool", lambda s=sock: self.imgtool_load_runtime(s), True),
                            (f"ctrd{version}.ctr", lambda s=sock: self.ctr_import(s), False)], a.runs)
            self.runtime_rmi(sock)

    def run_all(self) -> None:
        a = self.args
        log(f"fetch ({a.runs} runs each)")
        self.imgtool_fetch(keep=True)  # warm the registry's page cache, and keep one bundle
        if a.only_load:
            self.run_loads()
            return
        if a.only_constrained:
            self.run_constrained()
            return
        if a.only_serve:
            self.serve_pulls()
            return
        if a.only_gzip:
            gzip_runs(self)
            return
        if a.only_over:
            self.run_over()
            return
        if a.only_targets:  # issue 27's table, nothing else: what a --scale 1 run has time for
            self.alternate([("fetch.imgtool", lambda: self.imgtool_fetch(cpu_key="fetch.imgtool"), True),
                            ("fetch.skopeo_oci", lambda: self.skopeo_oci(), False),
                            ("fetch.imgtool_known", lambda: self.imgtool_fetch(known=True), True)], a.runs)
            log("delta bundle of the next release")
            self.alternate([("delta.imgtool", self.delta_fetch, True)], a.runs)
            log("load on Docker 20.10")
            self.alternate([("load.imgtool", self.imgtool_load, True), ("load.docker", self.docker_load, False)],
                           a.runs)
            self.docker_rmi()
            self.run_constrained()
            gzip_runs(self)
            return
        fetchers = [("fetch.imgtool", lambda: self.imgtool_fetch(cpu_key="fetch.imgtool"), True),
                    ("fetch.skopeo_oci", lambda: self.skopeo_oci(), False),
                    ("fetch.curl", lambda: self.curl_raw(), False),
                    ("fetch.curl_sync", lambda: self.curl_raw(sync=True), False),
                    ("fetch.skopeo_archive", lambda: self.skopeo_archive(), False)]
        if not a.no_faq:
            fetchers.append(("fetch.faq", self.faq_recipe, False))
        self.alternate(fetchers, a.runs)

        log("delta bundle of the next release (top layers changed, the CANN layer shared)")
        self.alternate([("delta.imgtool", self.delta_fetch, True)], a.runs)

        log(f"fetch of the zstd image ({a.runs} runs each)")
        self.imgtool_fetch_zstd("warm", "as-is")
        self.alternate([("zstd.compat", lambda: self.imgtool_fetch_zstd("zstd.compat", "compat"), True),
                        ("zstd.asis", lambda: self.imgtool_fetch_zstd("zstd.asis", "as-is"), True)], a.runs)

        log("verify")
        self.alternate([("verify.imgtool", lambda: run(imgtool_cmd() + ["-q", "verify", str(self.bundle)], rss=True), True),
                        ("verify.imgtool_quick",
                         lambda: run(imgtool_cmd() + ["-q", "verify", "--quick", str(self.bundle)], rss=True), True),
                        ("verify.sha256sum", lambda: run(["sha256sum", "-c", "--quiet", "SHA256SUMS"], cwd=self.bundle), False)],
                       a.runs)

        log(f"serve: {', '.join(map(str, SERVE_PULLS))} pulls at once, from imgtool serve and from the registry")
        self.serve_pulls()

        self.run_loads(export=True)

        self.run_constrained()

        self.run_over()
        gzip_runs(self)

    def run_over(self) -> None:
        a = self.args
        log("over-download (bytes the registry sent)")
        for _ in range(a.runs):
            for key, _ in OVER_ROWS:
                slow, kill = key.startswith("slow"), key.endswith("kill")
                os.sync()
                got = self.overdownload(a.rate * MB if slow else 0, kill)
                self.sent.setdefault(key, []).append(got)
                log(f"  over.{key}: {100 * (got[0] / compressed_size(self.meta) - 1):+.2f}% {got[1]}")

    def run_small(self) -> Dict[str, int]:
        """Every imgtool command once on this (smaller) image: peak RSS only."""
        out = {}
        out["fetch"] = self.imgtool_fetch(keep=True).rss_kb
        out["verify"] = run(imgtool_cmd() + ["-q", "verify", str(self.bundle)], rss=True).rss_kb
        out["verify --quick"] = run(imgtool_cmd() + ["-q", "verify", "--quick", str(self.bundle)], rss=True).rss_kb
        out["load"] = self.imgtool_load().rss_kb
        out["export"] = self.export(self.tmp / "export").rss_kb
        shutil.rmtree(self.tmp / "export", ignore_errors=True)
        self.docker_rmi()
        proxy = ThrottleProxy(self.env.registry, self.args.rate * MB)
        try:
            out["fetch (constrained link)"] = self.imgtool_fetch(proxy.address).rss_kb
        finally:
            proxy.close()
        return out

    def cleanup(self) -> None:
        self.docker_rmi()
        shutil.rmtree(self.tmp, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# gzip through ISA-L (issue 27): fetch --layers compat, full verify and export against their anchors


def _timed_cpu(b: Bench, key: str, cmd, **kw) -> Result:
    """run(cmd) with the CPU seconds (user + sys) of the command, children included, in b.cpu[key]."""
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    res = run(cmd, **kw)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    b.cpu.setdefault(key, []).append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    return res


def gzip_runs(b: Bench) -> None:
    """ISA-L against zlib and the peers, alternating, b.args.runs times each: `fetch --layers compat` of the zstd
    twin against `skopeo copy --dest-compress-format gzip --dest-compress-level 1`; full `verify` against the
    zlib path (imgtool.pyz on this Python with no site-packages: what a host without isal runs); `export` of
    the loaded image against `docker save | pigz -1` and `docker save > /dev/null` (the floor)."""
    runs, zref = b.args.runs, f"{b.env.registry}/{b.repo}-zstd:v1"

    def compat(lib: str):
        def go() -> Result:
            out, cache = b.fresh("gz-bundle"), b.fresh("gz-cache")
            res = _timed_cpu(b, f"gz.compat.{lib}", imgtool_cmd() + [
                "-q", "fetch", zref, "--arch", "arm64", "-o", str(out), "--no-tool", "--created",
                "2025-01-01T00:00:00Z", "--layers", "compat", "--gzip-library", lib],
                env=dict(b.base_env, IMGTOOL_CACHE=str(cache)), rss=True)
            shutil.rmtree(cache, ignore_errors=True)
            shutil.rmtree(out, ignore_errors=True)
            return res
        return go

    def skopeo_gzip() -> Result:
        out = b.fresh("gz-oci")
        res = _timed_cpu(b, "gz.compat.skopeo", b.skopeo + [
            "copy", "-q", "--src-tls-verify=false", "--dest-compress-format", "gzip", "--dest-compress-level", "1",
            f"docker://{zref}", f"oci:{out}:v1"], env=b.base_env)
        shutil.rmtree(out, ignore_errors=True)
        return res

    log(f"gzip: fetch --layers compat of the zstd image, ISA-L / zlib / skopeo gzip level 1 ({runs} runs each)")
    b.alternate([("gz.compat.isal", compat("isal"), True), ("gz.compat.zlib", compat("zlib"), True),
                 ("gz.compat.skopeo", skopeo_gzip, False)], runs)

    pyz = b.tmp / "zlib.pyz"
    run(imgtool_cmd() + ["-q", "self-bundle", "-o", str(pyz)])
    log(f"gzip: full verify, ISA-L / zlib ({runs} runs each)")
    b.alternate([("gz.verify.isal", lambda: _timed_cpu(b, "gz.verify.isal", imgtool_cmd() + [
                     "-q", "verify", str(b.bundle)], rss=True), True),
                 ("gz.verify.zlib", lambda: _timed_cpu(b, "gz.verify.zlib", [
                     sys.executable, "-I", "-S", str(pyz), "-q", "verify", str(b.bundle)], rss=True), True)], runs)

    def export(lib: str):
        def go() -> Result:
            out, cache = b.fresh("gz-export"), b.fresh("gz-cache")
            res = _timed_cpu(b, f"gz.export.{lib}", imgtool_cmd() + [
                "-q", "export", b.ref(), "-o", str(out), "--no-tool", "--gzip-library", lib],
                env=dict(b.base_env, IMGTOOL_CACHE=str(cache)), rss=True)
            shutil.rmtree(cache, ignore_errors=True)
            shutil.rmtree(out, ignore_errors=True)
            return res
        return go

    def save(into: str, key: str):
        def go() -> Result:
            return _timed_cpu(b, key, f"set -o pipefail; {' '.join(b.docker)} save {b.ref()} {into}",
                              env=b.base_env, shell=True)
        return go

    def save_floor() -> Result:
        """docker save into nothing: its wall (the floor) and when its first byte came (gz.export.save_first:
        Docker 20.10 writes every layer into its own tmp directory before it sends a byte)."""
        import resource

        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.monotonic()
        p = subprocess.Popen(b.docker + ["save", b.ref()], stdout=subprocess.PIPE, env=b.base_env)
        first = None
        while True:
            chunk = p.stdout.read(1024 * 1024)
            if first is None:
                first = time.monotonic() - t0
            if not chunk:
                break
        rc = p.wait()
        seconds = time.monotonic() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        b.cpu.setdefault("gz.export.save", []).append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
        b.times.setdefault("gz.export.save_first", []).append(first or seconds)
        if rc:
            raise RuntimeError(f"docker save exited {rc}")
        return Result(seconds, 0, rc, "")

    b.imgtool_load()
    log(f"gzip: export of the loaded image, ISA-L / zlib / docker save | pigz -1 / docker save ({runs} runs each)")
    b.alternate([("gz.export.isal", export("isal"), True), ("gz.export.zlib", export("zlib"), True),
                 ("gz.export.pigz", save(f"| pigz -1 > {b.tmp / 'gz-save.tar.gz'}", "gz.export.pigz"), False),
                 ("gz.export.save", save_floor, False)], runs)
    (b.tmp / "gz-save.tar.gz").unlink(missing_ok=True)
    b.docker_rmi()


# (job, imgtool key, zlib key, anchors: (what, key, target ratio of imgtool's time to it))
GZIP_ROWS = [
    ("fetch --layers compat of the zstd image", "gz.compat.isal", "gz.compat.zlib",
     [("skopeo copy --dest-compress-format gzip --dest-compress-level 1", "gz.compat.skopeo", 0.5)]),
    ("full verify", "gz.verify.isal", "gz.verify.zlib", [("the zlib path (imgtool.pyz, no isal)", "gz.verify.zlib", 0.5)]),
    ("export of the loaded image", "gz.export.isal", "gz.export.zlib",
     [("docker save \\| pigz -1", "gz.export.pigz", 0.5), ("docker save > /dev/null (the floor)", "gz.export.save", 1.1)]),
]


def gzip_report(b: Bench) -> List[str]:
    """The gzip rows: medians, CPU seconds and each ratio against its anchor and target (issue 27)."""
    def cpu(key: str) -> str:
        v = b.cpu.get(key)
        return f"{statistics.median(v):.1f}" if v else ""

    lines = ["", "## gzip through ISA-L (issue 27)", "",
             "Medians of the same run, alternating; CPU = user + sys seconds of the process and its children.", "",
             "| job | ISA-L s (CPU) | zlib s (CPU) | anchor | anchor s (CPU) | ISA-L ÷ anchor | target | met |",
             "|---|---:|---:|---|---:|---:|---:|---|"]
    for job, mine, theirs, anchors in GZIP_ROWS:
        m, z = med(b, mine), med(b, theirs)
        for what, key, goal in anchors:
            a = med(b, key)
            ratio = m / a if m and a else None
            lines.append(f"| {job} | {m or 0:.2f} ({cpu(mine)}) | {z or 0:.2f} ({cpu(theirs)}) | {what} | "
                         f"{a or 0:.2f} ({cpu(key)}) | {'' if ratio is None else f'{ratio:.2f}'} | ≤ {goal:g} | "
                         f"{'' if ratio is None else ('yes' if ratio <= goal else 'no')} |")
    return lines


# ---------------------------------------------------------------------------------------------
# where the time goes: CPU per stage (issue 27)

STAGE_SAMPLE = 128 * 1024 * 1024  # unpacked bytes of each layer the stages are timed on


def _cpu_timed(fn) -> float:
    t0 = time.thread_time()
    fn()
    return time.thread_time() - t0


def _gzip_prefix(path: Path, want: int) -> Tuple[bytes, bytes]:
    """The first bytes of a gzip blob that inflate to at least `want` bytes, and what they inflate to."""
    import zlib

    d, raw, tar = zlib.decompressobj(31), bytearray(), bytearray()
    with open(path, "rb") as f:
        while len(tar) < want and not d.eof:
            chunk = f.read(1024 * 1024)
            if not chunk:
                break
            raw += chunk
            tar += d.decompress(chunk)
    return bytes(raw), bytes(tar)


def _time_stages(raw: bytes, tar: bytes, zstd_blob: Path, add) -> int:
    """Each stage once over one layer's sample, its CPU seconds to add(stage, seconds, bytes); returns the bytes
    ISA-L level 2 made of `tar`."""
    import hashlib
    import zlib

    import zstandard
    from isal import isal_zlib

    member = 4 * 1024 * 1024
    pieces = [tar[i:i + member] for i in range(0, len(tar), member)]
    out = [0]

    def deflate(lib, level: int, count: bool) -> None:
        for x in pieces:
            c = lib.compressobj(level, zlib.DEFLATED, -15)
            n = len(c.compress(x)) + len(c.flush())
            out[0] += n if count else 0

    add("isal_inflate", _cpu_timed(lambda: isal_zlib.decompressobj(31).decompress(raw)), len(tar))
    add("zlib_inflate", _cpu_timed(lambda: zlib.decompressobj(31).decompress(raw)), len(tar))
    with open(zstd_blob, "rb") as f:
        zr = zstandard.ZstdDecompressor().stream_reader(f, read_size=member, read_across_frames=True)
        add("zstd_inflate", _cpu_timed(lambda: [zr.read(member) for _ in pieces]), len(tar))
    add("sha256", _cpu_timed(lambda: hashlib.sha256(tar).digest()), len(tar))
    add("crc32", _cpu_timed(lambda: isal_zlib.crc32(tar)), len(tar))
    add("isal_deflate", _cpu_timed(lambda: deflate(isal_zlib, 2, True)), len(tar))
    add("zlib_deflate", _cpu_timed(lambda: deflate(zlib, 1, False)), len(tar))
    return out[0]


def stage_rates(meta: dict) -> Dict[str, float]:
    """CPU seconds per byte of each stage the gzip jobs are made of, each timed on one thread over the first
    STAGE_SAMPLE unpacked bytes of every arm64 layer: the registry's gzip blob (level 6), its zstd twin, and the
    unpacked tar. Keys: sha256 (per byte hashed), zstd_inflate, isal_deflate, zlib_deflate, isal_inflate,
    zlib_inflate, crc32 (per unpacked byte); isal_ratio (unpacked / ISA-L level 2 output)."""
    blobs = Path(meta["dir"]) / "blobs"
    spent: Dict[str, float] = {}
    sizes: Dict[str, int] = {}

    def add(key: str, seconds: float, n: int) -> None:
        spent[key] = spent.get(key, 0.0) + seconds
        sizes[key] = sizes.get(key, 0) + n

    out_bytes = 0
    for layer, twin in zip(arm(meta)["layers"], build_zstd_twin(meta)["layers"]):
        raw, tar = _gzip_prefix(blobs / layer["digest"].split(":")[1], STAGE_SAMPLE)
        if tar:
            out_bytes += _time_stages(raw, tar, blobs / twin["digest"].split(":")[1], add)
    rates = {k: spent[k] / sizes[k] for k in spent}
    rates["isal_ratio"] = sizes["isal_deflate"] / max(1, out_bytes)
    return rates


def stage_report(b: "Bench", meta: dict, rates: Dict[str, float]) -> List[str]:
    """Each gzip job as the sum of its stages' CPU (rates x this image's bytes), the floor that sum puts on
    the wall on this machine's cores, and the ratio to the anchor that floor allows."""
    u, g = unpacked_size(meta), compressed_size(meta)
    z = sum(x["size"] for x in build_zstd_twin(meta)["layers"])
    g1 = u / rates["isal_ratio"]
    cores = os.cpu_count() or 1

    def sha(n: float) -> float:
        return rates["sha256"] * n

    jobs = [
        ("fetch, cold (the gzip image)", "fetch.imgtool", "fetch.skopeo_oci", [
            # the diff_ids are checked with --check-diff-ids only (docs/design.md, "What fetch checks")
            ("sha256 of the blobs (download check)", sha(g)), ("sha256 of the bundle's archive", sha(g))]),
        ("fetch --layers compat (ISA-L)", "gz.compat.isal", "gz.compat.skopeo", [
            ("sha256 of the zstd blobs (download check)", sha(z)), ("zstd inflate", rates["zstd_inflate"] * u),
            ("sha256 of the tars (diff_id check)", sha(u)), ("ISA-L deflate, level 2", rates["isal_deflate"] * u),
            ("crc32 of the members", rates["crc32"] * u), ("sha256 of the gzip blobs (their digests)", sha(g1)),
            ("sha256 of the bundle's parts", sha(g1))]),
        ("full verify (ISA-L)", "gz.verify.isal", "gz.verify.zlib", [
            ("sha256 of the parts", sha(g)), ("sha256 of the blobs", sha(g)),
            ("ISA-L inflate", rates["isal_inflate"] * u), ("sha256 of the tars (diff_ids)", sha(u))]),
        ("full verify (zlib)", "gz.verify.zlib", None, [
            ("sha256 of the parts", sha(g)), ("sha256 of the blobs", sha(g)),
            ("zlib inflate", rates["zlib_inflate"] * u), ("sha256 of the tars (diff_ids)", sha(u))]),
        ("export (ISA-L), imgtool's side", "gz.export.isal", "gz.export.pigz", [
            ("sha256 of the tars (diff_ids)", sha(u)), ("ISA-L deflate, level 2", rates["isal_deflate"] * u),
            ("crc32 of the members", rates["crc32"] * u), ("sha256 of the gzip blobs", sha(g1)),
            ("sha256 of the bundle's parts", sha(g1))]),
    ]
    lines = ["", "## Where the time goes: CPU per stage", "",
             f"Each stage timed on one thread (`time.thread_time`) over the first {STAGE_SAMPLE // 2**20} MiB "
             "unpacked of every arm64 layer, then scaled to this image's bytes "
             f"({u / MB:.0f} MB unpacked, {g / MB:.0f} MB gzip level 6, {z / MB:.0f} MB zstd, ~{g1 / MB:.0f} MB "
             "as ISA-L level 2 writes it). Rates, MB/s on one core: "
             + ", ".join(f"{k.replace('_', ' ')} {1 / v / MB:.0f}" for k, v in sorted(rates.items())
                         if k != "isal_ratio" and v > 0)
             + f". The floor: the stages' CPU spread perfectly over the {cores} cores (reading, writing, "
             "Python and the kernel's copies not counted, so the true floor is higher).", "",
             "| job | stages (CPU s) | sum CPU s | measured CPU s | floor on the cores s | measured s | anchor s "
             "| floor ÷ anchor |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    for job, key, anchor, stages in jobs:
        total = sum(x for _, x in stages)
        cpu = b.cpu.get(key)
        m, a = med(b, key), med(b, anchor) if anchor else None
        floor = total / cores
        lines.append(f"| {job} | " + "; ".join(f"{what} {x:.1f}" for what, x in stages)
                     + f" | {total:.1f} | {statistics.median(cpu) if cpu else 0:.1f} | {floor:.1f} | "
                     f"{m or 0:.1f} | {a or 0:.1f} | {f'{floor / a:.2f}' if a else ''} |")
    save, first = med(b, "gz.export.save"), med(b, "gz.export.save_first")
    if save and first is not None:
        total = sum(x for _, x in jobs[-1][3])
        floor = max(save, first + total / cores)
        lines += ["", f"Export: `docker save` sent its first byte after {first:.1f} s of its {save:.1f} s (medians; Docker "
                  "20.10 writes every layer into <root>/tmp before it sends any): imgtool's work can only start then, "
                  f"so its floor is max({save:.1f}, {first:.1f} + {total:.1f} / {cores}) = {floor:.1f} s, "
                  f"{floor / save:.2f}× `docker save > /dev/null`; measured {med(b, 'gz.export.isal') or 0:.1f} s."]
    return lines


# ---------------------------------------------------------------------------------------------
# report


def machine() -> List[Tuple[str, str]]:
    cpu = "?"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = "?"
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemTotal"):
                mem = f"{int(line.split()[1]) / 1024 / 1024:.1f} GiB"
    except OSError:
        pass
    disk = "?"
    try:
        src = subprocess.run(["findmnt", "-no", "SOURCE,FSTYPE", "-T", "/tmp"], capture_output=True, text=True).stdout.split()
        disk = " ".join(src)
    except OSError:
        pass
    host = os.environ.get("DOCKER_HOST", "")
    server = version_of(["bash", "-c", f"docker -H {host} version --format '{{{{.Server.Version}}}}' 2>/dev/null"])
    return [("CPU", f"{cpu}, {os.cpu_count()} cores"), ("RAM", mem), ("disk (/tmp)", disk),
            ("kernel", platform.release()), ("Python", platform.python_version()),
            ("Docker", f"daemon {server}, client {version_of(['docker', '--version'])}"),
            ("skopeo", version_of(["skopeo", "--version"])), ("curl", version_of(["curl", "--version"]).split(" (")[0]),
            ("load average at start", " ".join(f"{x:.2f}" for x in os.getloadavg()))]


ROWS = [  # key, task, tool
    ("fetch.imgtool", "fetch", "`imgtool fetch --arch arm64 --no-tool` (fresh cache)"),
    ("fetch.skopeo_oci", "fetch", "`skopeo copy --override-arch arm64 docker://… oci:DIR`"),
    ("fetch.skopeo_archive", "fetch", "`skopeo copy … docker-archive:FILE`"),
    ("fetch.faq", "fetch", "FAQ recipe: `docker pull --platform linux/arm64` + `docker save | gzip`"),
    ("fetch.faq.pull", "fetch", "… of which `docker pull`"),
    ("fetch.faq.save", "fetch", "… of which `docker save | gzip`"),
    ("fetch.curl", "fetch", "raw limit: `curl -Z`, every blob at once, to disk (page cache)"),
    ("fetch.curl_sync", "fetch", "raw limit, durable: the same, then `sync FILE…`"),
    ("delta.imgtool", "delta (next release)", "`imgtool fetch …:v2 --base` the :v1 bundle (the changed layers only)"),
    ("zstd.asis", "fetch (zstd image)", "`imgtool fetch --layers as-is` (the registry's zstd bytes)"),
    ("zstd.compat", "fetch (zstd image)", "`imgtool fetch` (default `--layers compat`: zstd layers → gzip)"),
    ("verify.imgtool", "verify", "`imgtool verify` (parts, every blob, every diff_id)"),
    ("verify.imgtool_quick", "verify", "`imgtool verify --quick` (parts only)"),
    ("verify.sha256sum", "verify", "`sha256sum -c SHA256SUMS`"),
    ("load.imgtool", "load", "`imgtool load` (checks while it streams)"),
    ("load.docker", "load", "`docker load -i` of the same archive"),
    ("load26.imgtool", "load (Docker 26.1)", "`imgtool load`, Docker 26.1, overlay2"),
    ("load26.docker", "load (Docker 26.1)", "`docker load -i`, the same Docker"),
    ("load26c.imgtool", "load (Docker 26.1, containerd store)", "`imgtool load`, Docker 26.1, containerd image store"),
    ("load26c.docker", "load (Docker 26.1, containerd store)", "`docker load -i`, the same Docker"),
    ("ctrd1.6.imgtool", "load (containerd 1.6)", "`imgtool load` on a node without Docker (k8s.io, unpacked)"),
    ("ctrd1.6.ctr", "load (containerd 1.6)", "`ctr -n k8s.io images import` of the same archive"),
    ("ctrd1.7.imgtool", "load (containerd 1.7)", "`imgtool load` on a node without Docker (k8s.io, unpacked)"),
    ("ctrd1.7.ctr", "load (containerd 1.7)", "`ctr -n k8s.io images import` of the same archive"),
    ("load28.imgtool", "load (Docker 28.5)", "`imgtool load`, Docker 28.5 (Debian unstable's), overlay2"),
    ("load28.docker", "load (Docker 28.5)", "`docker load -i`, the same Docker"),
    ("ctrd2.1.imgtool", "load (containerd 2.1)", "`imgtool load` on a node without Docker (k8s.io, unpacked)"),
    ("ctrd2.1.ctr", "load (containerd 2.1)", "`ctr -n k8s.io images import` (2.1's own ctr: the transfer service)"),
    ("podman.imgtool", "load (Podman 4.3)", "`imgtool load` on a host with only Podman"),
    ("podman.podman", "load (Podman 4.3)", "`podman load -i` of the same archive"),
    ("podman5.8.imgtool", "load (Podman 5.8)", "`imgtool load` on a host with only Podman 5.8"),
    ("podman5.8.podman", "load (Podman 5.8)", "`podman load -i` of the same archive, the same Podman"),
    ("export.imgtool", "export", "`imgtool export` (docker save → gzip layers → bundle)"),
    ("pull1.serve", "1 pull", "`skopeo copy … oci:DIR` from `imgtool serve` of the bundle"),
    ("pull1.registry", "1 pull", "`skopeo copy … oci:DIR` from the distribution registry"),
    ("pull4.serve", "4 pulls at once", "`skopeo copy` ×4 from `imgtool serve`"),
    ("pull4.registry", "4 pulls at once", "`skopeo copy` ×4 from the distribution registry"),
    ("pull8.serve", "8 pulls at once", "`skopeo copy` ×8 from `imgtool serve`"),
    ("pull8.registry", "8 pulls at once", "`skopeo copy` ×8 from the distribution registry"),
    ("slow.imgtool", "constrained link", "`imgtool fetch --arch arm64`"),
    ("slow2.imgtool", "constrained link", "`imgtool fetch` from two sources (the registry and a mirror, each behind the proxy)"),
    ("slow.skopeo_oci", "constrained link", "`skopeo copy … oci:DIR`"),
    ("slow.docker_pull", "constrained link", "`docker pull --platform linux/arm64`"),
]
OVER_ROWS = [("cold", "cold fetch, loopback"), ("slow", "cold fetch, constrained link"),
             ("kill", "SIGKILL halfway + rerun, loopback"), ("slow_kill", "SIGKILL halfway + rerun, constrained link")]
RSS_ROWS = [("fetch", "fetch.imgtool"), ("fetch (constrained link)", "slow.imgtool"), ("verify", "verify.imgtool"),
            ("verify --quick", "verify.imgtool_quick"), ("load", "load.imgtool"), ("export", "export.imgtool")]
BASELINE = {"delta (next release)": "delta.imgtool",
            "fetch": "fetch.imgtool", "fetch (zstd image)": "zstd.asis", "verify": "verify.imgtool_quick", "load": "load.imgtool",
            "load (Docker 26.1)": "load26.imgtool", "load (Docker 26.1, containerd store)": "load26c.imgtool",
            "load (containerd 1.6)": "ctrd1.6.imgtool", "load (containerd 1.7)": "ctrd1.7.imgtool",
            "load (Docker 28.5)": "load28.imgtool", "load (containerd 2.1)": "ctrd2.1.imgtool",
            "load (Podman 4.3)": "podman.imgtool", "load (Podman 5.8)": "podman5.8.imgtool",
            "export": "export.imgtool", "constrained link": "slow.imgtool",
            "1 pull": "pull1.serve", "4 pulls at once": "pull4.serve", "8 pulls at once": "pull8.serve"}
SERVE_PULLS = (1, 4, 8)


def med(b: Bench, key: str) -> Optional[float]:
    v = b.times.get(key)
    return statistics.median(v) if v else None


def image_text(meta: dict, args) -> str:
    """The Image section: what was generated, and each layer's size."""
    im = arm(meta)
    csize, usize = compressed_size(meta), unpacked_size(meta)
    big = max(im["layers"], key=lambda x: x["size"])
    zsize = sum(x["size"] for x in meta["zstd"]["layers"])
    changed = benchimage.CHANGED_BY_A_RELEASE
    nsize = sum(x["size"] for x in meta["next"]["images"]["arm64"]["layers"][-changed:])
    text = (f"A two-arch Docker manifest list on a local distribution registry (loopback, HTTP), generated by "
            f"scripts/benchimage.py from seed `{meta['seed']}` at scale {meta['scale']:g} (1 = the real vllm-ascend "
            "image: ~15 GB unpacked, ~6.5 GB gzip): seeded bytes, never this machine's files, the same tars on every "
            f"machine. The arm64 image (the one every tool copies) has {len(im['layers'])} gzip layers (level "
            f"{args.gzip_level}, Docker v2 media types): **{csize / MB:.0f} MB compressed, {usize / MB:.0f} MB unpacked** "
            f"({usize / csize:.2f}:1); the CANN-like layer holds {big['size'] / MB:.0f} MB ({100 * big['size'] / csize:.0f}% "
            f"of the compressed bytes). Its zstd twin (same config and tars, zstd level 3, OCI media types): "
            f"{zsize / MB:.0f} MB. The next release (`:v2`) changes the top {changed} layers ({nsize / MB:.0f} MB) and "
            "shares the rest. The amd64 half is small (no tool downloads it). Page cache is warm for every tool "
            "(the registry's files and the bundle are read from memory); outputs are written to the same disk.")
    rows = ["", "| # | layer (what it stands for) | unpacked MB | gzip MB | ratio |", "|---:|---|---:|---:|---:|"]
    for i, (name, x) in enumerate(zip(meta["layer_names"], im["layers"])):
        rows.append(f"| {i + 1} | {name} | {x['unpacked'] / MB:.1f} | {x['size'] / MB:.1f} | {x['unpacked'] / x['size']:.2f} |")
    return text + "\n" + "\n".join(rows)


# Issue 27's targets: (job, anchor, target, measured(b) -> (value, text) or None, met(value)).
# A row whose keys this run has not measured says so; the gzip rows (gzip_runs: gz.compat.*, gz.verify.*,
# gz.export.*; "today's full verify" is the zlib path) and the two-source row (slow2.imgtool) fill theirs.
def _ratio(b: "Bench", key: str, anchor: str, faster: bool = False):
    x, y = med(b, key), med(b, anchor)
    if x is None or not y:
        return None
    v = y / x if faster else x / y
    return v, (f"{v:.1f}× faster" if faster else f"{v:.2f}×")


def _export_target(b: "Bench"):
    pigz, floor = _ratio(b, "gz.export.isal", "gz.export.pigz"), _ratio(b, "gz.export.isal", "gz.export.save")
    if pigz is None and floor is None:
        return None
    v = min(x for x in (pigz and pigz[0] / 0.5, floor and floor[0] / 1.1) if x is not None)
    return v, "; ".join(t for t in (pigz and f"{pigz[1]} pigz", floor and f"{floor[1]} the floor") if t)


def _fetch_target(b: "Bench"):
    r = _ratio(b, "fetch.imgtool", "fetch.skopeo_oci")
    if r is None:
        return None
    rss = max(b.rss.get("fetch.imgtool", [0])) * 1024 / MB
    known = _ratio(b, "fetch.imgtool_known", "fetch.skopeo_oci")
    return max(r[0], rss / 100), f"{r[1]}, RSS {rss:.0f} MB" + (
        f" (the diff_ids known, so no layer unpacked to check them as skopeo does not: {known[1]})" if known else "")


def _delta_target(b: "Bench"):
    if not b.delta_sizes or not b.bundle_size:
        return None
    v = 100 * statistics.median(b.delta_sizes) / b.bundle_size
    return v, f"{v:.1f} % ({statistics.median(b.delta_sizes) / MB:.1f} of {b.bundle_size / MB:.1f} MB)"


TARGETS27 = [
    ("fetch `--layers compat` of the zstd twin", "`skopeo copy --dest-compress-format gzip`", "≤ 0.5×",
     lambda b: _ratio(b, "gz.compat.isal", "gz.compat.skopeo"), lambda v: v <= 0.5),
    ("export of a loaded image", "`docker save \\| pigz -1`; `docker save > /dev/null` (the floor)",
     "≤ 0.5× pigz, or ≤ 1.1× the floor", _export_target, lambda v: v <= 1.0),
    ("full `verify`", "today's full verify", "≤ 0.5×", lambda b: _ratio(b, "gz.verify.isal", "gz.verify.zlib"),
     lambda v: v <= 0.5),
    ("fetch, cold", "skopeo → OCI dir", "≤ 1.0×, RSS ≤ 100 MB", _fetch_target, lambda v: v <= 1.0),
    ("load, Docker 20.10", "`docker load -i` of the same archive", "≤ 1.0×",
     lambda b: _ratio(b, "load.imgtool", "load.docker"), lambda v: v <= 1.0),
    ("delta bundle of the next release", "full bundle", "≤ 10 % of its bytes", _delta_target, lambda v: v <= 10),
    ("constrained link, one source", "skopeo → OCI dir", "≥ 3.3× faster",
     lambda b: _ratio(b, "slow.imgtool", "slow.skopeo_oci", faster=True), lambda v: v >= 3.3),
    ("the same link, two sources (a registry and a mirror)", "skopeo → OCI dir from one", "≥ 6× faster",
     lambda b: _ratio(b, "slow2.imgtool", "slow.skopeo_oci", faster=True), lambda v: v >= 6),
]


def issue27_table(b: "Bench", meta: dict, args) -> List[str]:
    lines = ["## Targets of issue 27", "",
             f"Each ratio from this run (scale {meta['scale']:g}; the issue's scale-1 rows are met only by a "
             "`--scale 1` run). Where a target is missed, the rows below say where the time goes.", "",
             "| job | anchor (same run) | target | measured | met |", "|---|---|---|---|---|"]
    for job, anchor, target, measure, ok in TARGETS27:
        got = measure(b)
        if got is None:
            lines.append(f"| {job} | {anchor} | {target} | not measured in this run | |")
        else:
            lines.append(f"| {job} | {anchor} | {target} | {got[1]} | {'yes' if ok(got[0]) else 'no'} |")
    return lines + [""]


def report(b: Bench, meta: dict, small_meta: dict, small_rss: Dict[str, int], info, args, wall: float) -> str:
    im = arm(meta)
    csize, usize = compressed_size(meta), unpacked_size(meta)
    big = max(im["layers"], key=lambda x: x["size"])
    lines = ["# Benchmarks", "",
             f"Generated by `scripts/bench.py --scale {args.scale:g}`"
             + (" --quick (a tiny image: this checks the script, not speed)" if args.quick else "")
             + f" on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; the whole run took {wall / 60:.1f} min.",
             "Every tool ran on the same image in the same run, alternating, "
             f"{args.runs} time(s) each; the numbers are medians.", "", "## Machine", "", "| | |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in info]
    lines += [f"| load average at end | {' '.join(f'{x:.2f}' for x in os.getloadavg())} |", "",
              "## Image", "",
              image_text(meta, args), ""]
    lines += issue27_table(b, meta, args)
    lines += ["## Results", "", "| task | tool | median s | runs | MB/s | × imgtool |", "|---|---|---:|---:|---:|---:|"]
    for key, task, tool in ROWS:
        m = med(b, key)
        if m is None:
            lines.append(f"| {task} | {tool} | skipped | 0 | | |")
            continue
        n = len(b.times[key])
        size = b.bundle_size if task == "verify" else (b.archive_size if task.startswith("load") else
                                                       usize if task == "fetch (zstd image)" else
                                                       statistics.median(b.delta_sizes) if key == "delta.imgtool" else csize)
        if key.startswith("pull"):  # a batch of n pulls moves n images
            size = csize * int(key[4:].split(".")[0])
        rate = f"{size / MB / m:.0f}" if m > 0 else "∞"
        base = med(b, BASELINE[task])
        ratio = f"{m / base:.2f}" if base else ""
        lines.append(f"| {task} | {tool} | {m:.2f} | {n} | {rate} | {ratio} |")
    lines += ["", "MB/s: compressed image bytes per second (fetch), unpacked layer bytes (fetch of the zstd image: "
              "the same image, every layer zstd level 3, same config), archive bytes (verify, load), the images of "
              "a batch (n pulls at once: n × the compressed image). "
              "`× imgtool`: the tool's time divided by imgtool's (verify: by `--quick`)."]
    lines += ["", f"Constrained link: a TCP proxy holding each connection to {args.rate:g} MB/s in front of the registry.",
              "", "## Targets", "", "| target | measured | met |", "|---|---|---|"]

    def target(name, value, ok, fmt):
        if value is None:
            lines.append(f"| {name} | skipped | |")
        else:
            lines.append(f"| {name} | {fmt.format(value)} | {'yes' if ok(value) else 'no'} |")

    def ratio(a, bkey):
        x, y = med(b, a), med(b, bkey)
        return x / y if x is not None and y else None

    target("fetch ≤ 1.0× skopeo→oci", ratio("fetch.imgtool", "fetch.skopeo_oci"), lambda v: v <= 1.0, "{:.2f}×")
    target("fetch ≤ 2× raw curl", ratio("fetch.imgtool", "fetch.curl"), lambda v: v <= 2.0, "{:.2f}×")
    target("fetch ≤ 2× raw curl + sync (durable)", ratio("fetch.imgtool", "fetch.curl_sync"), lambda v: v <= 2.0, "{:.2f}×")
    faq = ratio("fetch.faq", "fetch.imgtool")
    target("fetch ≥ 30× faster than the FAQ recipe", faq, lambda v: v >= 30, "{:.0f}× faster")
    q = med(b, "verify.imgtool_quick")
    target("verify --quick ≥ 1 GB/s", b.bundle_size / q / 1e9 if q else None, lambda v: v >= 1.0, "{:.2f} GB/s")
    f = med(b, "verify.imgtool")
    target("verify (full), for the record", b.bundle_size / f / 1e9 if f else None, lambda v: True, "{:.2f} GB/s")
    target("load ≤ 1.05× docker load", ratio("load.imgtool", "load.docker"), lambda v: v <= 1.05, "{:.2f}×")
    for engine, (key, _) in ENGINE_LOADS.items():
        target(f"load ≤ 1.05× docker load, Docker {engine}", ratio(f"{key}.imgtool", f"{key}.docker"),
               lambda v: v <= 1.05, "{:.2f}×")
    extra = (med(b, "zstd.compat") or 0) - (med(b, "zstd.asis") or 0)
    rewrite = (usize / extra / MB if extra > 0 else float("inf")) if med(b, "zstd.compat") else None
    target("zstd → gzip rewrite, for the record: MB/s of layer (unpacked)", rewrite, lambda v: True, "{:.0f} MB/s")
    cores = [c / t for c, t in zip(b.cpu.get("zstd.compat", []), b.times.get("zstd.compat", [])) if t > 0]
    target("fetch of the zstd image with the rewrite, for the record: cores used (CPU s / wall s)",
           statistics.median(cores) if cores else None, lambda v: True, "{:.2f}")
    target("constrained link ≥ 3.3× faster than skopeo", ratio("slow.skopeo_oci", "slow.imgtool"), lambda v: v >= 3.3,
           "{:.1f}× faster")
    target("constrained link, two sources (registry + mirror) ≥ 6× faster than skopeo from one",
           ratio("slow.skopeo_oci", "slow2.imgtool"), lambda v: v >= 6, "{:.1f}× faster")
    for n in SERVE_PULLS:
        target(f"{n} pull(s) at once from serve: throughput ≥ the registry's", ratio(f"pull{n}.registry", f"pull{n}.serve"),
               lambda v: v >= 1.0, "{:.2f}× the registry's")
    peak = max([max(v) for k, v in b.rss.items() if k not in ("serve", "registry")] + list(small_rss.values()) or [0]) * 1024 / MB
    target("peak RSS ≤ 100 MB at both sizes", peak, lambda v: v <= 100, "{:.1f} MB max")

    def over(keys):
        runs = [n for k in keys for n, _ in b.sent.get(k, [])]
        return 100 * (max(runs) / csize - 1) if runs else None

    target("over-download ≤ 1 %, cold fetch (worst run)", over(["cold", "slow"]), lambda v: v <= 1.0, "{:+.2f} %")
    target("over-download ≤ 1 %, SIGKILL + rerun (worst run)", over(["kill", "slow_kill"]), lambda v: v <= 1.0, "{:+.2f} %")

    def resent(slow: bool) -> List[Tuple[float, int, int, int]]:
        """Per kill on that link: (% of what was received that the rerun downloaded again, bytes received, received
        and downloaded again, sent beyond a cold fetch). The rerun needs what a whole fetch needs (the cold runs'
        median on the same link, headers and manifests included) less what was received; what it took beyond
        that had been received once already."""
        cold = [n for n, _ in b.sent.get("slow" if slow else "cold", [])]
        need = statistics.median(cold) if cold else csize
        out = []
        for got, by_kill, sent in b.kills.get(slow, []):
            again = max(sent - by_kill - (need - got), 0)
            out.append((100 * again / got, got, again, max(sent - need, 0)))
        return out

    for slow, where in ((False, "loopback"), (True, "constrained link")):
        runs = resent(slow)
        target(f"SIGKILL half-way, rerun: received and downloaded again ≤ 5 % of what was received, {where} (median)",
               statistics.median(r[0] for r in runs) if runs else None, lambda v: v <= 5.0, "{:.1f} %")
    lines += ["", "## Over-download", "",
              f"What the registry sent for `imgtool fetch` of the {csize / MB:.0f} MB of blobs (config and layers), counted "
              "by a TCP proxy in front of it as the bytes it wrote to imgtool's connections (HTTP headers and "
              "manifests included); the constrained link is the same proxy holding each connection to "
              f"{args.rate:g} MB/s. SIGKILL + rerun: killed once the proxy had sent half the blob bytes, then the same "
              "command again on the same cache and output directory; both runs counted.", "",
              "| case | runs | MB sent (median) | over the blob bytes (each run) |", "|---|---:|---:|---|"]
    for key, name in OVER_ROWS:
        got = b.sent.get(key, [])
        if not got:
            lines.append(f"| {name} | 0 | skipped | |")
            continue
        each = ", ".join(f"{100 * (n / csize - 1):+.2f} %" + (f" ({note})" if note and not note.startswith("killed") else "")
                         for n, note in got)
        lines.append(f"| {name} | {len(got)} | {statistics.median(n for n, _ in got) / MB:.1f} | {each} |")
    lines += ["", "Each SIGKILL: what imgtool's host had received by the kill (the bytes it acknowledged on the "
              "proxy's connections: TCP_INFO's bytes_acked), what of it the rerun downloaded again (the rerun's bytes "
              "less what a cold fetch on the same link needs beyond what was received), and what the registry sent "
              "beyond a cold fetch in all (also what its send queues held at the kill, which imgtool never received):",
              ""]
    for slow, where in ((False, "loopback"), (True, "constrained link")):
        runs = resent(slow)
        if runs:
            lines.append(f"- {where}: " + "; ".join(
                f"received {got / MB:.0f} MB, of it downloaded again {again / MB:.1f} MB ({pct:.1f} %), sent beyond a "
                f"cold fetch {over / MB:.1f} MB" for pct, got, again, over in runs))
    lines += ["", "## imgtool serve", "",
              "The kept bundle served by `imgtool serve` on loopback (plain HTTP); the same arm64 image pulled from the "
              "distribution registry (`docker-registry`, filesystem storage, page cache warm) through its two-arch "
              "manifest list. One untimed pull from each first (serve checks each blob's digest when it first "
              "serves it). serve / registry: the registry's median time over serve's (above 1: serve is faster). CPU: each "
              "server process's user + system seconds per batch (from /proc; the registry found by its port), median. "
              "RSS: serve's peak; the registry's after the pulls (its peak is its pushes').", "",
              "| pulls at once | serve MB/s | registry MB/s | serve / registry | serve CPU s | registry CPU s | "
              "serve peak RSS | registry RSS |", "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for n in SERVE_PULLS:
        s_t, r_t = med(b, f"pull{n}.serve"), med(b, f"pull{n}.registry")
        c, rc = b.cpu.get(f"pull{n}.serve"), b.cpu.get(f"pull{n}.registry")
        rss, r_rss = max(b.rss.get("serve", [0])), max(b.rss.get("registry", [0]))
        lines.append(f"| {n} | {n * csize / MB / s_t:.0f} | {n * csize / MB / r_t:.0f} | {r_t / s_t:.2f} | "
                     f"{statistics.median(c):.2f} | {statistics.median(rc) if rc else 0:.2f} | {rss / 1024:.0f} MiB | "
                     f"{r_rss / 1024:.0f} MiB |" if s_t and r_t and c else f"| {n} | skipped | | | | | | |")
    lines += ["", "## Peak memory (RSS) of imgtool", "",
              f"Two image sizes: {compressed_size(small_meta) / MB:.0f} MB and {csize / MB:.0f} MB compressed "
              "(the big one: the maximum over the timed runs above).", "",
              f"| command | {compressed_size(small_meta) / MB:.0f} MB image | {csize / MB:.0f} MB image |", "|---|---:|---:|"]
    for name, key in RSS_ROWS:
        small = small_rss.get(name)
        bigv = max(b.rss[key]) if b.rss.get(key) else None
        fmt = lambda kb: f"{kb / 1024:.0f} MiB" if kb else "skipped"  # noqa: E731
        lines.append(f"| imgtool {name} | {fmt(small)} | {fmt(bigv)} |")
    lines += ["", "## How to read this", "",
              "- Every fetch starts from an empty imgtool cache and an empty output directory; the registry's files are "
              "in the page cache for every tool. Outputs are real writes to the disk above: imgtool fsyncs the bundle "
              "(write-back started every 64 MiB behind the writer), skopeo fdatasyncs its blobs.",
              "- imgtool's blob cache is not fsynced (the bundle is); the benchmark deletes the cache after each run, so "
              "those pages never reach the disk here. A user keeps the cache: the kernel writes it back in the "
              "background after the fetch, and a blob torn by a power cut is caught by its digest on its way into "
              "the next bundle.",
              "- fetch writes the bundle while the layers download (blob by blob, in archive order).",
              "- fetch of the zstd image: `as-is` copies the registry's bytes; the default rewrites every zstd layer "
              "as gzip (level 1, 2 MiB members compressed in parallel) as soon as it is downloaded, then writes the "
              "bundle. A gzip image takes none of that path (its fetch row above is unchanged). The rewrite's rate is "
              "the unpacked bytes over the difference of the two medians.",
              "- verify reads the bundle from the page cache: these are CPU numbers, not disk numbers. Full verify "
              "also decompresses every layer to check its diff_id.",
              "- load: `imgtool load` checks every part's sha256, every tar header and every blob's digest in the "
              "same pass that streams the parts into Docker, holding back the last bytes until all of them matched "
              "(a mismatch cuts the upload short and Docker drops it); Docker checks diff_ids itself. Most of both "
              "times is Docker's own work (unpacking the layers).",
              f"- constrained link: imgtool opens {IMGTOOL_JOBS} connections per source (`--jobs`; at most 32 in all), "
              f"so its floor is {csize / MB:.0f} MB / ({IMGTOOL_JOBS} × {args.rate:g} MB/s) = "
              f"{csize / MB / IMGTOOL_JOBS / args.rate:.1f} s with one source and "
              f"{csize / MB / (2 * IMGTOOL_JOBS) / args.rate:.1f} s with two (each behind its own proxy); skopeo and docker "
              f"use one connection per layer, so they wait for the biggest layer: {big['size'] / MB:.0f} MB / "
              f"{args.rate:g} MB/s = {big['size'] / MB / args.rate:.1f} s.",
              "- Before every timed run the script calls sync (untimed), so no tool pays in its own fsyncs for the "
              "write-back of what the previous one left dirty (the FAQ recipe leaves gigabytes).",
              "- Peak RSS is GNU time's maximum resident set size of the imgtool process.",
              "- The image is generated (scripts/benchimage.py): each layer's files are slices of three seeded pools "
              "(code-like text ~3.6:1, binary-like bytes ~2.4:1, random bytes 1:1) in the shares of what the layer "
              "stands for; `--scale 1` is the real size. Its generation is cached and not measured.",
              "- delta: `imgtool fetch …:v2 --base` the kept `:v1` bundle, from a fresh cache: only the layers the "
              "next release changed are downloaded and written; issue 27's delta row is its bundle's bytes over the "
              "kept full bundle's.",
              "- Targets of issue 27: a ratio is imgtool's time over the anchor's (\"× faster\": the anchor's over "
              "imgtool's); a row whose anchor this run did not measure says so."]
    lines += gzip_report(b)
    if b.stage_rates:
        lines += stage_report(b, meta, b.stage_rates)
    lines += ["", "## Raw timings (seconds, in run order)", ""]
    for key, v in b.times.items():
        lines.append(f"- `{key}`: " + ", ".join(f"{x:.2f}" for x in v))
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="tiny image, one run: checks that the script works")
    p.add_argument("--scale", type=float, default=0.25,
                   help="size of the vllm-ascend-shaped image: 1 = the real one (~15 GB unpacked, ~6.5 GB gzip, "
                        "17 layers); default 0.25 (~1.6 GB gzip), the everyday run")
    p.add_argument("--small-scale", type=float, default=0, help="the second image, for the memory check (default scale/4)")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--rate", type=float, default=20.0, help="constrained link: MB/s per TCP connection")
    p.add_argument("--gzip-level", type=int, default=6)
    p.add_argument("--output", default=str(ROOT / "docs" / "benchmarks.md"))
    p.add_argument("--work-dir", default="/tmp/imgtool-bench", help="generated images (cached by seed and scale) and scratch space")
    p.add_argument("--services-dir", default="/tmp/imgtool-bench-svc")
    p.add_argument("--own-services", action="store_true", help="start own services even when IMGTOOL_TEST_* are set")
    p.add_argument("--no-faq", action="store_true", help="leave out the (slow) FAQ recipe")
    p.add_argument("--only-load", action="store_true",
                   help="only load: every Docker engine, containerd and Podman against their own load/import "
                        "(the bundle fetched once, untimed); no memory check at the small size")
    p.add_argument("--only-podman", action="store_true",
                   help="only load on each Podman of the services (4.3, and 5.8 when they run it) against its own "
                        "`podman load -i`, as --only-load does")
    p.add_argument("--only-constrained", action="store_true",
                   help="only the constrained link: imgtool from one and from two sources, skopeo (docker pull with "
                        "--docker-pull); no memory check at the small size")
    p.add_argument("--docker-pull", action=argparse.BooleanOptionalAction, default=True,
                   help="time docker pull on the constrained link (slow)")
    p.add_argument("--only-serve", action="store_true",
                   help="only serve: 1, 4 and 8 pulls from imgtool serve against the registry (the bundle fetched "
                        "once, untimed); no memory check at the small size")
    p.add_argument("--only-targets", action="store_true",
                   help="only issue 27's targets: fetch and skopeo, the delta, load on Docker 20.10, the constrained "
                        "link, the gzip rows, and the CPU per stage (what a --scale 1 run has time for)")
    p.add_argument("--only-gzip", action="store_true",
                   help="only the gzip rows (issue 27): fetch --layers compat, full verify, export (ISA-L, zlib, peers)")
    p.add_argument("--only-over", action="store_true",
                   help="only the over-download rows: bytes the registry sent for a cold fetch and for a fetch killed "
                        "half-way and run again, on loopback and on the constrained link")
    p.add_argument("--seed", default="bench1", help="the image's seed: the same seed and scale give the same tar bytes everywhere")
    args = p.parse_args(argv)
    args.only_load = args.only_load or args.only_podman
    if args.quick:
        args.scale, args.runs, args.small_scale = QUICK_SCALE, 1, QUICK_SCALE / 2
        args.rate = max(args.rate, 20.0)
    if not 0 < args.scale <= 4:
        p.error("--scale: use a number above 0, at most 4")
    small = args.small_scale or args.scale / 4
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    services_dir = Path(os.environ.get("IMGTOOL_SERVICES_DIR") or args.services_dir)
    check_disk(*disk_plan(args, (args.seed, args.scale), (args.seed + "-small", small), work, services_dir))
    started = time.monotonic()
    log(f"the test images (scale {args.scale:g} and {small:g}) in {work}")
    meta = build_image(work, args.scale, args.seed, args.gzip_level)
    small_meta = build_image(work, small, args.seed + "-small", args.gzip_level, full=False)
    log(f"image: {compressed_size(meta) / MB:.0f} MB compressed, {unpacked_size(meta) / MB:.0f} MB unpacked, "
        f"{len(arm(meta)['layers'])} layers")
    with services(args) as env:
        os.environ["DOCKER_HOST"] = env.docker_host
        info = machine()
        ns = "bench" + secrets.token_hex(3)
        log("pushing the images to the registry")
        push_image(env.registry, f"{ns}/vllm-ascend", "v1", meta)
        push_image(env.registry, f"{ns}/vllm-ascend", "v2", next_release(meta))
        push_zstd(env.registry, f"{ns}/vllm-ascend-zstd", meta, build_zstd_twin(meta))
        push_image(env.registry, f"{ns}/vllm-ascend-small", "v1", small_meta)
        small_rss: Dict[str, int] = {}
        sb = Bench(args, env, small_meta, f"{ns}/vllm-ascend-small")
        try:
            if not (args.only_load or args.only_constrained or args.only_serve or args.only_gzip or args.only_over):
                log("memory at the small size")
                small_rss = sb.run_small()
        finally:
            sb.cleanup()
        b = Bench(args, env, meta, f"{ns}/vllm-ascend")
        try:
            b.run_all()
            if not (args.only_load or args.only_constrained or args.only_serve or args.only_over):
                log("where the time goes: CPU per stage")
                b.stage_rates = stage_rates(meta)
            b.bundle_size = sum(f.stat().st_size for f in b.bundle.iterdir() if f.is_file())
            b.archive_size = b.archive_path().stat().st_size
            text = report(b, meta, small_meta, small_rss, info, args, time.monotonic() - started)
        finally:
            b.cleanup()
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(text)
    log(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
