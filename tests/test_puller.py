"""The registry side against real distribution registries: mirrors, auth, platforms, blobs.

Mirrors are local registries standing in for quay.io (plain), DaoCloud (prefix path on
`mirror`) and NJU (host swap on `mirror`); faults come from a proxy in front of them.
"""

import base64
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from imgtool.config import load_mirrors
from imgtool.errors import RegistryError, UsageError
from imgtool.resolve import resolve_refs
from imgtool.model import Digest, Platform
from imgtool.progress import Progress
from imgtool.puller import PullStats, Tuning, download
from imgtool.resolve import resolve_image
from imgtool.store import Store
from tests.support import zygote
from tests.support.proxy import Fault, FaultProxy, blob_path
from tests.support.registry import push_image

ROOT = Path(__file__).resolve().parent.parent
DEAD = "http://127.0.0.1:1"  # nothing listens on port 1: an upstream that is down


class Notes(Progress):
    """Collects what the core reports, for assertions."""

    def __init__(self):
        self.lines = []

    def note(self, message):
        self.lines.append(message)

    def warn(self, message):
        self.lines.append("warning: " + message)


def mirrors_file(tmp_path, default_image, entries):
    """Write a mirrors.toml; entries are (name, url, prefix, extra-lines)."""
    out = [f'default_image = "{default_image}"']
    for name, url, prefix, *extra in entries:
        out.append(f'[[mirrors]]\nname = "{name}"\nregistry = "quay.io"\nurl = "{url}"')
        if name == "quay":
            out.append("upstream = true")
        if url.startswith("http://"):
            out.append("insecure = true")
        if prefix:
            out.append(f'prefix = "{prefix}"')
        out.extend(extra)
    path = tmp_path / "mirrors.toml"
    path.write_text("\n".join(out) + "\n")
    return path


def standard_mirrors(tmp_path, services, ms, upstream=None):
    return mirrors_file(tmp_path, f"quay.io/{ms.repo}", [
        ("quay", upstream or f"http://{services.plain}", ""),
        ("daocloud", f"http://{services.mirror}", "quay.io"),
        ("nju", f"http://{services.mirror}", ""),
    ])


def imgtool(*args, env=None, cwd=None):
    return zygote.run(args, env={**os.environ, **(env or {})}, cwd=cwd, timeout=120)


def pull(path, ref, arch, store, mirror="auto", **kw):
    """resolve + download through the core API; returns (image, stats, notes)."""
    notes = Notes()
    res = resolve_refs(load_mirrors(str(path)), [ref], mirror, notes, timeout=3)[0]
    image = resolve_image(res, Platform.parse(arch), store)
    stats = download([(image, res.sources)], store, notes, **kw)
    return image, res, stats, notes


def assert_store_holds(store, image):
    for layer in image.manifest.layers:
        data = store.blob_path(layer.digest).read_bytes()
        assert Digest.of(data) == layer.digest and len(data) == layer.size


# --- mirrors and resolution -------------------------------------------------


def test_upstream_down_prefix_and_host_swap_mirrors(services, factory, mirrored, tmp_path):
    idx = factory.multiarch(media="oci")
    ms = mirrored(idx, tag="v0.22.1rc1")
    cfg = standard_mirrors(tmp_path, services, ms, upstream=DEAD)
    r = imgtool("mirrors", "v0.22.1rc1", "--mirrors", str(cfg), "--json")
    assert r.returncode == 0, r.stderr
    by_name = {s["name"]: s for s in json.loads(r.stdout)["sources"]}
    assert by_name["quay"]["reachable"] is False and "connection refused" in by_name["quay"]["error"]
    assert by_name["daocloud"]["reference"] == f"{services.mirror}/quay.io/{ms.repo}"
    assert by_name["nju"]["reference"] == f"{services.mirror}/{ms.repo}"
    assert by_name["daocloud"]["digest"] == by_name["nju"]["digest"] == idx.manifest_digest
    table = imgtool("mirrors", "v0.22.1rc1", "--mirrors", str(cfg)).stdout
    assert "quay" in table and "unreachable" in table and "connection refused" in table

    store = Store(tmp_path / "cache")
    image, res, stats, notes = pull(cfg, "v0.22.1rc1", "arm64", store)
    assert str(image.ref) == f"quay.io/{ms.repo}:v0.22.1rc1@{idx.manifest_digest}"
    assert image.index_digest == Digest.parse(idx.manifest_digest)
    assert str(image.image_id) == idx.image("linux/arm64/v8").config_digest
    assert {s.name for s in res.sources} == {"daocloud", "nju"}
    assert "source quay unreachable: 127.0.0.1:1: connection refused" in notes.lines
    assert_store_holds(store, image)


