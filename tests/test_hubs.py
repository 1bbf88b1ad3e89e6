"""The model hubs as a source (imgtool/hubs/, imgtool/model_pull.py), against the loopback hubs of
tests/support/hub.py, which the real huggingface_hub and modelscope clients download from (tests/test_hub.py):
a snapshot is the hub's listing at the revision's commit, names from a hub are data, a token goes only to its own
origin, and a model's files come through the one downloader (puller.download_blobs): ranged, resumable, from
several endpoints, checked against the hub's sha256."""

import dataclasses
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import List, Optional, Sequence

import pytest

from imgtool import hubs
from imgtool.config import (HubEnvironment, MirrorConfig, ModelMirror, hf_token, hub_environment,
                            modelscope_endpoint, parse_mirrors, read_toml)
from imgtool.errors import ConfigError, ManifestError, NotFoundError, RegistryError, VerifyError
from imgtool.hubs import huggingface
from imgtool.model import Digest
from imgtool.model_pull import pull_model
from imgtool.progress import Progress
from imgtool.puller import Tuning
from imgtool.registry_answers import RetryPolicy
from imgtool.store import Store
from imgtool.weights import ModelRef, parse_model_ref
from tests.support.hub import Hub
from tests.support.models import HubModel, small_model, two_revisions

ROOT = Path(__file__).resolve().parent.parent
REPO = "imgtool-test/tiny-llm"
SHARD1 = "model-00001-of-00002.safetensors"
SHARD2 = "model-00002-of-00002.safetensors"
FAST = RetryPolicy(backoff=0.01, max_backoff=0.05)
SMALL = Tuning(big_blob=128 << 10, segment=128 << 10, request=64 << 10, min_steal=32 << 10, steal_seconds=0.0)


def endpoints(flavour: str, primary: Hub, mirrors: Sequence[Hub] = (), token: Optional[str] = None,
              mirror_token: bool = False, read_timeout: float = 60.0, min_rate: int = 1024):
    """(MirrorConfig, HubEnvironment): `primary` as the environment's endpoint ($HF_ENDPOINT, $MODELSCOPE_ENDPOINT),
    each of `mirrors` a [[model_mirrors]] entry named m1, m2, ...; no default hub (no network beyond loopback)."""
    config = MirrorConfig("quay.io/ascend/vllm-ascend", (), "mirrors.toml", read_timeout=read_timeout,
                          min_rate=min_rate,
                          model_mirrors=tuple(ModelMirror(f"m{i + 1}", flavour, m.url, insecure=True, token=mirror_token)
                                              for i, m in enumerate(mirrors)))
    if flavour == "hf":
        env = HubEnvironment(hf_endpoint=primary.url, hf_token=token, hf_default=None, modelscope_default=None)
    else:
        env = HubEnvironment(modelscope_endpoint=primary.url, modelscope_token=token, hf_default=None,
                             modelscope_default=None)
    return config, env


def ref_of(flavour: str, revision: Optional[str] = None) -> ModelRef:
    return parse_model_ref(f"{flavour}:{REPO}" + (f"@{revision}" if revision else ""))


def resolved(flavour: str, primary: Hub, revision: Optional[str] = None, **kw) -> hubs.HubResolution:
    ref = ref_of(flavour, revision)
    config, env = endpoints(flavour, primary, **kw)
    return hubs.resolve(ref, hubs.open_hubs(ref, config, env, retry=FAST))


def file_gets(hub: Hub, path: str, server: Optional[str] = None) -> List:
    """The GETs of a file's bytes (Hugging Face's resolve, ModelScope's repo?FilePath=, the bridge's)."""
    out = []
    for r in hub.requests:
        if r.method != "GET" or (server and r.server != server):
            continue
        if r.server == "bridge" and r.route.endswith("/" + path):
            out.append(r)
        elif "/resolve/" in r.route and r.route.endswith("/" + path):
            out.append(r)
        elif r.query.get("FilePath") == path:
            out.append(r)
    return out


