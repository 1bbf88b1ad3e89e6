"""`imgtool diff`: two releases on one base, as bundles and as an offline inventory."""

import json
import os

import pytest

from imgtool.bundle.writer import write_bundle
from imgtool.store import FileBlobs
from imgtool.delta import Inventory, InventoryImage
from imgtool.model import Digest, format_size
from imgtool.progress import Progress
from tests.support import zygote
from tests.support.bundles import BlobDir

REPO = "quay.io/ascend"


def imgtool(*args, env=None, timeout=60):
    return zygote.run(args, env=dict(os.environ) if env is None else env, timeout=timeout)


def bundle(tmp_path, name, images):
    """Write a bundle of (ref, factory Image) pairs; returns its directory."""
    store = BlobDir(tmp_path / "blobs")
    pulled = [store.pulled(im, ref) for ref, im in images]
    out = tmp_path / name
    write_bundle(out, pulled, FileBlobs(store.path), chunk_size=None, compress="none", force=False, progress=Progress(),
                 created="2025-06-01T08:00:00Z")
    return out


@pytest.fixture
def releases(factory, tmp_path):
    """r1 and r2 of vllm-ascend on the same CANN base; the CANN image itself in both bundles."""
    base = [factory.layer(30_000), factory.layer(20_000)]
    cann = factory.image("arm64", layers=0, base=base)
    r1 = factory.multiarch(layers=2, base=base, layer_size=10_000)
    r2 = factory.multiarch(layers=1, base=base, layer_size=10_000)
    old = bundle(tmp_path, "old", [(f"{REPO}/vllm-ascend:v1", r1.image("arm64")), (f"{REPO}/cann:8.2", cann)])
    new = bundle(tmp_path, "new", [(f"{REPO}/vllm-ascend:v2", r2.image("arm64")), (f"{REPO}/cann:8.2", cann)])
    return base, cann, r1, r2, old, new


def test_diff_lists_shared_base_layers_added_and_removed(releases):
    base, cann, r1, r2, old, new = releases
    r = imgtool("diff", str(old), str(new), "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert [(x["status"], x["name"]) for x in out["images"]] == [
        ("added", f"{REPO}/vllm-ascend:v2"), ("unchanged", f"{REPO}/cann:8.2"), ("removed", f"{REPO}/vllm-ascend:v1")]
    assert out["platforms"] == {"added": [], "removed": [], "both": ["linux/arm64/v8"]}
    by = {}
    for row in out["layers"]:
        by.setdefault(row["status"], []).append(row["digest"])
    assert by["shared"] == [x.digest for x in base]
    assert by["added"] == [r2.image("arm64").layers[-1].digest]
    assert by["removed"] == [x.digest for x in r1.image("arm64").layers[2:]]
    shared = next(x for x in out["layers"] if x["digest"] == base[0].digest)
    assert shared["images"] == [f"{REPO}/vllm-ascend:v2 (linux/arm64/v8)", f"{REPO}/cann:8.2 (linux/arm64/v8)"]
    t = out["totals"]
    base_bytes = sum(x.size for x in base)
    added = r2.image("arm64").layers[-1].size
    assert (t["shared_bytes"], t["added_bytes"], t["new_bytes"]) == (base_bytes, added, base_bytes + added)
    assert t["removed_bytes"] == sum(x.size for x in r1.image("arm64").layers[2:])

    r = imgtool("diff", str(old), str(new))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == f"old: {old} (bundle: 2 image(s), linux/arm64/v8)"
    assert lines[3:6] == [f"  added      {REPO}/vllm-ascend:v2  linux/arm64/v8  ID {r2.image('arm64').id[7:19]}",
                          f"  unchanged  {REPO}/cann:8.2        linux/arm64/v8  ID {cann.id[7:19]}",
                          f"  removed    {REPO}/vllm-ascend:v1  linux/arm64/v8  ID {r1.image('arm64').id[7:19]}"]
    assert f"  shared   {base[0].digest[7:19]:<17}  {format_size(base[0].size):>10}  " \
           f"{REPO}/vllm-ascend:v2 (linux/arm64/v8), {REPO}/cann:8.2 (linux/arm64/v8)" in lines
    saved = base_bytes
    assert lines[-1] == (f"delta: a bundle of new against old (imgtool fetch --base OLD) carries {format_size(added)} "
                         f"of layers instead of {format_size(base_bytes + added)} (saves {format_size(saved)}, "
                         f"{100 * saved // (base_bytes + added)}%)")