def test_inspect_table_and_json(services, factory, mirrored, tmp_path):
    idx = factory.multiarch(media="docker")
    ms = mirrored(idx, tag="v0.22.1rc1-a3")
    cfg = standard_mirrors(tmp_path, services, ms)
    r = imgtool("inspect", "v0.22.1rc1-a3", "--mirrors", str(cfg), "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["digest"] == idx.manifest_digest and out["source"]["name"] in ("quay", "daocloud", "nju")
    assert out["media_type"] == "application/vnd.docker.distribution.manifest.list.v2+json"
    plats = {p["platform"]: p for p in out["platforms"]}
    arm = idx.image("linux/arm64/v8")
    assert plats["linux/arm64/v8"]["layers"] == len(arm.layers)
    assert plats["linux/arm64/v8"]["compressed_size"] == arm.config_size + sum(lay.size for lay in arm.layers)
    text = imgtool("inspect", "v0.22.1rc1-a3", "--mirrors", str(cfg)).stdout
    assert f"quay.io/{ms.repo}:v0.22.1rc1-a3" in text and "linux/amd64" in text and "linux/arm64/v8" in text


def test_stale_mirror_is_reported_and_not_used(services, factory, mirrored, tmp_path):
    new = factory.multiarch(media="oci")
    old = factory.multiarch(media="oci", layers=2)
    ms = mirrored(new, tag="v1", targets=("upstream", "daocloud"))
    push_image(services.mirror, ms.repo, "v1", old)  # NJU's cache still has last week's v1
    cfg = standard_mirrors(tmp_path, services, ms)
    store = Store(tmp_path / "cache")
    image, res, stats, notes = pull(cfg, "v1", "amd64", store)
    assert image.index_digest == Digest.parse(new.manifest_digest)
    assert [s.name for s in res.sources if s.name == "nju"] == []
    stale = Digest.parse(old.manifest_digest).short
    assert (f"warning: mirror nju serves {stale} for v1, not {Digest.parse(new.manifest_digest).short} "
            f"(a stale cache?): not used for this image") in notes.lines
    assert set(stats.per_source) <= {"quay", "daocloud"}


def test_upstream_digest_wins_when_reachable(services, factory, mirrored, tmp_path):
    new = factory.multiarch(media="oci")
    old = factory.multiarch(media="oci", layers=2)
    ms = mirrored(old, tag="main", targets=("daocloud", "nju"))
    push_image(services.plain, ms.repo, "main", new)
    cfg = standard_mirrors(tmp_path, services, ms)
    _, res, _, _ = pull(cfg, "main", "arm64", Store(tmp_path / "c"))
    assert res.digest == Digest.parse(new.manifest_digest)  # one upstream outvotes two stale mirrors
    assert [s.name for s in res.sources] == ["quay"]


def test_forced_mirror_and_unknown_name(services, factory, mirrored, tmp_path):
    ms = mirrored(factory.multiarch(), tag="v1")
    cfg = standard_mirrors(tmp_path, services, ms)
    _, res, stats, _ = pull(cfg, "v1", "arm64", Store(tmp_path / "c"), mirror="nju")
    assert [s.name for s in res.sources] == ["nju"] and list(stats.per_source) == ["nju"]
    r = imgtool("inspect", "v1", "--mirrors", str(cfg), "--mirror", "tuna")
    assert r.returncode == 2
    assert r.stderr.splitlines() == ["error: unknown mirror 'tuna'",
                                     f"hint: known mirrors: quay, daocloud, nju (or auto); see {cfg}"]


def test_every_source_down_is_exit_4_naming_each(tmp_path):
    cfg = mirrors_file(tmp_path, "quay.io/ascend/vllm-ascend", [("quay", DEAD, ""), ("nju", "http://127.0.0.1:2", "")])
    r = imgtool("inspect", "v0.22.1rc1", "--mirrors", str(cfg))
    assert r.returncode == 4, r.stderr
    assert r.stderr.splitlines()[0] == (
        "error: no source can serve quay.io/ascend/vllm-ascend:v0.22.1rc1: "
        "quay (127.0.0.1:1/ascend/vllm-ascend): 127.0.0.1:1: connection refused; "
        "nju (127.0.0.1:2/ascend/vllm-ascend): 127.0.0.1:2: connection refused")


def test_missing_tag_is_not_found(services, factory, mirrored, tmp_path):
    ms = mirrored(factory.multiarch(), tag="v1", targets=("upstream",))
    cfg = standard_mirrors(tmp_path, services, ms)
    r = imgtool("inspect", "v9.9.9", "--mirrors", str(cfg))
    assert r.returncode == 4
    assert r.stderr.startswith(f"error: quay.io/{ms.repo}:v9.9.9 not found: quay (")


# --- platforms --------------------------------------------------------------


def test_missing_platform_lists_what_the_index_offers(services, factory, mirrored, tmp_path):
    ms = mirrored(factory.multiarch(arches=("amd64",)), tag="v1", targets=("upstream",))
    cfg = standard_mirrors(tmp_path, services, ms)
    with pytest.raises(UsageError) as e:
        pull(cfg, "v1", "arm64", Store(tmp_path / "c"))
    assert e.value.message == (f"quay.io/{ms.repo}:v1: platform linux/arm64 not found in the image index; "
                               f"it offers: linux/amd64")


def test_single_arch_image_of_the_wrong_arch_is_an_error(services, factory, mirrored, tmp_path):
    ms = mirrored(factory.image("amd64", media="oci"), tag="v1", targets=("upstream",))
    cfg = standard_mirrors(tmp_path, services, ms)
    with pytest.raises(UsageError) as e:
        pull(cfg, "v1", "arm64", Store(tmp_path / "c"))
    assert e.value.message == f"quay.io/{ms.repo}:v1 is a single-platform image for linux/amd64, not linux/arm64"
    image, _, _, _ = pull(cfg, "v1", "amd64", Store(tmp_path / "c"))
    assert image.index_digest is None and str(image.platform) == "linux/amd64"


@pytest.mark.parametrize("media", ["oci", "docker"])
def test_index_kinds_and_pinned_digest(services, factory, mirrored, tmp_path, media):
    idx = factory.multiarch(media=media)
    ms = mirrored(idx, tag="v1", targets=("upstream",))
    cfg = standard_mirrors(tmp_path, services, ms)
    store = Store(tmp_path / "c")
    image, _, stats, _ = pull(cfg, f"quay.io/{ms.repo}@{idx.manifest_digest}", "aarch64", store)
    arm = idx.image("linux/arm64/v8")
    assert str(image.manifest_digest) == arm.manifest_digest and str(image.image_id) == arm.config_digest
    assert [str(d) for d in image.config.diff_ids] == arm.diff_ids
    assert stats.blobs_downloaded == len(arm.layers)
    assert_store_holds(store, image)


# --- auth -------------------------------------------------------------------


def test_token_auth_flow_with_reuse(services, factory, token_issuer, tmp_path, uniq):
    idx = factory.multiarch()
    from tests.support.registry import RegistryClient
    with RegistryClient.for_service(services, "token") as c:
        c.push(f"{uniq}/vllm-ascend", "v1", idx)
    before = token_issuer.issued
    seen = len(token_issuer.requests)
    cfg = mirrors_file(tmp_path, f"quay.io/{uniq}/vllm-ascend", [("quay", f"http://{services.token}", "")])
    image, _, stats, _ = pull(cfg, "v1", "arm64", Store(tmp_path / "c"), jobs=4)
    assert stats.blobs_downloaded == len(idx.image("linux/arm64/v8").layers)
    # one token per client for the pull scope, reused for every manifest and blob request
    assert 1 <= token_issuer.issued - before <= 3
    assert all(r.scopes == [f"repository:{uniq}/vllm-ascend:pull"] for r in token_issuer.requests[seen:])


def test_token_refresh_on_401(services, factory, token_issuer, tmp_path, uniq):
    idx = factory.multiarch()
    from tests.support.registry import RegistryClient
    with RegistryClient.for_service(services, "token") as c:
        c.push(f"{uniq}/vllm-ascend", "v1", idx)
    cfg = mirrors_file(tmp_path, f"quay.io/{uniq}/vllm-ascend", [("quay", f"http://{services.token}", "")])
    notes = Notes()
    res = resolve_refs(load_mirrors(str(cfg)), ["v1"], "auto", notes)[0]
    image = resolve_image(res, Platform.parse("arm64"), Store(tmp_path / "c"))
    issued = token_issuer.issued
    for source in res.sources:  # the registry now rejects the cached token (as after expiry)
        source.client.auth.tokens = {k: "expired" for k in source.client.auth.tokens}
    download([(image, res.sources)], Store(tmp_path / "c"), notes)
    assert token_issuer.issued > issued


def _docker_config(home, host, user, password):
    d = home / ".docker"
    d.mkdir(parents=True)
    auth = base64.b64encode(f"{user}:{password}".encode()).decode()
    (d / "config.json").write_text(json.dumps({"auths": {host: {"auth": auth}}}))


def test_basic_auth_over_tls(services, factory, tmp_path, uniq, monkeypatch):
    idx = factory.multiarch()
    push_image(services.tls, f"{uniq}/vllm-ascend", "v1", idx, scheme="https", auth=services.tls_auth,
               verify=services.tls_ca)
    cfg = mirrors_file(tmp_path, f"quay.io/{uniq}/vllm-ascend",
                       [("site", f"https://{services.tls}", "", f'ca_cert = "{services.tls_ca}"')])
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("DOCKER_CONFIG", raising=False)
    # no credentials: the registry's 401 is reported, not a traceback
    r = imgtool("inspect", "v1", "--mirrors", str(cfg), env={"HOME": str(home)})
    assert r.returncode == 4
    assert (f"site ({services.tls}/{uniq}/vllm-ascend): {services.tls}/{uniq}/vllm-ascend: authentication required "
            "(HTTP 401)") in r.stderr
    _docker_config(home, services.tls, services.tls_user, services.tls_password)
    r = imgtool("inspect", "v1", "--mirrors", str(cfg), "--json", env={"HOME": str(home)})
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["digest"] == idx.manifest_digest
    assert services.tls_password not in r.stdout + r.stderr
    image, _, stats, _ = pull(cfg, "v1", "arm64", Store(tmp_path / "c"))
    assert stats.blobs_downloaded == len(image.manifest.layers)


def test_tls_is_verified_unless_insecure(services, factory, tmp_path, uniq):
    cfg = mirrors_file(tmp_path, f"quay.io/{uniq}/vllm-ascend", [("site", f"https://{services.tls}", "")])
    r = imgtool("inspect", "v1", "--mirrors", str(cfg))
    assert r.returncode == 4
    assert "TLS verification failed" in r.stderr


# --- blobs: faults, failover, resume, ranges --------------------------------


@contextmanager
def one_layer_behind_a_proxy(services, factory, mirrored, tmp_path, **layer):
    """A one-layer image on the upstream registry, reached only through a FaultProxy:
    yields (proxy, mirrors.toml, the arm64 layer, an empty store)."""
    idx = factory.multiarch(layers=1, **layer)
    ms = mirrored(idx, tag="v1", targets=("upstream",))
    proxy = FaultProxy(services.plain)
    try:
        cfg = mirrors_file(tmp_path, f"quay.io/{ms.repo}", [("quay", proxy.url, "")])
        yield proxy, cfg, idx.image("linux/arm64/v8").layers[0], Store(tmp_path / "c")
    finally:
        proxy.close()


def test_interrupted_blob_resumes_with_range(services, factory, mirrored, tmp_path):
    with one_layer_behind_a_proxy(services, factory, mirrored, tmp_path, layer_size=3 << 20) as (proxy, cfg, layer, store):
        cut = 600_000  # the source strikes out after RetryPolicy.attempts (4) resets: 2.4 MB, before the end
        proxy.add(Fault("reset", lambda m, p: m == "GET" and layer.digest in p, times=100, after=cut))
        # one connection: with more, idle ones would take over the back half of the blob and
        # (each resumed range moving 1 MB further) finish it despite the resets
        with pytest.raises(RegistryError):
            pull(cfg, "v1", "arm64", store, jobs=1)
        have = store.partial_bytes(Digest.parse(layer.digest), layer.size)
        assert have >= cut and not store.has(Digest.parse(layer.digest))
        proxy.clear()
        image, _, stats, _ = pull(cfg, "v1", "arm64", store, jobs=1)
        gets = [r for r in proxy.records if r.method == "GET" and layer.digest in r.path]
        assert [r.range for r in gets] == [f"bytes={have}-"]
        assert proxy.blob_bytes_sent() == layer.size - have
        assert stats.resumed_bytes == have
        assert_store_holds(store, image)


def test_flipped_byte_never_reaches_the_store(services, factory, mirrored, tmp_path):
    with one_layer_behind_a_proxy(services, factory, mirrored, tmp_path) as (proxy, cfg, layer, store):
        proxy.add(Fault("flip", lambda m, p: m == "GET" and layer.digest in p, times=1, after=1000))
        image, _, stats, notes = pull(cfg, "v1", "arm64", store)
        assert any("arrived with digest" in line for line in notes.lines)
        assert_store_holds(store, image)


def test_failing_source_is_dropped_and_blobs_retried_on_the_next(services, factory, mirrored, tmp_path):
    idx = factory.multiarch(layers=3)
    ms = mirrored(idx, tag="v1", targets=("upstream", "nju"))
    proxy = FaultProxy(services.plain)
    try:
        cfg = mirrors_file(tmp_path, f"quay.io/{ms.repo}",
                           [("quay", proxy.url, ""), ("nju", f"http://{services.mirror}", "")])
        proxy.add(Fault("status", lambda m, p: blob_path(p) and m == "GET", times=1000, status=502))
        store = Store(tmp_path / "c")
        image, _, stats, _ = pull(cfg, "v1", "arm64", store)
        assert stats.per_source.get("quay", 0) == 0 and stats.per_source["nju"] > 0
        assert_store_holds(store, image)
    finally:
        proxy.close()


def download_threads():
    return [t.name for t in threading.enumerate() if t.name.startswith("download")]


def test_a_failing_worker_ends_the_download_with_its_error_and_every_thread(services, factory, mirrored, tmp_path):
    """Every blob request fails (502) on the only source while four connections share a split blob:
    the download raises the error a worker met, leaves no thread behind, and a rerun (once the source
    is well) gets the blob: the failed run released the blob's lock and kept what it had."""
    with one_layer_behind_a_proxy(services, factory, mirrored, tmp_path, layer_size=3 << 20) as (proxy, cfg, layer, store):
        proxy.add(Fault("status", lambda m, p: m == "GET" and layer.digest in p, times=1000, status=502))
        tuning = Tuning(big_blob=1 << 20, segment=512 << 10)
        with pytest.raises(RegistryError) as e:
            pull(cfg, "v1", "arm64", store, jobs=4, tuning=tuning)
        assert e.value.message.startswith("every source failed: quay ("), e.value.message
        assert download_threads() == []
        proxy.clear()
        image, _, stats, _ = pull(cfg, "v1", "arm64", store, jobs=4, tuning=tuning)
        assert stats.blobs_downloaded == 1
        assert_store_holds(store, image)


def test_cancel_ends_every_worker_and_keeps_what_arrived(services, factory, mirrored, tmp_path):
    """`cancel` set while every connection waits for bytes: once bytes flow again, each worker stops at
    its next chunk, download returns, no thread is left, and the bytes that arrived stay for the rerun."""
    with one_layer_behind_a_proxy(services, factory, mirrored, tmp_path, layer_size=4 << 20) as (proxy, cfg, layer, store):
        held = 1 << 20
        gate = proxy.gate(lambda m, p: m == "GET" and layer.digest in p, bytes=held)
        cancel, stats = threading.Event(), PullStats()
        t = threading.Thread(target=pull, args=(cfg, "v1", "arm64", store), name="test-pull",
                             kwargs=dict(jobs=4, cancel=cancel, stats=stats, tuning=Tuning(big_blob=1 << 20, segment=1 << 20)))
        t.start()
        try:
            assert gate.reached.wait(30)
            deadline = time.monotonic() + 30  # the bytes the gate let through reach the partial file
            while stats.bytes_downloaded < held and time.monotonic() < deadline:
                time.sleep(0.01)
            cancel.set()
        finally:
            gate.release()
            t.join(30)
        assert not t.is_alive() and download_threads() == []
        digest = Digest.parse(layer.digest)
        kept = store.partial_bytes(digest, layer.size)
        assert not store.has(digest) and held <= kept == stats.bytes_downloaded < layer.size
        proxy.clear()
        image, _, again, _ = pull(cfg, "v1", "arm64", store, jobs=4)
        assert again.resumed_bytes == kept and again.blobs_downloaded == 1
        assert proxy.blob_bytes_sent() == layer.size - kept
        assert_store_holds(store, image)


def test_429_retry_after_is_honoured(services, factory, mirrored, tmp_path):
    with one_layer_behind_a_proxy(services, factory, mirrored, tmp_path) as (proxy, cfg, layer, store):
        proxy.add(Fault("status", lambda m, p: blob_path(p) and m == "GET", status=429, headers={"Retry-After": "2"}))
        start = time.monotonic()
        image, _, stats, _ = pull(cfg, "v1", "arm64", store)
        assert time.monotonic() - start >= 2.0
        assert stats.blobs_downloaded == 1


def test_a_source_limiting_connections_keeps_the_ones_it_allows(services, factory, mirrored, tmp_path):
    """A registry that answers 503 to a client over 2 connections at once (nginx's limit_conn), fetched with 8:
    the source is not dropped as failing (counted as failures, the refusals dropped it: "every source failed");
    its connections come down to what it allows, one warning says so, and the blob arrives whole."""
    with one_layer_behind_a_proxy(services, factory, mirrored, tmp_path, layer_size=24 << 20) as (proxy, cfg, layer, store):
        blob_get = lambda m, p: m == "GET" and layer.digest in p  # noqa: E731
        proxy.limit_connections(blob_get, 2)
        proxy.add(Fault("rate", blob_get, times=1000, rate=4_000_000))  # connections stay open long enough to meet
        image, _, stats, notes = pull(cfg, "v1", "arm64", store, jobs=8,
                                      tuning=Tuning(big_blob=1 << 20, segment=1 << 20, request=512 << 10))
        assert_store_holds(store, image)
        # lowered at least once (each refusal lowers it to the connections then open, which a refusal seen late can
        # still count above 2), and the source kept: the one source finished the blob
        assert proxy.refused >= 1 and 1 <= stats.connections_lowered["quay"] <= 7 and stats.blobs_downloaded == 1
        warned = [x for x in notes.lines if x.startswith("warning: ")]
        assert len(warned) == 1, notes.lines
        assert re.fullmatch(rf"warning: quay refused a connection while [1-7] others were downloading \({re.escape(proxy.hostport)}"
                            rf"/.*: blob {Digest.parse(layer.digest).short}: HTTP 503 Service Unavailable\): "
                            "fewer connections to it from now on", warned[0]), warned[0]


def test_big_blob_is_fetched_in_ranges_from_two_sources(services, factory, mirrored, tmp_path):
    idx = factory.multiarch(layers=1, layer_size=4 << 20)
    ms = mirrored(idx, tag="v1", targets=("upstream", "nju"))
    cfg = mirrors_file(tmp_path, f"quay.io/{ms.repo}",
                       [("quay", f"http://{services.plain}", ""), ("nju", f"http://{services.mirror}", "")])
    store = Store(tmp_path / "c")
    image, _, stats, _ = pull(cfg, "v1", "arm64", store, tuning=Tuning(big_blob=1 << 20, segment=512 << 10))
    assert stats.per_source["quay"] > 0 and stats.per_source["nju"] > 0
    assert sum(stats.per_source.values()) == image.manifest.layers[0].size
    assert_store_holds(store, image)


def layer_bytes_sent(proxy, layers):
    """Body bytes the proxy sent for GETs of these layers (what the registry wrote for them)."""
    with proxy.lock:
        return sum(r.sent for r in proxy.records if r.method == "GET" and any(lay.digest in r.path for lay in layers))


def test_idle_connections_take_over_the_back_half_of_a_slow_blob(services, factory, mirrored, tmp_path):
    """One 6 MiB layer (not split up front) over connections held to 2 MB/s: the idle connections
    take the back half of the biggest running range, again and again, instead of idling; and since
    a split is never inside a request already sent, the registry sends every byte once."""
    with one_layer_behind_a_proxy(services, factory, mirrored, tmp_path, layer_size=6 << 20) as (proxy, cfg, layer, store):
        proxy.add(Fault("rate", lambda m, p: m == "GET" and layer.digest in p, times=1000, rate=2_000_000))
        image, _, stats, _ = pull(cfg, "v1", "arm64", store, jobs=4, tuning=Tuning(big_blob=1 << 40, request=1 << 20))
        gets = [r for r in proxy.records if r.method == "GET" and layer.digest in r.path]
        starts = sorted(int(r.range[len("bytes="):].split("-")[0]) if r.range else 0 for r in gets)
        assert len(gets) >= 4 and len(set(starts)) == len(starts), starts  # every request asks new bytes
        assert starts[0] == 0 and all(0 < x < layer.size for x in starts[1:]), starts
        assert any(x % (1 << 20) for x in starts), starts  # a take-over: a start off the 1 MiB request grid
        assert sum(stats.per_source.values()) == layer.size  # each byte written once ...
        assert layer_bytes_sent(proxy, [layer]) == layer.size  # ... and sent once
        assert_store_holds(store, image)


def test_one_slow_connection_costs_no_byte_twice(services, factory, mirrored, tmp_path):
    """Three layers, the first request held to 1 MB/s (one slow connection, as on an uneven link):
    the others take over its back half, then each other's, and the registry still sends the blob
    bytes at most 1 % over their size (before: every take-over threw away the bytes in flight)."""
    idx = factory.multiarch(layers=3, layer_size=3 << 20)
    ms = mirrored(idx, tag="v1", targets=("upstream",))
    layers = idx.image("linux/arm64/v8").layers
    total = sum(lay.size for lay in layers)
    proxy = FaultProxy(services.plain)
    try:
        cfg = mirrors_file(tmp_path, f"quay.io/{ms.repo}", [("quay", proxy.url, "")])
        proxy.add(Fault("rate", lambda m, p: m == "GET" and layers[0].digest in p, times=1, rate=1_000_000))
        store = Store(tmp_path / "c")
        image, _, stats, _ = pull(cfg, "v1", "arm64", store, jobs=4,
                                  tuning=Tuning(big_blob=1 << 40, request=512 << 10, min_steal=256 << 10))
        first = [r for r in proxy.records if r.method == "GET" and layers[0].digest in r.path]
        assert len(first) >= 3  # the slow range was taken over (and its pieces asked for in requests)
        assert layer_bytes_sent(proxy, layers) <= 1.01 * total, (layer_bytes_sent(proxy, layers), total)
        assert sum(stats.per_source.values()) == total
        assert_store_holds(store, image)
    finally:
        proxy.close()


_KILLED_PULL = """import sys
from pathlib import Path
from imgtool.store import Store
from imgtool.puller import Tuning
from tests.test_puller import pull
pull(Path(sys.argv[1]), "v1", "arm64", Store(Path(sys.argv[2])), jobs=4, tuning=Tuning(big_blob=1 << 40, request=256 << 10))
"""


def test_sigkill_mid_download_then_rerun_sends_each_byte_once(services, factory, mirrored, tmp_path):
    """A download killed with SIGKILL while every connection is mid-request keeps every byte it
    received (the partial records survive); the rerun asks for exactly the bytes not on disk, so
    the registry sends the blobs once in all. The kill is deterministic: every request stalls after
    64 000 bytes, and the kill comes once the cache holds all the proxy sent."""
    idx = factory.multiarch(layers=3, layer_size=4 << 20)
    ms = mirrored(idx, tag="v1", targets=("upstream",))
    layers = idx.image("linux/arm64/v8").layers
    digests = [Digest.parse(lay.digest) for lay in layers]
    total = sum(lay.size for lay in layers)
    proxy = FaultProxy(services.plain)
    try:
        cfg = mirrors_file(tmp_path, f"quay.io/{ms.repo}", [("quay", proxy.url, "")])
        proxy.add(Fault("stall", lambda m, p: m == "GET" and any(lay.digest in p for lay in layers),
                        times=10_000, after=64_000, seconds=30))
        cache = tmp_path / "cache"
        store = Store(cache)

        def on_disk():
            return sum(store.partial_bytes(d, lay.size) for d, lay in zip(digests, layers))

        p = subprocess.Popen([sys.executable, "-c", _KILLED_PULL, str(cfg), str(cache)], cwd=str(ROOT),
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            # every connection is stalled (one more than the layers: an idle one took a back half)
            # and everything the proxy sent is on disk, for 0.3 s in a row
            deadline, steady = time.monotonic() + 60, 0
            while steady < 3 and p.poll() is None and time.monotonic() < deadline:
                time.sleep(0.1)
                stalled = [r for r in proxy.records if r.method == "GET" and r.sent >= 64_000]
                sent = layer_bytes_sent(proxy, layers)
                steady = steady + 1 if len(stalled) == 4 and on_disk() == sent else 0
            b1 = layer_bytes_sent(proxy, layers)
        finally:
            p.kill()  # SIGKILL: no cleanup runs
            _, err = p.communicate()
        assert p.returncode == -signal.SIGKILL, err.decode()
        assert steady == 3, f"never settled: {on_disk()} bytes on disk, {b1} sent"
        assert b1 == 4 * 64_000 and on_disk() == b1  # what arrived before the kill is kept
        assert not any(store.has(d) for d in digests)
        proxy.clear()
        image, _, stats, _ = pull(cfg, "v1", "arm64", store, jobs=4, tuning=Tuning(big_blob=1 << 40, request=256 << 10))
        b2 = layer_bytes_sent(proxy, layers)
        assert b2 == total - b1, (b1, b2, total)  # the rerun asks only for what is not on disk
        assert b1 + b2 <= 1.01 * total
        assert stats.resumed_bytes == b1
        assert_store_holds(store, image)
    finally:
        proxy.close()


def test_a_server_ignoring_range_still_gives_the_right_blob(services, factory, mirrored, tmp_path):
    """Some proxies answer a ranged GET with 200 and the whole blob: each range skips to its start."""
    with one_layer_behind_a_proxy(services, factory, mirrored, tmp_path, layer_size=3 << 20) as (proxy, cfg, layer, store):
        proxy.add(Fault("no_range", lambda m, p: m == "GET" and layer.digest in p, times=100))
        image, _, stats, _ = pull(cfg, "v1", "arm64", store, tuning=Tuning(big_blob=1 << 20, segment=1 << 20))
        gets = [r for r in proxy.records if r.method == "GET" and layer.digest in r.path]
        ranges = -(-layer.size // (1 << 20))
        assert ranges >= 3 and len(gets) == ranges  # one GET per 1 MiB range ...
        assert {r.status for r in gets} == {200}  # ... each answered with the whole blob
        assert stats.blobs_downloaded == 1 and sum(stats.per_source.values()) == layer.size
        assert_store_holds(store, image)


def test_related_tag_downloads_only_missing_layers(services, factory, mirrored, tmp_path):
    first = factory.multiarch(layers=3)
    second = factory.multiarch(layers=1, base=first)
    ms = mirrored(first, tag="v0.22.1rc1", targets=("upstream",))
    push_image(services.plain, ms.repo, "v0.22.1rc2", second)
    cfg = standard_mirrors(tmp_path, services, ms)
    store = Store(tmp_path / "c")
    pull(cfg, "v0.22.1rc1", "arm64", store)
    _, _, stats, _ = pull(cfg, "v0.22.1rc2", "arm64", store)
    assert stats.blobs_downloaded == 1 and stats.blobs_cached == 3


# --- tags -------------------------------------------------------------------


def test_tags_lists_variants_newest_first_and_skips_a_mirror_without_listing(services, factory, mirrored, tmp_path):
    idx = factory.multiarch(layers=1)
    ms = mirrored(idx, tag="v0.9.1", targets=("upstream",))
    for tag in ("v0.10.0rc1-310p", "v0.22.1rc1", "v0.22.1rc1-a3", "v0.22.1rc1-a3-openeuler", "main"):
        push_image(services.plain, ms.repo, tag, idx)
    proxy = FaultProxy(services.plain)  # a DaoCloud-like mirror that refuses the tags API
    proxy.add(Fault("status", lambda m, p: "/tags/list" in p, times=100, status=404))
    try:
        cfg = mirrors_file(tmp_path, f"quay.io/{ms.repo}", [("daocloud", proxy.url, ""), ("nju", f"http://{services.plain}", "")])
        r = imgtool("tags", "--mirrors", str(cfg), "--json")
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        assert out["source"] == "nju"
        assert [t["tag"] for t in out["tags"]] == ["v0.22.1rc1-a3-openeuler", "v0.22.1rc1-a3", "v0.22.1rc1",
                                                   "v0.10.0rc1-310p", "v0.9.1", "main"]
        by = {t["tag"]: t for t in out["tags"]}
        assert (by["v0.10.0rc1-310p"]["hardware"], by["v0.22.1rc1-a3-openeuler"]["os"]) == ("300i-duo", "openeuler")
        assert "daocloud: does not list tags" in r.stderr
        r = imgtool("tags", "--mirrors", str(cfg), "--filter", "v0.22*")
        assert r.stdout.split("\n")[1:] == ["v0.22.1rc1-a3-openeuler  v0.22.1rc1  a3        openeuler",
                                            "v0.22.1rc1-a3            v0.22.1rc1  a3        ubuntu",
                                            "v0.22.1rc1               v0.22.1rc1  a2        ubuntu", ""]
    finally:
        proxy.close()



class _PagedTags:
    """A registry front that pages tags/list like quay.io does (`n`, `last`, Link rel=next).

    Distribution 2.8 ignores `n` for tags, so the real registry never exercises pagination.
    """

    def __init__(self, tags, loop=False):
        import http.server
        import threading
        from urllib.parse import parse_qs, urlsplit

        self.tags, self.paths = sorted(tags), []
        front = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                front.paths.append(self.path)
                url = urlsplit(self.path)
                q = parse_qs(url.query)
                n, last = int(q.get("n", ["100"])[0]), q.get("last", [""])[0]
                rest = [t for t in front.tags if t > last]
                page, more = rest[:n], len(rest) > n
                body = json.dumps({"name": "x", "tags": page}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                if more or loop:
                    nxt = self.path if loop else f"{url.path}?n={n}&last={page[-1]}"
                    self.send_header("Link", f'<{nxt}>; rel="next"')
                self.end_headers()
                self.wfile.write(body)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_tags_follow_link_pagination_page_by_page():
    from imgtool.registry import RegistryClient as Client

    names = ["main", "v0.9.1", "v0.10.0rc1-310p", "v0.22.1rc1", "v0.22.1rc1-a3"]
    front = _PagedTags(names)
    try:
        got = list(Client(front.url, insecure=True).tags("ns/vllm-ascend", page_size=2))
    finally:
        front.close()
    assert got == sorted(names)
    assert front.paths == ["/v2/ns/vllm-ascend/tags/list?n=2", "/v2/ns/vllm-ascend/tags/list?n=2&last=v0.10.0rc1-310p",
                           "/v2/ns/vllm-ascend/tags/list?n=2&last=v0.22.1rc1-a3"]
    looping = _PagedTags(names[:1], loop=True)  # a page that links to itself ends the listing
    try:
        assert list(Client(looping.url, insecure=True).tags("ns/vllm-ascend", page_size=2)) == ["main"]
    finally:
        looping.close()


HELPER = """#!/bin/sh
# a credential helper as `docker login` uses them: `get` reads a server on stdin, prints JSON
[ "$1" = get ] || exit 1
read -r server
echo "$server" >>"$0.asked"
if [ "$server" = "{host}" ]; then
    printf '{{"ServerURL": "%s", "Username": "{user}", "Secret": "{password}"}}\\n' "$server"
else
    echo "credentials not found in native keychain"
    exit 1
fi
"""


@pytest.mark.parametrize("how", ["credsStore", "credHelpers"])
def test_credentials_from_a_credential_helper(services, factory, tmp_path, uniq, how):
    """`docker login` with a credential helper (desktops, `pass`) leaves no secret in config.json:
    imgtool asks the helper, as docker does."""
    cfg, env, helper, idx = _helped_login(services, factory, tmp_path, uniq, HELPER.format(
        host=services.tls, user=services.tls_user, password=services.tls_password), how=how)
    home = Path(env["HOME"])
    r = imgtool("inspect", "v1", "--mirrors", str(cfg), "--json", env=env)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["digest"] == idx.manifest_digest
    assert Path(f"{helper}.asked").read_text().split() == [services.tls]
    assert services.tls_password not in r.stdout + r.stderr

    # the helper named but not installed: the registry's 401 is explained by it
    missing = imgtool("inspect", "v1", "--mirrors", str(cfg), env={"HOME": str(home), "PATH": "/usr/bin:/bin"})
    assert missing.returncode == 4, missing.stderr
    assert missing.stderr.splitlines()[0] == (
        f"error: no source can serve quay.io/{uniq}/vllm-ascend:v1: site ({services.tls}/{uniq}/vllm-ascend): "
        f"docker-credential-imgtooltest named in {home}/.docker/config.json cannot give the credentials for "
        f"{services.tls}: docker-credential-imgtooltest not installed or not available in PATH")


def _helped_login(services, factory, tmp_path, uniq, helper_text, how="credHelpers"):
    """An image on the TLS registry (Basic auth), a mirrors.toml naming it, and a HOME whose config.json
    names docker-credential-imgtooltest (`helper_text`) for it, as `how` (credHelpers, or credsStore: every
    registry's helper, beside an auths entry without a secret, as docker login writes it); returns (cfg, env,
    helper path, the image pushed)."""
    idx = factory.multiarch(layers=2)
    push_image(services.tls, f"{uniq}/vllm-ascend", "v1", idx, scheme="https", auth=services.tls_auth,
               verify=services.tls_ca)
    cfg = mirrors_file(tmp_path, f"quay.io/{uniq}/vllm-ascend",
                       [("site", f"https://{services.tls}", "", f'ca_cert = "{services.tls_ca}"')])
    home, bin_dir = tmp_path / "home", tmp_path / "bin"
    (home / ".docker").mkdir(parents=True)
    bin_dir.mkdir()
    helper = bin_dir / "docker-credential-imgtooltest"
    helper.write_text(helper_text)
    helper.chmod(0o755)
    config = {"credHelpers": {services.tls: "imgtooltest"}} if how == "credHelpers" else \
        {"auths": {services.tls: {}}, "credsStore": "imgtooltest"}
    (home / ".docker" / "config.json").write_text(json.dumps(config))
    return cfg, {"HOME": str(home), "PATH": f"{bin_dir}:{os.environ['PATH']}"}, helper, idx


def test_a_credential_helper_runs_once_per_fetch(services, factory, tmp_path, uniq):
    """Credentials are looked up on the registry's first 401, once per host: fetch builds its clients once
    (it built them for checking the input, again for resolving, and each looked its login up)."""
    cfg, env, helper, _ = _helped_login(services, factory, tmp_path, uniq, HELPER.format(
        host=services.tls, user=services.tls_user, password=services.tls_password))
    env["IMGTOOL_CACHE"] = str(tmp_path / "cache")
    r = imgtool("fetch", "v1", "--arch", "amd64", "--mirrors", str(cfg), "-o", str(tmp_path / "b"), "--no-tool",
                env=env)
    assert r.returncode == 0, r.stderr
    assert Path(f"{helper}.asked").read_text().split() == [services.tls]  # asked once, for this host


def test_a_hanging_credential_helper_is_one_error_naming_it_and_the_timeout(services, factory, tmp_path, uniq):
    """docker-credential-* runs with a timeout ($IMGTOOL_CREDENTIAL_HELPER_TIMEOUT, default 30 s): a helper
    that never answers (a keyring waiting for a desktop prompt) is named, with the time it was given."""
    cfg, env, helper, _ = _helped_login(services, factory, tmp_path, uniq,
                                     "#!/bin/sh\nexec sleep 3600\n")
    env.update(IMGTOOL_CACHE=str(tmp_path / "cache"), IMGTOOL_CREDENTIAL_HELPER_TIMEOUT="1")
    r = imgtool("fetch", "v1", "--arch", "amd64", "--mirrors", str(cfg), "-o", str(tmp_path / "b"), "--no-tool",
                env=env)
    path = Path(env["HOME"]) / ".docker" / "config.json"
    assert (r.returncode, r.stderr.splitlines()) == (4, [
        f"error: no source can serve quay.io/{uniq}/vllm-ascend:v1: site ({services.tls}/{uniq}/vllm-ascend): "
        f"docker-credential-imgtooltest named in {path} cannot give the credentials for {services.tls}: "
        "it did not answer within 1 s ($IMGTOOL_CREDENTIAL_HELPER_TIMEOUT)",
        f"hint: check that docker-credential-imgtooltest answers (`echo {services.tls} | docker-credential-imgtooltest "
        f"get`), or set $IMGTOOL_CREDENTIAL_HELPER_TIMEOUT higher, or remove credsStore/credHelpers from {path}"]), r.stderr


def test_connections_are_per_source_so_a_mirror_adds_its_own(services, factory, mirrored, tmp_path):
    """`jobs` is connections per source: with one each, the registry and a mirror of it are asked at once
    (it was one connection for the whole download). Each proxy holds every layer request until both have
    one waiting, so the test sees the two at the same time, whatever the machine's speed."""
    idx = factory.multiarch(layers=1, layer_size=4 << 20)
    ms = mirrored(idx, tag="v1", targets=("upstream", "nju"))
    layer = idx.image("linux/arm64/v8").layers[0]
    quay, nju = FaultProxy(services.plain), FaultProxy(services.mirror)
    gates = [p.gate(lambda m, path: m == "GET" and layer.digest in path, requests=0) for p in (quay, nju)]
    cfg = mirrors_file(tmp_path, f"quay.io/{ms.repo}", [("quay", quay.url, ""), ("nju", nju.url, "")])
    store, stats = Store(tmp_path / "c"), PullStats()
    t = threading.Thread(target=pull, args=(cfg, "v1", "arm64", store), name="test-pull",
                         kwargs=dict(jobs=1, stats=stats, tuning=Tuning(big_blob=1 << 20, segment=1 << 20)))
    t.start()
    try:
        both = [g.reached.wait(30) for g in gates]
    finally:
        for g in gates:
            g.release()
        t.join(60)
        quay.close()
        nju.close()
    assert both == [True, True]  # a request waiting at each source at once
    assert not t.is_alive() and sum(stats.per_source.values()) == layer.size
    assert set(stats.per_source) == {"quay", "nju"}