def assert_store_holds(store: Store, res: hubs.HubResolution, model: HubModel) -> None:
    rev = model.resolve(res.commit)
    assert rev is not None
    for f in res.snapshot.files:
        assert f.sha256 is not None and store.has(f.sha256, f.size), f.path
        assert store.blob_path(f.sha256).read_bytes() == rev.files[f.path].read(), f.path


# --- snapshots --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("flavour", ["hf", "modelscope"])
def test_a_snapshot_is_the_hubs_listing_at_the_revisions_commit(flavour, tmp_path):
    model = two_revisions(seed=48)
    with Hub([model], flavour=flavour, page_size=3) as hub:  # HF: the tree listing in pages of 3
        for revision, name in ((None, "main"), ("v1", "v1")):
            res = resolved(flavour, hub, revision)
            rev = model.revisions[model.refs[name]]
            assert res.commit == rev.commit
            listed = {f.path: (f.size, f.sha256.hex if f.sha256 else None, f.git_oid, f.lfs) for f in res.snapshot.files}
            # Hugging Face gives an LFS file's sha256 and every file's git blob id; ModelScope every file's sha256
            assert listed == {p: (f.size, f.sha256 if (flavour == "modelscope" or f.lfs) else None,
                                  f.blob_id if flavour == "hf" else None, f.lfs) for p, f in rev.files.items()}
            store = Store(tmp_path / f"cache-{name}")
            res = res.complete(store)  # the small git files: downloaded, checked by git blob id, hashed
            assert {f.path: f.sha256.hex for f in res.snapshot.files if f.sha256} == {p: f.sha256 for p, f in rev.files.items()}
            stats = pull_model(res, store, Progress(), jobs=2, tuning=SMALL)
            assert_store_holds(store, res, model)
            assert stats.blobs_downloaded == sum(1 for f in rev.files.values() if f.lfs or flavour == "modelscope")
    if flavour == "hf":
        tree = [r for r in hub.requests if "/tree/" in r.route]
        assert len(tree) > 2 and all(r.query.get("recursive") == "true" for r in tree)  # followed rel="next"


@pytest.mark.parametrize("flavour", ["hf", "modelscope"])
def test_an_unknown_model_or_revision_is_not_found_naming_the_revision_and_the_model(flavour):
    token = "set HF_TOKEN (or log in with `hf auth login`)" if flavour == "hf" else "set MODELSCOPE_API_TOKEN"
    with Hub([small_model(seed=48)], flavour=flavour) as hub, Hub([small_model(seed=48)], flavour=flavour) as mirror:
        host, other = hub.url[7:], mirror.url[7:]
        revision = "(HTTP 404 RevisionNotFound)" if flavour == "hf" else "(not among the model's branches and tags)"
        with pytest.raises(NotFoundError) as e:
            resolved(flavour, hub, "nope", mirrors=[mirror])
        assert e.value.message == (f"{flavour}:{REPO}@nope: not found on {host} (no such revision {revision}), "
                                   f"{other} (no such revision {revision})")
        assert e.value.hint == ("check the revision 'nope' (a branch, tag or commit of the model) and the model name "
                                f"'{REPO}' on the hub; a gated or private model is not found without its token: {token}")
        assert e.value.exit_code == 4
        default = "main" if flavour == "hf" else "master"
        said = "HTTP 404 RepoNotFound" if flavour == "hf" else f"HTTP 404 model {REPO}-x not found"
        with pytest.raises(NotFoundError) as e:
            hubs.resolve(parse_model_ref(f"{flavour}:{REPO}-x"),
                         hubs.open_hubs(parse_model_ref(f"{flavour}:{REPO}-x"), *endpoints(flavour, hub), retry=FAST))
        assert e.value.message == f"{flavour}:{REPO}-x@{default}: not found on {host} (no such model ({said}))"
        assert e.value.hint == (f"check the revision '{default}' (a branch, tag or commit of the model) and the model "
                                f"name '{REPO}-x' on the hub; a gated or private model is not found without its token: "
                                f"{token}")


