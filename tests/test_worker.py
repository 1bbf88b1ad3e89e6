"""imgtool.worker: every background thread ends, its error reaches the caller, nobody blocks.

The second half fails a worker inside each command that uses one (verify's part and layer
workers, load's member hashes, the writer's archive hash) and checks that the command ends
with that error, leaves no thread behind, and writes or loads nothing.
"""

import shutil
import threading

import pytest

from imgtool import load as load_mod
from imgtool.bundle import archive, reader, writer
from imgtool.bundle.verify import verify_bundle
from imgtool.progress import Progress
from imgtool.worker import Worker
from tests.support.bundles import BlobDir, parts_of, write

REPO = "quay.io/ascend/vllm-ascend"


class Boom(Exception):
    pass


def ends_within(seconds, fn, *args, **kwargs):
    """Run fn on a thread; fail (instead of hanging the suite) when it does not end in time."""
    out = {}

    def run():
        try:
            out["value"] = fn(*args, **kwargs)
        except BaseException as e:
            out["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"{fn.__name__} did not end within {seconds} s: a worker is waiting for ever"
    return out


def worker_threads():
    """imgtool's worker threads alive now that were not when this test began (an earlier test in the same pytest
    process may have left one: a fresh-clone CI run once saw a part-sha256 thread here that this test's verify had
    not started; which test leaves it is not found yet)."""
    names = ("part-sha256", "archive-sha256", "member-sha256", "diff-id-", "part-sync")
    return [t.name for t in threading.enumerate() if t.name.startswith(names) and t not in _EARLIER]


_EARLIER: set = set()


@pytest.fixture(autouse=True)
def _earlier_threads():
    _EARLIER.clear()
    _EARLIER.update(threading.enumerate())
    yield


def test_result_and_error_come_back_to_the_caller():
    w = Worker(lambda feed: sum(feed), "sum")
    for i in range(10):
        w.put(i)
    assert w.result() == 45
    bad = Worker(lambda feed: [1 for x in feed if x > 2 and (_ for _ in ()).throw(Boom(x))], "boom")
    for i in range(5):
        bad.put(i)
    with pytest.raises(Boom):
        bad.result()


def test_a_worker_that_stops_early_never_blocks_its_feeder():
    def first_only(feed):
        for item in feed:
            raise Boom(item)

    w = Worker(first_only, "early", maxsize=1)
    out = ends_within(10, lambda: [w.put(b"x" * 1024) for _ in range(200)])  # far more than the queue holds
    assert "error" not in out
    with pytest.raises(Boom):
        w.result()


def test_the_context_manager_joins_on_every_path():
    started = threading.Event()

    def wait_for_end(feed):
        started.set()
        return len(list(feed))

    with pytest.raises(KeyError):
        with Worker(wait_for_end, "ctx") as w:
            started.wait(5)
            w.put(1)
            raise KeyError("the caller's own error wins")
    assert not w._thread.is_alive()
    with pytest.raises(Boom):  # a clean exit still reports the worker's error
        with Worker(lambda feed: (_ for _ in ()).throw(Boom()), "ctx2"):
            pass


def test_feed_reads_like_a_file():
    w = Worker(lambda feed: (feed.read(3), feed.read(), feed.read(), feed.read()), "read")
    w.put(b"abcdef")
    w.put(b"gh")
    assert w.result() == (b"abc", b"def", b"gh", b"")


# --- a failure inside each command's worker ends the command with it -------------------------


@pytest.fixture
def bundle(factory, tmp_path):
    store = BlobDir(tmp_path / "blobs")
    out = tmp_path / "b"
    write(out, [store.pulled(factory.image("arm64", layers=3), f"{REPO}:v1")], store, chunk_size=1 << 20)
    return out


def test_verify_ends_when_a_layer_worker_fails(bundle, monkeypatch):
    def broken(raw, compression):  # the reader decompresses only layers through this (the archive: reader's)
        raise Boom("layer worker")

    monkeypatch.setattr(archive, "decompressed", broken)
    out = ends_within(60, verify_bundle, bundle, progress=Progress())
    assert isinstance(out.get("error"), Boom), out
    assert worker_threads() == []


def test_verify_ends_when_a_part_hash_worker_fails(bundle, monkeypatch):
    def broken(feed):
        for _ in feed:
            raise Boom("part hash")

    monkeypatch.setattr(reader, "sha256_of", broken)
    out = ends_within(60, verify_bundle, bundle, progress=Progress())
    assert isinstance(out.get("error"), Boom), out
    assert worker_threads() == []


def test_the_writer_ends_when_its_archive_hash_fails_and_leaves_no_part(factory, tmp_path, monkeypatch):
    def broken(feed):
        for _ in feed:
            raise Boom("archive hash")

    monkeypatch.setattr(writer, "sha256_of", broken)
    store = BlobDir(tmp_path / "blobs")
    out = tmp_path / "b"
    pulled = store.pulled(factory.image("arm64", layers=2), f"{REPO}:v1")
    result = ends_within(60, write, out, [pulled], store, chunk_size=1 << 20)
    assert isinstance(result.get("error"), Boom), result
    assert not out.exists() or list(out.iterdir()) == []
    assert worker_threads() == []


@pytest.mark.engines(stores=True)
def test_load_ends_when_the_member_hash_worker_fails_and_docker_keeps_nothing(bundle, services, docker_cli,
                                                                              monkeypatch, tmp_path):
    from imgtool.runtimes.docker import open_daemon

    def broken(feed):
        for _ in feed:
            raise Boom("member hash")

    monkeypatch.setattr(archive, "_bad_members", broken)
    monkeypatch.setenv("DOCKER_HOST", services.docker_host)
    before = docker_cli.image_ids()
    daemon = open_daemon()
    try:
        out = ends_within(120, load_mod.load_bundle, bundle, daemon, progress=Progress(), arch="arm64")
    finally:
        daemon.close()
    assert isinstance(out.get("error"), Boom), out
    assert docker_cli.image_ids() == before
    assert worker_threads() == []
    assert len(parts_of(bundle)) >= 3
    shutil.rmtree(bundle)