def test_diff_against_an_inventory_and_a_bundle_json(releases, tmp_path):
    base, cann, r1, r2, old, new = releases
    old_image = r1.image("arm64")
    inv = Inventory("2025-06-01T08:00:00Z", {"version": "20.10"}, (
        InventoryImage(old_image.id, (f"{REPO}/vllm-ascend:v1",), "linux/arm64",
                       tuple(Digest.parse(d) for d in old_image.diff_ids)),))
    path = tmp_path / "inventory.json"
    path.write_bytes(inv.to_bytes())
    r = imgtool("diff", str(path), str(new / "bundle.json"), "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["old"]["kind"] == "inventory"
    shared = [x["diff_id"] for x in out["layers"] if x["status"] == "shared"]
    assert shared == [x.diff_id for x in base]
    removed = [x for x in out["layers"] if x["status"] == "removed"]
    assert [x["diff_id"] for x in removed] == old_image.diff_ids[2:] and {x["size"] for x in removed} == {None}
    assert out["totals"]["removed_bytes"] is None
    assert out["totals"]["shared_bytes"] == sum(x.size for x in base)


def test_diff_of_something_else_is_a_usage_error(tmp_path, releases):
    _, _, _, _, old, _ = releases
    junk = tmp_path / "junk.json"
    junk.write_text("{}")
    r = imgtool("diff", str(old), str(junk))
    assert (r.returncode, r.stderr.splitlines()[0]) == (
        2, f"error: {junk} is neither a bundle (bundle.json or its directory) nor an imgtool inventory")
    r = imgtool("diff", str(old), str(tmp_path / "nope"))
    assert (r.returncode, r.stderr.splitlines()[0]) == (2, f"error: no such bundle or inventory: {tmp_path / 'nope'}")


@pytest.mark.engines(stores=True)
def test_a_bundle_against_the_inventory_of_the_docker_it_was_loaded_into_is_unchanged(
        services, engine, factory, tmp_path, uniq, docker_cli, docker_cleanup):
    """On every engine, the containerd image store too (whose image IDs are manifest digests, not
    the config digest a bundle lists first): the image just loaded is "unchanged"; another is "changed"."""
    from tests.support.images import host_arch

    ref = f"quay.io/{uniq}/vllm-ascend:v1"
    image = factory.image(host_arch(), layers=2, layer_size=20_000)
    loaded = bundle(tmp_path, "loaded", [(ref, image)])
    other = bundle(tmp_path, "other", [(ref, factory.image(host_arch(), layers=2, layer_size=20_000))])
    docker_cleanup.image(ref, *docker_cli.ids_of(image))
    env = dict(os.environ, DOCKER_HOST=services.docker_host)
    r = imgtool("load", str(loaded), env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    inv = tmp_path / "inv.json"
    r = imgtool("inventory", "-o", str(inv), env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    for side, want in ((loaded, "unchanged"), (other, "changed")):
        r = imgtool("diff", str(inv), str(side), "--json")
        assert r.returncode == 0, r.stderr
        rows = [x for x in json.loads(r.stdout)["images"] if x["name"] == ref]
        assert [x["status"] for x in rows] == [want], (engine, rows)
        text = imgtool("diff", str(inv), str(side)).stdout.splitlines()
        assert any(line.split()[:2] == [want, ref] for line in text), text


@pytest.mark.engines(stores=True)
def test_diff_bundle_inventory_says_unchanged_with_the_ids_this_docker_shows(
        services, engine, factory, tmp_path, uniq, docker_cli, docker_cleanup):
    """`imgtool diff BUNDLE INVENTORY` after loading BUNDLE, on every engine, exact text: unchanged, with
    the ID `docker images` shows; a changed image shows both IDs as that Docker gives them (the containerd
    store's are manifest digests, never a config digest set against a manifest digest)."""
    from tests.support.images import host_arch

    ref = f"quay.io/{uniq}/vllm-ascend:v1"
    image = factory.image(host_arch(), layers=2, layer_size=20_000)
    changed = factory.image(host_arch(), layers=2, layer_size=20_000)
    loaded = bundle(tmp_path, "loaded", [(ref, image)])
    other = bundle(tmp_path, "other", [(ref, changed)])
    docker_cleanup.image(ref, *docker_cli.ids_of(image))
    env = dict(os.environ, DOCKER_HOST=services.docker_host)
    for args in (("load", str(loaded)), ("inventory", "-o", str(tmp_path / "inv.json"))):
        r = imgtool(*args, env=env, timeout=300)
        assert r.returncode == 0, r.stderr
    inv = str(tmp_path / "inv.json")
    shown = docker_cli.inspect_image(ref)["Id"]
    assert shown == docker_cli.bundle_id(image)
    plat = f"linux/{host_arch()}"

    def row(*args):
        r = imgtool("diff", *args)
        assert r.returncode == 0, r.stderr
        return [x for x in r.stdout.splitlines() if x.startswith(("  unchanged  ", "  changed  "))]

    assert row(str(loaded), inv) == [f"  unchanged  {ref}  {plat}  ID {shown[7:19]}"]
    assert row(inv, str(loaded)) == [f"  unchanged  {ref}  {plat}  ID {shown[7:19]}"]
    other_id = docker_cli.bundle_id(changed)[7:19]
    assert row(str(other), inv) == [f"  changed    {ref}  {plat}  ID {other_id} -> {shown[7:19]}"]
    assert row(inv, str(other)) == [f"  changed    {ref}  {plat}  ID {shown[7:19]} -> {other_id}"]


@pytest.mark.engines(stores=True)
def test_an_image_docker_pulled_from_the_pushed_bundle_is_unchanged(
        services, engine, factory, tmp_path, uniq, docker_cli, docker_cleanup):
    """`imgtool push` to a site registry, `docker pull` there (the containerd store then names the image by
    the registry's manifest digest, not the OCI twin a load gives it): the bundle still diffs unchanged."""
    from tests.support.images import host_arch

    ref = f"quay.io/{uniq}/vllm-ascend:v1"
    image = factory.image(host_arch(), layers=2, layer_size=20_000)
    pushed = bundle(tmp_path, "pushed", [(ref, image)])
    pulled = f"{services.plain}/{uniq}/{uniq}/vllm-ascend:v1"
    docker_cleanup.image(ref, pulled, *docker_cli.ids_of(image))
    r = imgtool("push", str(pushed), "--to", f"{services.plain}/{uniq}", "--insecure")
    assert r.returncode == 0, r.stderr
    docker_cli("pull", pulled)
    docker_cli("tag", pulled, ref)
    r = imgtool("inventory", "-o", str(tmp_path / "inv.json"), env=dict(os.environ, DOCKER_HOST=services.docker_host),
                timeout=300)
    assert r.returncode == 0, r.stderr
    shown = docker_cli.inspect_image(ref)["Id"]
    r = imgtool("diff", str(pushed), str(tmp_path / "inv.json"))
    rows = [x.split() for x in r.stdout.splitlines() if x.startswith(("  unchanged  ", "  changed  ", "  added  "))]
    assert rows == [["added", pulled, f"linux/{host_arch()}", "ID", shown[7:19]],
                    ["unchanged", ref, f"linux/{host_arch()}", "ID", shown[7:19]]], r.stdout


def test_diff_shows_a_models_files_shared_changed_added_removed_and_what_a_delta_carries(factory, tmp_path):
    from tests.support.bundles import put_model, write
    from tests.support.models import small_model, two_revisions

    store = BlobDir(tmp_path / "blobs")
    image = store.pulled(factory.image("arm64", layers=1), f"{REPO}/vllm-ascend:v1")
    hub = two_revisions(seed=5)
    v1, v2 = put_model(store, hub, "v1"), put_model(store, hub, "main")
    other = put_model(store, small_model(seed=9, repo_id="imgtool-test/other"))
    write(tmp_path / "old", [image], store, models=[v1, other])
    write(tmp_path / "new", [image], store, models=[v2])
    shard = "model-00002-of-00002.safetensors"
    was, now = (next(f for f in m.files if f.path == shard) for m in (v1, v2))
    shared = v2.size - now.size
    r = imgtool("diff", str(tmp_path / "old"), str(tmp_path / "new"))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    at = lines.index("models:") + 1
    assert lines[at:at + 5] == [
        f"  changed    hf:imgtool-test/tiny-llm  commit {v1.commit[:12]} -> {v2.commit[:12]}",
        f"    files: 8 shared ({format_size(shared)}), 1 changed ({format_size(now.size)}), 0 added (0 B), 0 removed (0 B)",
        f"    changed  {shard}  {format_size(now.size)}  {was.sha256.short} -> {now.sha256.short}",
        f"  removed    hf:imgtool-test/other     commit {other.commit[:12]}",
        f"    files: 0 shared (0 B), 0 changed (0 B), 0 added (0 B), 9 removed ({format_size(other.size)})",
    ]
    assert lines[-1] == (f"models delta: a bundle of new against old carries {format_size(now.size)} of model files "
                         f"instead of {format_size(v2.size)} (saves {format_size(shared)}, "
                         f"{100 * shared // v2.size}%)")
    doc = json.loads(imgtool("diff", str(tmp_path / "old"), str(tmp_path / "new"), "--json").stdout)
    rows = {m["name"]: m for m in doc["models"]}
    assert rows["hf:imgtool-test/tiny-llm"]["files"][0] == {
        "status": "changed", "path": shard, "old": {"sha256": str(was.sha256), "size": was.size},
        "new": {"sha256": str(now.sha256), "size": now.size}}
    assert [f["status"] for f in rows["hf:imgtool-test/tiny-llm"]["files"]].count("shared") == 8
    assert rows["hf:imgtool-test/other"]["status"] == "removed"
    # bundles without models: nothing said of models, as before
    write(tmp_path / "plain", [image], store)
    plain = imgtool("diff", str(tmp_path / "plain"), str(tmp_path / "plain"), "--json")
    assert "models" not in json.loads(plain.stdout)
    assert "models:" not in imgtool("diff", str(tmp_path / "plain"), str(tmp_path / "plain")).stdout