@pytest.mark.parametrize("name, why", [("../evil.json", "a `.`, `..` or empty component"),
                                       ("/etc/evil.json", "an absolute path"),
                                       ("a\x1bb.json", "a control character in the name")])
@pytest.mark.parametrize("flavour", ["hf", "modelscope"])
def test_a_name_from_the_hub_that_is_not_a_safe_path_is_refused(flavour, name, why):
    with Hub([small_model(seed=48)], flavour=flavour) as hub:
        hub.faults.extra_files[name] = b"{}"
        with pytest.raises(ManifestError) as e:
            resolved(flavour, hub)
        assert e.value.message == (f"{hub.url[7:]}: {flavour}:{REPO}: the hub lists {name!r}, {why}: not a file name "
                                   "imgtool places")
        assert e.value.exit_code == 4
        assert not file_gets(hub, name)  # nothing asked for under that name


# --- what is downloaded and checked --------------------------------------------------------------------------

@pytest.mark.parametrize("flavour, path, lfs", [("hf", SHARD1, True), ("hf", "config.json", False),
                                               ("modelscope", SHARD1, True), ("modelscope", "config.json", False)])
def test_a_lying_sha256_is_refused_naming_the_file(flavour, path, lfs, tmp_path):
    model = small_model(seed=48)
    lie = "0" * 64
    with Hub([model], flavour=flavour) as hub:
        hub.faults.lie_sha256[path] = lie
        res = resolved(flavour, hub)
        store = Store(tmp_path / "cache")
        with pytest.raises(VerifyError) as e:
            res = res.complete(store)
            pull_model(res, store, Progress(), tuning=SMALL)
        if lfs or flavour == "modelscope":  # its bytes never hash to the sha256 listed (ModelScope lists every file's)
            assert e.value.message == (f"{flavour}:{REPO}: {path}: the bytes the hub serves do not match the sha256 it lists "
                                       f"(sha256:{lie}), 3 times; refused")
        else:  # a small git file: its bytes are not the git blob the listing names
            actual = model.head.files[path].blob_id
            claimed = hub.claimed_blob_id(model.head.files[path])
            assert e.value.message == (f"hf:{REPO}: {path}: its bytes have git blob id {actual}, the hub lists "
                                       f"{claimed}; refused")
        assert e.value.exit_code == 3
        assert not store.has(Digest("sha256", lie))


def test_a_modelscope_revision_without_a_commit_is_pinned_by_its_name_and_listing(tmp_path):
    old, new = small_model(seed=48), two_revisions(seed=48)  # new's master differs from old's in one shard
    with Hub([old], flavour="modelscope") as hub:
        hub.faults.commit_ids = False  # /revisions names the branches, no commit ids
        res = resolved("modelscope", hub)
        assert (res.commit, res.pinned) == ("master", False)
        locked = res.listing_digest()
        res.hold_to(locked)  # the same files: held
        store = Store(tmp_path / "cache")
        pull_model(res.complete(store), store, Progress(), tuning=SMALL)
        assert_store_holds(store, res, old)
        hub.models[REPO] = new  # the branch moved, and the hub still says no commit
        moved = resolved("modelscope", hub)
        assert moved.commit == "master"
        with pytest.raises(VerifyError) as e:
            moved.hold_to(locked)
        assert e.value.message == (f"modelscope:{REPO}: the files under revision 'master' (the hub gives no commit for "
                                   f"it) are not the ones locked: listing {moved.listing_digest().short}, the lock has "
                                   f"{locked.short}; refused")
        assert e.value.hint == "lock again to take the new files, or name a revision that does not move (a tag)"
        assert e.value.exit_code == 3
        hub.faults.commit_ids = True
        assert resolved("modelscope", hub).pinned  # with a commit id, the commit is the pin


