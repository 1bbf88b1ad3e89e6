"""glibc's malloc tuned for the verbs that were measured with it: `fetch` and `export` (tune_for_downloads).

Why, in one place (docs/decisions.md 2026-12-05, docs/benchmarks.md, issue 38):
- Two arenas. glibc gives each thread that meets contention an arena of its own (up to 8 per core) and keeps
  what is freed in it: with a dozen download threads reading 256 KiB at a time, fetch's peak RSS rose with the
  connections. Two arenas: fetch of the scale-0.25 bench image 97-99 -> 82-86 MiB, the same speed; export's
  reading thread and its compressing workers likewise.
- Freed memory given back above 64 MiB. On a slow link each read fills its buffer partly and the heaps fragment:
  fetch's peak grew with the run (118 MiB from two sources on the constrained link at scale 0.25, 155 MiB at
  scale 1). A daemon thread reads /proc/self/statm four times a second and, above TRIM_ABOVE, calls
  malloc_trim(0): 72-74 MiB at 0.25, 69-79 MiB at scale 1, the same time. Trimming always made a loopback fetch
  1.6x slower (each freed page faulted in again), so below the mark nothing is done.
Other verbs run as Python does: `--help` starts no thread, and a days-long `serve` (an event loop, no download
threads) keeps glibc's defaults, which nothing measured against. Nothing on other C libraries (no mallopt),
without ctypes, or without /proc. Standard library only.
"""

import os
import threading
import time

M_ARENA_MAX = -8  # glibc's mallopt parameter
TRIM_EVERY = 0.25  # seconds between two looks at the resident memory
TRIM_ABOVE = 64 * 1024 * 1024  # resident bytes over which freed memory goes back to the system

_tuned = threading.Event()  # once per process


def tune_for_downloads() -> None:
    """Two malloc arenas and the trimming thread (the module's docstring says why); call it before the verb starts
    its threads: arenas are made as threads first allocate. Once per process; never raises."""
    if _tuned.is_set():
        return
    _tuned.set()
    try:
        import ctypes

        libc = ctypes.CDLL(None)
    except (ImportError, OSError):
        return
    try:
        libc.mallopt(M_ARENA_MAX, 2)
    except AttributeError:
        pass
    _return_freed_memory(libc, ctypes.c_size_t)


def _return_freed_memory(libc, size_t) -> None:
    try:
        trim = libc.malloc_trim
        page = os.sysconf("SC_PAGE_SIZE")
        statm = os.open("/proc/self/statm", os.O_RDONLY)
    except (AttributeError, OSError, ValueError):
        return
    trim.argtypes = [size_t]

    def loop() -> None:
        while True:
            time.sleep(TRIM_EVERY)
            if int(os.pread(statm, 64, 0).split()[1]) * page > TRIM_ABOVE:
                trim(0)

    threading.Thread(target=loop, name="malloc-trim", daemon=True).start()
