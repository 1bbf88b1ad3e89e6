"""store.Store: a waiter for a blob wakes when it is published, or when its producer gives up; no polling."""

import threading

from imgtool.model import Digest
from imgtool.store import Store


def test_wait_for_wakes_on_publish_and_on_give_up(tmp_path):
    store = Store(tmp_path / "cache")
    data = b"a layer, more or less"
    digest = Digest.of(data)
    woke = {}

    def wait(name, give_up):
        woke[name] = store.wait_for(digest, give_up)

    waiter = threading.Thread(target=wait, args=("published", lambda: False))
    waiter.start()
    waiter.join(0.2)
    assert waiter.is_alive()  # nothing arrived: it waits (on a Condition, not a sleep loop)
    store.put_bytes(data)  # publishing announces it
    waiter.join(10)
    assert not waiter.is_alive() and woke["published"] is True

    other = Digest.of(b"never comes")
    stopped = threading.Event()
    giver = threading.Thread(target=lambda: woke.__setitem__("gave up", store.wait_for(other, stopped.is_set)))
    giver.start()
    giver.join(0.2)
    assert giver.is_alive()
    stopped.set()
    store.announce()  # the producer stopping announces too
    giver.join(10)
    assert not giver.is_alive() and woke["gave up"] is False


def test_a_store_built_ahead_makes_its_directories_only_when_asked(tmp_path):
    # cli.py builds the store before the verb checks its input: bad input must leave nothing behind
    store = Store(tmp_path / "cache", create=False)
    assert not (tmp_path / "cache").exists()
    store.create()
    store.create()  # idempotent: fetch, lock and inspect each make sure
    assert sorted(p.relative_to(store.root).as_posix() for p in store.root.rglob("*")) == [
        "blobs", "blobs/sha256", "diffids", "locks", "partial", "partial/sha256"]