def test_a_file_that_grows_is_refused(tmp_path):
    model = small_model(seed=48)
    with Hub([model], flavour="hf") as hub:
        res = resolved("hf", hub)
        store = Store(tmp_path / "cache")
        res = res.complete(store)
        hub.faults.grow[SHARD2] = 1000
        with pytest.raises(VerifyError) as e:
            pull_model(res, store, Progress(), tuning=SMALL)
        size = model.head.files[SHARD2].size
        assert e.value.message == (f"hf:{REPO}: {SHARD2}: the hub serves {size + 1000} bytes where its listing says "
                                   f"{size}: the file changed under commit {res.commit[:12]}; refused")
        assert e.value.exit_code == 3


def test_a_second_run_downloads_nothing_the_small_git_files_included(tmp_path):
    model = small_model(seed=48)
    small = [p for p, f in model.head.files.items() if not f.lfs]
    with Hub([model], flavour="hf") as hub:
        store = Store(tmp_path / "cache")
        res = resolved("hf", hub).complete(store)
        pull_model(res, store, Progress(), tuning=SMALL)
        assert all(len(file_gets(hub, p)) == 1 for p in small)  # hashed as they arrived: no sha256 in the listing
        hub.clear()
        again = resolved("hf", hub).complete(store)
        stats = pull_model(again, store, Progress(), tuning=SMALL)
        assert not [r.path for r in hub.requests if not r.path.startswith("/api/")]  # no file asked for again
        assert again.snapshot == res.snapshot and stats.blobs_downloaded == 0
        assert_store_holds(store, again, model)
        # the record is a hint: a blob whose bytes are not the git blob any more is downloaded again
        config = next(f for f in res.snapshot.files if f.path == "config.json")
        assert config.sha256 is not None
        path = store.blob_path(config.sha256)
        path.chmod(0o644)
        path.write_bytes(b"{}" + path.read_bytes()[2:])
        hub.clear()
        third = resolved("hf", hub).complete(store)
        assert [r.route.rsplit("/", 1)[-1] for r in hub.requests if not r.path.startswith("/api/")] == ["config.json"]
        assert_store_holds(store, third, model)


@pytest.mark.parametrize("flavour", ["hf", "modelscope"])
def test_the_token_goes_to_the_hub_and_never_to_the_storage_bridge(flavour, tmp_path):
    model = small_model(seed=48)
    with Hub([model], flavour=flavour) as hub:
        hub.faults.redirect = True  # LFS files answer 302 to the bridge (another host), which refuses a login
        hub.faults.token = "secret-48"  # gated: every hub request needs the token
        res = resolved(flavour, hub, token="secret-48")
        store = Store(tmp_path / "cache")
        res = res.complete(store)
        pull_model(res, store, Progress(), tuning=SMALL)
        assert_store_holds(store, res, model)
        bridge, mine = hub.requests_to("bridge"), hub.requests_to("hub")
        assert bridge and all(r.status in (200, 206) for r in bridge)
        assert not [r for r in bridge if "authorization" in r.headers or "cookie" in r.headers]
        assert all(r.headers.get("authorization") == "Bearer secret-48" for r in mine)
        if flavour == "modelscope":
            assert all(r.headers.get("cookie") == "m_session_id=secret-48" for r in mine)


def test_a_gated_model_without_a_token_says_how_to_give_one():
    with Hub([small_model(seed=48)], flavour="hf") as hub:
        hub.faults.token = "secret-48"
        with pytest.raises(RegistryError) as e:
            resolved("hf", hub)
        assert e.value.message == (f"no source can serve hf:{REPO}: HF_ENDPOINT ({hub.url}): {hub.url[7:]}: "
                                   f"hf:{REPO} revision main: refused without a token (HTTP 401 GatedRepo Access to "
                                   "this model is restricted.): the model is gated or private")
        assert e.value.hint == huggingface.LOGIN_HINT
        assert e.value.exit_code == 4


@pytest.mark.parametrize("flavour", ["hf", "modelscope"])
def test_a_server_ignoring_range_still_gives_every_file(flavour, tmp_path):
    model = small_model(seed=48, shard_bytes=512 << 10)
    with Hub([model], flavour=flavour) as hub:
        hub.faults.honour_range = False
        res = resolved(flavour, hub)
        store = Store(tmp_path / "cache")
        res = res.complete(store)
        stats = pull_model(res, store, Progress(), jobs=3, tuning=SMALL)
        assert_store_holds(store, res, model)
        gets = file_gets(hub, SHARD1)
        assert len(gets) >= 4 and {r.status for r in gets} == {200}  # a range per request, answered whole each time
        assert any(r.range and not r.range.startswith("bytes=0-") for r in gets)
        assert sum(stats.per_source.values()) == sum(f.size for f in res.snapshot.files if f.lfs or flavour != "hf")


def test_429_and_5xx_are_tried_again_honouring_retry_after(tmp_path):
    model = small_model(seed=48)
    with Hub([model], flavour="hf") as hub:
        hub.faults.fail(1, 429, retry_after=1, match=lambda m, p: "/revision/" in p)
        hub.faults.fail(2, 502, match=lambda m, p: "/tree/" in p)
        hub.faults.fail(2, 503, match=lambda m, p: p.endswith(SHARD1))
        hub.faults.fail(1, 500, match=lambda m, p: p.endswith("config.json"))
        start = time.monotonic()
        res = resolved("hf", hub)
        assert time.monotonic() - start >= 1.0  # the Retry-After was waited for
        store = Store(tmp_path / "cache")
        res = res.complete(store)
        pull_model(res, store, Progress(), tuning=SMALL)
        assert_store_holds(store, res, model)
        statuses = [r.status for r in hub.requests]
        assert statuses.count(429) == 1 and statuses.count(502) == 2 and statuses.count(503) == 2
        assert statuses.count(500) == 1


def test_a_dripping_source_below_the_minimum_rate_ends_with_a_clear_error(tmp_path):
    model = small_model(seed=48, shard_bytes=256 << 10)
    with Hub([model], flavour="hf") as hub:
        res = resolved("hf", hub, read_timeout=0.5, min_rate=1 << 20)
        store = Store(tmp_path / "cache")
        res = res.complete(store)
        hub.faults.drip = 20_000  # bytes a second, under the 1 MiB/s asked for
        start = time.monotonic()
        with pytest.raises(RegistryError) as e:
            pull_model(res, store, Progress(), jobs=2, tuning=SMALL)
        assert time.monotonic() - start < 30
        host = hub.url[7:]
        assert re.fullmatch(rf"every source failed: HF_ENDPOINT \({re.escape(hub.url)}\): {re.escape(host)}: sent too "
                            rf"slowly: \d+ bytes in 1 s, under 1048576 bytes/s \(\$IMGTOOL_MIN_RATE\)", e.value.message), \
            e.value.message
        assert e.value.exit_code == 4


# --- resume, and several endpoints -------------------------------------------------------------------------------

_KILLED = """
import sys
from pathlib import Path
from tests.test_hubs import resolved_url, Store, pull_model, Progress, Tuning
res = resolved_url(sys.argv[1])
store = Store(Path(sys.argv[2]))
pull_model(res.complete(store), store, Progress(), jobs=4, tuning=Tuning(big_blob=256 << 10, segment=256 << 10,
           request=64 << 10))
"""


def resolved_url(url: str) -> hubs.HubResolution:
    """A resolution of REPO at the Hugging Face endpoint `url` (the killed process of the test below)."""
    ref = ref_of("hf")
    config = MirrorConfig("quay.io/ascend/vllm-ascend", (), "mirrors.toml")
    env = HubEnvironment(hf_endpoint=url, hf_default=None, modelscope_default=None)
    return hubs.resolve(ref, hubs.open_hubs(ref, config, env, retry=FAST))


def test_a_killed_download_resumes_in_a_later_process_asking_only_for_the_rest(tmp_path):
    # one shard of ~8.4 MB, in ranges over four connections: half of it on disk long before it is whole, and 5 % of
    # that half outweighs what is in flight at the kill
    model = small_model(seed=48, shards=1, shard_bytes=8 << 20)
    shards = [model.head.files["model-00001-of-00001.safetensors"]]
    total = sum(f.size for f in shards)
    with Hub([model], flavour="hf") as hub:
        cache = tmp_path / "cache"
        store = Store(cache)

        def on_disk() -> int:
            return sum(store.partial_bytes(Digest("sha256", f.sha256), f.size) for f in shards)

        hub.faults.drip = 400_000  # per response: the four connections together ~1.6 MB/s
        p = subprocess.Popen([sys.executable, "-c", _KILLED, hub.url, str(cache)], cwd=str(ROOT),
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            deadline = time.monotonic() + 60
            while p.poll() is None and time.monotonic() < deadline and on_disk() < total // 2:
                time.sleep(0.05)
        finally:
            p.kill()  # SIGKILL: no cleanup runs
            _, err = p.communicate()
        assert p.returncode == -signal.SIGKILL, err.decode()
        kept = on_disk()
        assert total // 3 <= kept < total, (kept, total)
        first = sum(r.sent for f in shards for r in file_gets(hub, f.path))
        hub.faults.drip = 0
        hub.clear()
        res = resolved_url(hub.url)
        res = res.complete(store)
        stats = pull_model(res, store, Progress(), jobs=4, tuning=SMALL)
        second = sum(r.sent for f in shards for r in file_gets(hub, f.path))
        assert second == total - kept, (first, kept, second, total)  # only what was not on disk is asked for again
        assert stats.resumed_bytes == kept
        # the goal: of what the killed run received, at most 5 % is downloaded again (what was in flight)
        assert first + second - total <= 0.05 * first, (first, kept, second, total)
        assert_store_holds(store, res, model)


def test_two_endpoints_serve_one_file_together_the_faster_more_and_a_stale_one_none(tmp_path):
    model = small_model(seed=48, shard_bytes=1 << 20)
    with Hub([model], flavour="hf") as fast, Hub([model], flavour="hf") as slow, \
            Hub([two_revisions(seed=48)], flavour="hf") as stale:  # its main is another commit
        slow.faults.drip = 150_000
        res = resolved("hf", fast, mirrors=[slow, stale])
        assert res.commit == model.refs["main"]
        assert [h.name for h in res.hubs] in (["HF_ENDPOINT", "m1"], ["m1", "HF_ENDPOINT"])
        assert res.warnings == [f"mirror m2 says main is {stale.models[REPO].refs['main'][:12]}, not "
                                f"{res.commit[:12]} (a stale mirror?): not used for this model"]
        store = Store(tmp_path / "cache")
        res = res.complete(store)
        stats = pull_model(res, store, Progress(), jobs=2, tuning=SMALL)
        assert_store_holds(store, res, model)
        assert stats.per_source["HF_ENDPOINT"] > stats.per_source["m1"] > 0
        split = [p for p in (SHARD1, SHARD2)
                 if sum(r.sent for r in file_gets(fast, p)) and sum(r.sent for r in file_gets(slow, p))]
        assert split, "no file came from both endpoints"
        assert not file_gets(stale, SHARD1) and not file_gets(stale, SHARD2)


def test_a_slow_download_keeps_every_connection_busy_to_the_end(tmp_path):
    """One 2.25 MiB file in three ranges over 16 connections held to 128 KB/s each. Before, each range's first
    request asked for `request` (512 KiB here, 16 MiB at full size), and an idle connection can never take a byte of
    a request sent: five connections worked for 4 s, the other eleven idled. Now no request asks for more than its
    share of what nobody has asked for yet: the connections take each other's back halves and finish together."""
    model = small_model(seed=48, shards=1, shard_bytes=(2 << 20) + (256 << 10))
    shard = "model-00001-of-00001.safetensors"
    with Hub([model], flavour="hf") as hub:
        res = resolved("hf", hub)
        store = Store(tmp_path / "cache")
        res = res.complete(store)
        size = model.head.files[shard].size
        hub.faults.drip = 128_000
        start = time.monotonic()
        stats = pull_model(res, store, Progress(), jobs=16, tuning=Tuning(
            big_blob=1 << 20, segment=1 << 20, request=512 << 10, min_steal=32 << 10, steal_seconds=0.05))
        took = time.monotonic() - start
        assert_store_holds(store, res, model)
        assert sum(r.sent for r in file_gets(hub, shard)) == size  # every byte asked for once
        assert stats.bytes_downloaded == size
        # 512 KiB at 128 KB/s is 4.1 s; the whole file over 16 connections 1.2 s, and the requests' round trips
        assert took < 3.0, took


def test_one_endpoint_of_two_ignoring_range_still_serves_its_share(tmp_path):
    model = small_model(seed=48, shard_bytes=1 << 20)
    with Hub([model], flavour="hf") as ranged, Hub([model], flavour="hf") as whole:
        whole.faults.honour_range = False  # answers every ranged GET with 200 and the whole file
        res = resolved("hf", ranged, mirrors=[whole])
        store = Store(tmp_path / "cache")
        res = res.complete(store)
        stats = pull_model(res, store, Progress(), jobs=2, tuning=SMALL)
        assert_store_holds(store, res, model)
        ignored = [r for p in (SHARD1, SHARD2) for r in file_gets(whole, p) if r.range]
        assert ignored and {r.status for r in ignored} == {200}
        assert stats.per_source["HF_ENDPOINT"] > 0 and stats.per_source["m1"] > 0  # both gave bytes that were kept
        assert sum(stats.per_source.values()) == sum(f.size for f in res.snapshot.files if f.lfs)


def test_the_token_goes_to_a_mirror_only_when_mirrors_toml_says_so():
    with Hub([small_model(seed=48)], flavour="hf") as primary, Hub([small_model(seed=48)], flavour="hf") as mirror:
        for send in (False, True):
            primary.clear()
            mirror.clear()
            resolved("hf", primary, mirrors=[mirror], token="secret-48", mirror_token=send)
            assert all(r.headers.get("authorization") == "Bearer secret-48" for r in primary.requests)
            assert mirror.requests
            assert all(("authorization" in r.headers) == send for r in mirror.requests)


def test_a_dead_proxy_is_named_as_the_registry_room_names_it(monkeypatch):
    # one transport set-up for both rooms (imgtool/transport.py): the hub names the proxy and its variable too
    for name in ("http_proxy", "https_proxy", "all_proxy", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:1")
    with Hub([small_model(seed=48)], flavour="hf") as hub:
        with pytest.raises(RegistryError) as e:
            resolved("hf", hub)
        host = hub.url[7:]
        assert e.value.message == (f"no source can serve hf:{REPO}: HF_ENDPOINT ({hub.url}): cannot reach the proxy "
                                   f"http://127.0.0.1:1 (from $http_proxy) for {host}: connection refused")
        assert e.value.hint == "check that variable (or unset it), or name this hub in $no_proxy to connect directly"
        assert e.value.exit_code == 4
        assert not hub.requests


# --- the environment and mirrors.toml ----------------------------------------------------------------------------

def test_the_hf_token_comes_from_hf_token_else_the_clients_token_file(tmp_path, monkeypatch):
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_TOKEN_PATH", "HF_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert hf_token() is None
    (tmp_path / ".cache" / "huggingface").mkdir(parents=True)
    (tmp_path / ".cache" / "huggingface" / "token").write_text("hf_default\r\n")
    assert hf_token() == "hf_default"
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hfhome"))
    assert hf_token() is None
    (tmp_path / "hfhome").mkdir()
    (tmp_path / "hfhome" / "token").write_text("hf_home\n")
    assert hf_token() == "hf_home"
    monkeypatch.setenv("HF_TOKEN_PATH", str(tmp_path / "elsewhere"))
    (tmp_path / "elsewhere").write_text("hf_path")
    assert hf_token() == "hf_path"
    monkeypatch.setenv("HF_TOKEN", "hf_env")
    assert hf_token() == "hf_env"


def test_modelscope_endpoint_as_its_client_reads_it(monkeypatch):
    monkeypatch.delenv("MODELSCOPE_ENDPOINT", raising=False)
    monkeypatch.setenv("MODELSCOPE_DOMAIN", "http://127.0.0.1:9")
    assert modelscope_endpoint() == "http://127.0.0.1:9"  # a value with its scheme is used as given
    monkeypatch.setenv("MODELSCOPE_DOMAIN", "www.modelscope.cn")
    assert modelscope_endpoint() == "https://www.modelscope.cn"
    monkeypatch.setenv("MODELSCOPE_ENDPOINT", "https://modelscope.ai/")
    assert modelscope_endpoint() == "https://modelscope.ai"


@pytest.mark.parametrize("variable", ["MODELSCOPE_DOMAIN", "MODELSCOPE_ENDPOINT"])
def test_the_modelscope_endpoint_is_named_by_the_variable_the_user_set(variable, monkeypatch):
    # modelscope's client reads $MODELSCOPE_DOMAIN, its successor modelscope_hub $MODELSCOPE_ENDPOINT first: a message
    # names the one that was set (before: MODELSCOPE_ENDPOINT always, a variable a modelscope user never set)
    for name in ("MODELSCOPE_DOMAIN", "MODELSCOPE_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(variable, "http://127.0.0.1:9")
    env = dataclasses.replace(hub_environment(), hf_default=None, modelscope_default=None)
    ref = ref_of("modelscope")
    config = MirrorConfig("quay.io/ascend/vllm-ascend", (), "mirrors.toml")
    with pytest.raises(RegistryError) as e:
        hubs.resolve(ref, hubs.open_hubs(ref, config, env, retry=FAST))
    assert e.value.message == (f"no source can serve modelscope:{REPO}: {variable} (http://127.0.0.1:9): "
                               "127.0.0.1:9: connection refused")
    assert e.value.exit_code == 4


def test_model_mirrors_in_mirrors_toml(tmp_path):
    path = tmp_path / "mirrors.toml"
    path.write_text('default_image = "quay.io/ascend/vllm-ascend"\n\n[[model_mirrors]]\nname = "hf-mirror"\nhub = "hf"\n'
                    'url = "https://hf-mirror.com/"\ntoken = true\n\n[[model_mirrors]]\nname = "gh"\nhub = "github"\n'
                    'url = "https://example.com"\n')
    with pytest.raises(ConfigError) as e:
        parse_mirrors(*read_toml(path), path)
    assert e.value.message == f'{path}:11: model_mirrors[1]: invalid hub \'github\': "hf" (Hugging Face) or "modelscope"'
    assert e.value.exit_code == 2
    path.write_text(path.read_text().replace('"github"', '"modelscope"'))
    config = parse_mirrors(*read_toml(path), path)
    assert config.model_mirrors == (ModelMirror("hf-mirror", "hf", "https://hf-mirror.com", token=True),
                                    ModelMirror("gh", "modelscope", "https://example.com"))
    ref = ref_of("hf")
    env = HubEnvironment(hf_endpoint="https://hf-mirror.com", hf_token="t")
    found = hubs.open_hubs(ref, config, env)
    # $HF_ENDPOINT and the mirror entry are one endpoint; the hub itself is the upstream
    assert [(h.name, h.http.base_url, h.upstream, h.http.has_login) for h in found] == [
        ("HF_ENDPOINT", "https://hf-mirror.com", False, True), ("huggingface.co", "https://huggingface.co", True, True)]
    assert [h.name for h in hubs.open_hubs(ref, config, env, only="huggingface.co")] == ["huggingface.co"]
