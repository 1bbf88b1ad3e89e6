"""Delta bundles: `imgtool inventory` on the offline side, `fetch --have/--base`, and a load that
refuses a delta bundle before Docker sees it when the base layers are missing.

Against the real registry and the real test dockerd.
"""

import hashlib
import json
import tarfile

import pytest

from imgtool.bundle.format import BundleIndex
from imgtool.delta import Have, chain_ids, describe_requirements, plan_omissions, requirements
from imgtool.model import Digest
from tests.support.bundles import imgtool, parts_of
from tests.support.images import host_arch

MiB = 1 << 20


def d(n: int) -> Digest:
    return Digest.of(str(n).encode())


def test_chain_ids_follow_dockers_rule():
    a, b, c = d(1), d(2), d(3)
    ab = hashlib.sha256(f"{a} {b}".encode()).hexdigest()
    abc = hashlib.sha256(f"sha256:{ab} {c}".encode()).hexdigest()
    assert [str(x) for x in chain_ids([a, b, c])] == [str(a), f"sha256:{ab}", f"sha256:{abc}"]
    assert chain_ids([]) == []


def test_only_a_leading_run_of_covered_chains_is_left_out():
    have = Have("test")
    have.add([d(1), d(2), d(3)], "old:v1")
    # same first two layers: covered; the third differs, so nothing above it is covered either
    plan = plan_omissions([d(1), d(2), d(9), d(3)], have)
    assert [(o.index, o.provided_by) for o in plan] == [(0, ("old:v1",)), (1, ("old:v1",))]
    # the same diff_id on a different parent is a different chain: not covered
    assert plan_omissions([d(2)], have) == []
    assert plan_omissions([d(1)], None) == []


def test_a_chain_held_by_several_images_needs_any_one_of_them_native_first():
    have = Have("test")
    have.add([d(1), d(2)], "base:arm64", "linux/arm64/v8")
    have.add([d(1), d(2), d(3)], "base:amd64", "linux/amd64")
    have.add([d(1)], "tiny:arm64", "linux/arm64/v8")
    plan = plan_omissions([d(1), d(2), d(4)], have, "amd64")
    assert [o.provided_by for o in plan] == [("base:amd64", "base:arm64", "tiny:arm64"), ("base:amd64", "base:arm64")]
    assert [o.provided_by for o in plan_omissions([d(1), d(2)], have, "arm64")][1] == ("base:arm64", "base:amd64")
    # the deeper chain's providers hold the shallower one too: one requirement, "one of" two images
    needed = [(o.chain_id, o.provided_by) for o in plan]
    assert requirements(needed) == [("base:amd64", "base:arm64")]
    assert describe_requirements(requirements(needed)) == "one of base:amd64, base:arm64"
    # two images whose omitted chains no single image holds: both requirements stay
    other = [(d(7), ("app:v1",)), (d(8), ("app:v1", "app:v2")), (d(9), ("db:v1",))]
    assert describe_requirements(requirements(other)) == "app:v1; db:v1"


def _mirrors(tmp_path, services, ms):
    cfg = tmp_path / "mirrors.toml"
    cfg.write_text(f'default_image = "quay.io/{ms.repo}"\n[[mirrors]]\nname = "quay"\nregistry = "quay.io"\n'
                   f'url = "http://{services.plain}"\nupstream = true\ninsecure = true\n')
    return cfg


@pytest.fixture
def two_tags(services, factory, mirrored, tmp_path):
    """v1 and v2 of one repository sharing two ~1 MiB base layers; v2 adds one ~1 MiB layer."""
    base = factory.layers(2)
    arch = host_arch()
    old = factory.image(arch, layers=1, base=base)
    new = factory.image(arch, layers=1, base=base)
    ms = mirrored(factory.index([old]), tag="v1", targets=("upstream",))
    mirrored(factory.index([new]), tag="v2", targets=("upstream",))
    return _mirrors(tmp_path, services, ms), ms, old, new


@pytest.mark.runtimes(proof=True)
def test_delta_bundle_against_an_inventory(two_tags, tmp_path, node):
    """On every runtime: the inventory taken there, the delta fetched against it loads there; a runtime
    without the base refuses it before anything is imported."""
    cfg, ms, old, new = two_tags
    env = {"IMGTOOL_CACHE": str(tmp_path / "cache")}
    old_ref, new_ref = f"quay.io/{ms.repo}:v1", f"quay.io/{ms.repo}:v2"
    node.remove_later(old_ref, new_ref, *node.ids_of(old), *node.ids_of(new))
    full = imgtool("fetch", "--no-tool", "v1", "--mirrors", str(cfg), "-o", str(tmp_path / "v1"), env=env)
    assert full.returncode == 0, full.stderr
    assert imgtool("load", str(tmp_path / "v1"), env=node.env).returncode == 0

    inv = tmp_path / "inventory.json"
    r = imgtool("inventory", "-o", str(inv), env=node.env)
    assert r.returncode == 0, r.stderr
    doc = json.loads(inv.read_text())
    assert doc["daemon"]["runtime"] == node.kind
    mine = [im for im in doc["images"] if im["id"] in node.ids_of(old)]
    assert mine and mine[0]["tags"] == [old_ref] and mine[0]["diff_ids"] == old.diff_ids

    out = tmp_path / "v2-delta"
    r = imgtool("fetch", "--no-tool", "v2", "--mirrors", str(cfg), "-o", str(out), "--have", str(inv), "--json", env=env)
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout)
    new_layer = new.layers[-1].size
    assert result["delta"]["omitted_layers"] == 2
    assert result["delta"]["layer_bytes"] == new_layer
    assert result["full_layer_bytes"] == sum(x.size for x in new.layers)
    assert sum(p.stat().st_size for p in parts_of(out)) < new_layer + MiB
    index = BundleIndex.from_bytes((out / "bundle.json").read_bytes())
    assert json.loads((out / "bundle.json").read_text())["version"] == 2
    assert [x.omitted for x in index.images[0].layers] == [True, True, False]
    assert index.images[0].layers[0].provided_by == (old_ref,)
    # a valid docker-archive: manifest.json lists all three layers, the two omitted files are absent
    with tarfile.open(out / index.archive.name) as tar:
        names = set(tar.getnames())
        manifest = json.load(tar.extractfile("manifest.json"))
    assert len(manifest[0]["Layers"]) == 3
    assert [x in names for x in manifest[0]["Layers"]] == [False, False, True]

    ok = imgtool("verify", str(out))
    assert ok.returncode == 0, ok.stderr
    assert f"delta bundle: 2 layers left out on purpose (Docker must already hold them: {old_ref})" in ok.stdout

    loaded = imgtool("load", str(out), env=node.env)
    assert loaded.returncode == 0, loaded.stderr
    assert node.holds(new_ref, new)

    # on a runtime without v1 the delta bundle is refused before the runtime sees it
    node.remove(old_ref, new_ref, *node.ids_of(old), *node.ids_of(new))
    assert not node.find(new)
    before = node.snapshot()
    refused = imgtool("load", str(out), env=node.env)
    assert refused.returncode == 1
    assert refused.stderr.splitlines() == [
        f"error: refusing to load: {out} is a delta bundle and {node.title} lacks 2 of the 2 layer chains it "
        "leaves out; nothing was loaded",
        f"hint: load {old_ref} (from the inventory inventory.json) first, then this bundle; or fetch a full "
        "bundle (without --have/--base)",
    ]
    assert node.leftovers(before) == []


@pytest.mark.engines
def test_delta_against_a_base_bundle_and_load_sh(services, two_tags, tmp_path, docker_cli, docker_cleanup):
    cfg, ms, old, new = two_tags
    env = {"IMGTOOL_CACHE": str(tmp_path / "cache")}
    old_ref, new_ref = f"quay.io/{ms.repo}:v1", f"quay.io/{ms.repo}:v2"
    docker_cleanup.image(old_ref, new_ref, old.config_digest, new.config_digest)
    assert imgtool("fetch", "--no-tool", "v1", "--mirrors", str(cfg), "-o", str(tmp_path / "v1"), env=env).returncode == 0
    out = tmp_path / "v2"
    r = imgtool("fetch", "--no-tool", "v2", "--mirrors", str(cfg), "-o", str(out), "--base", str(tmp_path / "v1"), env=env)
    assert r.returncode == 0, r.stderr
    assert "delta bundle against bundle v1: 2 layers" in r.stdout
    assert f"the offline Docker must already hold: {old_ref}" in r.stdout

    import subprocess
    sh_env = {"DOCKER": f"docker -H {services.docker_host}", "PATH": "/usr/bin:/bin:/usr/local/bin"}
    refused = subprocess.run(["sh", str(out / "load.sh")], capture_output=True, text=True, env=sh_env)
    assert refused.returncode == 1  # as imgtool load: docs/reliability.md, "Exit codes"
    assert (f"load.sh: error: this is a delta bundle and Docker lacks {old_ref}; load that image (its bundle) first"
            in refused.stderr)
    assert docker_cli.find(new) is None
    assert subprocess.run(["sh", str(tmp_path / "v1" / "load.sh")], env=sh_env, capture_output=True).returncode == 0
    loaded = subprocess.run(["sh", str(out / "load.sh")], capture_output=True, text=True, env=sh_env)
    assert loaded.returncode == 0, loaded.stderr
    assert docker_cli.holds(new_ref, new)


@pytest.mark.engines(stores=True)
def test_base_provided_by_several_images_any_one_will_do(services, factory, mirrored, tmp_path, docker_cli,
                                                         docker_cleanup):
    """The base layers are in an arm64 and an amd64 image: a delta for this host asks for one of them,
    its own architecture's first, and imgtool load and load.sh accept either."""
    import subprocess

    from tests.support.bundles import BlobDir, write

    arch = host_arch()
    other = "arm64" if arch != "arm64" else "amd64"
    base = factory.layers(2)
    native, foreign = factory.image(arch, layers=1, base=base), factory.image(other, layers=1, base=base)
    new = factory.image(arch, layers=1, base=base)
    ms = mirrored(factory.index([new]), tag="v2", targets=("upstream",))
    cfg = _mirrors(tmp_path, services, ms)
    new_ref = f"quay.io/{ms.repo}:v2"
    native_ref, foreign_ref = f"quay.io/{ms.repo}-base:{arch}", f"quay.io/{ms.repo}-base:{other}"
    docker_cleanup.image(new_ref, native_ref, foreign_ref, native.config_digest, foreign.config_digest,
                         new.config_digest)
    store = BlobDir(tmp_path / "blobs")
    bases = {}
    for image, ref in ((native, native_ref), (foreign, foreign_ref)):
        bases[ref] = tmp_path / ref.rsplit(":", 1)[1]
        write(bases[ref], [store.pulled(image, ref)], store)
        r = imgtool("load", str(bases[ref]), docker_host=services.docker_host)
        assert r.returncode == 0, r.stderr

    inv = tmp_path / "inventory.json"
    assert imgtool("inventory", "-o", str(inv), docker_host=services.docker_host).returncode == 0
    doc = json.loads(inv.read_text())
    doc["images"].sort(key=lambda im: im["tags"] != [foreign_ref])  # the foreign image listed first
    inv.write_text(json.dumps(doc))

    out = tmp_path / "v2-delta"
    r = imgtool("fetch", "--no-tool", "v2", "--arch", arch, "--mirrors", str(cfg), "-o", str(out), "--have", str(inv),
                env={"IMGTOOL_CACHE": str(tmp_path / "cache")})
    assert r.returncode == 0, r.stderr
    assert f"  the offline Docker must already hold: one of {native_ref}, {foreign_ref}" in r.stdout
    # the bases were never published: in the containerd store their blobs cannot be checked, and they are gzip
    unchecked = f"warning: {new_ref}: cannot check that the containerd image store of the inventory inventory.json"
    assert (unchecked in r.stderr) == docker_cli.containerd_store, r.stderr
    index = BundleIndex.from_bytes((out / "bundle.json").read_bytes())
    assert [x.provided_by for x in index.images[0].layers if x.omitted] == [(native_ref, foreign_ref)] * 2
    ok = imgtool("verify", str(out))
    assert ok.returncode == 0, ok.stderr
    assert (f"delta bundle: 2 layers left out on purpose (Docker must already hold them: one of {native_ref}, "
            f"{foreign_ref})") in ok.stdout

    sh_env = {"DOCKER": f"docker -H {services.docker_host}", "PATH": "/usr/bin:/bin:/usr/local/bin"}
    # only the native base present: load.sh loads (it used to demand the foreign image)
    docker_cli("image", "rm", "-f", foreign_ref)
    loaded = subprocess.run(["sh", str(out / "load.sh")], capture_output=True, text=True, env=sh_env)
    assert loaded.returncode == 0, loaded.stderr
    assert docker_cli.holds(new_ref, new)

    # only the foreign base present: imgtool load and load.sh both load
    docker_cli("image", "rm", "-f", new_ref, native_ref)
    assert imgtool("load", str(bases[foreign_ref]), docker_host=services.docker_host).returncode == 0
    r = imgtool("load", str(out), docker_host=services.docker_host)
    assert r.returncode == 0, r.stderr
    docker_cli("image", "rm", "-f", new_ref)
    loaded = subprocess.run(["sh", str(out / "load.sh")], capture_output=True, text=True, env=sh_env)
    assert loaded.returncode == 0, loaded.stderr

    # neither: both refuse, naming the choice
    docker_cli("image", "rm", "-f", new_ref, foreign_ref)
    refused = imgtool("load", str(out), docker_host=services.docker_host)
    assert refused.returncode == 1
    assert refused.stderr.splitlines()[-1] == (
        f"hint: load one of {native_ref}, {foreign_ref} (from the inventory inventory.json) first, then this "
        "bundle; or fetch a full bundle (without --have/--base)")
    refused = subprocess.run(["sh", str(out / "load.sh")], capture_output=True, text=True, env=sh_env)
    assert refused.returncode == 1
    assert (f"load.sh: error: this is a delta bundle and Docker lacks one of {native_ref}, {foreign_ref}; load that "
            "image (its bundle) first") in refused.stderr
    assert docker_cli.find(new) is None


# --- every delta kind leaves Docker holding the whole image (issue 24 item 9) ----------------------

DELTA_KINDS = {
    # kind: (new image's layers in the registry, fetch's --layers)
    "gzip": ("gzip", "compat"),
    "zstd-compat": ("zstd", "compat"),
    "zstd-as-is": ("zstd", "as-is"),
    "plain": ("gzip", "plain"),
}


@pytest.mark.engines(stores=True)
@pytest.mark.parametrize("kind", list(DELTA_KINDS))
def test_a_loaded_delta_saves_pushes_and_exports(kind, services, factory, mirrored, tmp_path, docker_cli,
                                                 docker_cleanup, engine):
    """A base from the registry (gzip) loaded, the inventory taken, the next release fetched as a delta
    of each kind and loaded: Docker holds all of it (`docker save` has every layer, `docker push` and
    `imgtool export` succeed), as after a full bundle."""
    compression, mode = DELTA_KINDS[kind]
    arch = host_arch()
    base = factory.layers(2, size=200_000)
    old = factory.image(arch, layers=1, base=base, layer_size=100_000)
    new = factory.image(arch, layers=1, base=base, layer_size=100_000)
    published = factory.zstd_twin(new) if compression == "zstd" else new
    ms = mirrored(factory.index([old]), tag="v1", targets=("upstream",))
    mirrored(factory.index([published]), tag="v2", targets=("upstream",))
    cfg = _mirrors(tmp_path, services, ms)
    env = {"IMGTOOL_CACHE": str(tmp_path / "cache")}
    old_ref, new_ref = f"quay.io/{ms.repo}:v1", f"quay.io/{ms.repo}:v2"
    pushed = f"{services.plain}/{ms.repo}-pushed:v2"
    docker_cleanup.image(pushed, new_ref, old_ref, *docker_cli.ids_of(old), *docker_cli.ids_of(new))

    r = imgtool("fetch", "--no-tool", "v1", "--mirrors", str(cfg), "-o", str(tmp_path / "v1"), env=env)
    assert r.returncode == 0, r.stderr
    assert imgtool("load", str(tmp_path / "v1"), docker_host=services.docker_host).returncode == 0
    inv = tmp_path / "inventory.json"
    assert imgtool("inventory", "-o", str(inv), docker_host=services.docker_host).returncode == 0
    out = tmp_path / "v2"
    r = imgtool("fetch", "--no-tool", "v2", "--layers", mode, "--mirrors", str(cfg), "-o", str(out),
                "--have", str(inv), "--json", env=env)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["delta"]["omitted_layers"] == 2
    r = imgtool("load", str(out), docker_host=services.docker_host)
    if mode == "as-is" and engine == "20.10":
        # Docker 20.10 cannot read zstd layers: the delta is refused before anything is sent
        assert r.returncode != 0 and "cannot read zstd-compressed layers" in r.stderr, r.stderr
        assert not docker_cli.holds(new_ref, new)
        return
    assert r.returncode == 0, r.stderr
    assert docker_cli("image", "inspect", new_ref, "--format", "{{json .RootFS.Layers}}").stdout.strip() == \
        json.dumps(new.diff_ids, separators=(",", ":"))

    _save_push_export(services, docker_cli, tmp_path, new_ref, pushed, env)
    assert imgtool("verify", str(tmp_path / "exported")).returncode == 0


def docker_saves_every_layer(docker_cli, tmp_path, ref: str) -> None:
    """`docker save` of `ref` succeeds and its archive holds every layer blob its manifest.json names."""
    saved = tmp_path / "saved.tar"
    r = docker_cli("save", "-o", str(saved), ref, check=False)
    assert r.returncode == 0, r.stderr
    with tarfile.open(saved) as tar:
        names = set(tar.getnames())
        manifest = json.load(tar.extractfile("manifest.json"))
    assert manifest[0]["Layers"] and all(x in names for x in manifest[0]["Layers"]), (manifest, sorted(names))


def _save_push_export(services, docker_cli, tmp_path, ref: str, pushed: str, env) -> None:
    """`docker save` of `ref` holds every layer blob, `docker push` to `pushed` and `imgtool export` succeed."""
    docker_saves_every_layer(docker_cli, tmp_path, ref)
    docker_cli("tag", ref, pushed)
    r = docker_cli("push", pushed, check=False)
    assert r.returncode == 0, r.stderr
    r = imgtool("export", ref, "--no-tool", "-o", str(tmp_path / "exported"), env=env, docker_host=services.docker_host)
    assert r.returncode == 0, r.stderr


@pytest.mark.engines(stores=True)
def test_a_zstd_delta_for_the_containerd_store_names_a_base_bundle_s_blobs(services, factory, mirrored, tmp_path,
                                                                         docker_cli, docker_cleanup):
    """A base loaded from a bundle no registry serves: a zstd delta against a containerd store's inventory
    is refused before any download (its blobs are unknown); with the base bundle (--base) its manifest
    names the base's blobs and the loaded image saves, pushes and exports."""
    from tests.support.bundles import BlobDir, write

    arch = host_arch()
    base = factory.layers(2, size=200_000)
    old = factory.image(arch, layers=1, base=base, layer_size=100_000)
    new = factory.image(arch, layers=1, base=base, layer_size=100_000)
    ms = mirrored(factory.index([factory.zstd_twin(new)]), tag="v2", targets=("upstream",))
    cfg = _mirrors(tmp_path, services, ms)
    env = {"IMGTOOL_CACHE": str(tmp_path / "cache")}
    old_ref, new_ref = f"quay.io/{ms.repo}-base:v1", f"quay.io/{ms.repo}:v2"
    pushed = f"{services.plain}/{ms.repo}-pushed:v2"
    docker_cleanup.image(pushed, new_ref, old_ref, *docker_cli.ids_of(old), *docker_cli.ids_of(new))
    store = BlobDir(tmp_path / "blobs")
    write(tmp_path / "v1", [store.pulled(old, old_ref)], store)
    assert imgtool("load", str(tmp_path / "v1"), docker_host=services.docker_host).returncode == 0
    inv = tmp_path / "inventory.json"
    assert imgtool("inventory", "-o", str(inv), docker_host=services.docker_host).returncode == 0
    assert json.loads(inv.read_text())["daemon"]["image_store"] == ("containerd" if docker_cli.containerd_store
                                                                     else "graphdriver")

    r = imgtool("fetch", "--no-tool", "v2", "--mirrors", str(cfg), "-o", str(tmp_path / "refused"), "--have", str(inv),
                env=env)
    if docker_cli.containerd_store:
        assert r.returncode == 2, r.stderr
        assert r.stderr.splitlines()[-2:] == [
            f"error: cannot make {new_ref} a delta for the containerd image store of the inventory inventory.json: its "
            "manifest must name the blobs that Docker holds for the 2 layers it leaves out, and neither the cache nor "
            f"any source has the manifest of {old_ref} ({docker_cli.bundle_id(old)})",
            "hint: give the bundle that image was loaded from with --base DIR, or fetch a full bundle (without --have)"]
        assert not (tmp_path / "refused").exists() and not (tmp_path / "cache" / "blobs" / "sha256" /
                                                           new.layers[-1].zstd().digest[7:]).exists()
    else:  # a graphdriver store saves from its layers: the blobs a manifest names do not matter
        assert r.returncode == 0, r.stderr

    out = tmp_path / "v2"
    r = imgtool("fetch", "--no-tool", "v2", "--mirrors", str(cfg), "-o", str(out), "--have", str(inv),
                "--base", str(tmp_path / "v1"), "--json", env=env)
    assert r.returncode == 0, r.stderr
    assert (f"{new_ref} (linux/{arch}): 2 left-out layers named as the offline Docker holds them (its base's "
            "blobs); the image ID is unchanged") in r.stderr
    doc = json.loads((out / "bundle.json").read_text())["images"][0]
    assert [(x["digest"], x.get("omitted", False)) for x in doc["layers"]] == \
        [(x.digest, True) for x in base] + [(doc["layers"][2]["digest"], False)]
    assert doc["upstream"]["base_blobs"] == [0, 1]
    assert imgtool("verify", str(out)).returncode == 0
    r = imgtool("load", str(out), docker_host=services.docker_host)
    assert r.returncode == 0, r.stderr
    assert docker_cli.inspect_image(new_ref)["RootFS"]["Layers"] == new.diff_ids
    _save_push_export(services, docker_cli, tmp_path, new_ref, pushed, env)


def _inventory(image, tags) -> dict:
    return {"format": "imgtool-inventory", "version": 1, "created": "2026-01-01T00:00:00Z", "daemon": {},
            "images": [{"id": image.config_digest, "tags": tags, "platform": image.platform,
                        "diff_ids": image.diff_ids}]}


def test_an_inventory_name_with_commands_is_refused_and_a_bundle_json_naming_one_fails_verify(two_tags, tmp_path):
    """Issue 35, case 2: an inventory naming ``base:v0$(touch X)`touch Y` `` gave a delta whose load.sh ran both
    commands in its base check (quotes were stripped, $ and backticks were not), and `imgtool verify` accepted
    that bundle. The name is not a name: fetch refuses the inventory (exit 2), verify the bundle.json (exit 3)."""
    cfg, ms, old, new = two_tags
    env = {"IMGTOOL_CACHE": str(tmp_path / "cache")}
    hostile = f"base:v0$(touch {tmp_path}/x)`touch {tmp_path}/y`"
    inv = tmp_path / "inv.json"
    inv.write_text(json.dumps(_inventory(old, [hostile])))
    out = tmp_path / "delta"
    r = imgtool("fetch", "--no-tool", "v2", "--mirrors", str(cfg), "-o", str(out), "--have", str(inv), env=env)
    assert r.returncode == 2, r.stderr
    assert [line for line in r.stderr.splitlines() if line.startswith(("error:", "hint:"))] == [
        f"error: {inv} is not an imgtool inventory: images[0].tags[0] is not an image name ([HOST[:PORT]/]PATH[:TAG]): "
        f"{hostile!r}",
        "hint: write one on the offline host with `imgtool inventory -o FILE`"]
    assert not out.exists()

    inv.write_text(json.dumps(_inventory(old, ["base:v0"])))
    r = imgtool("fetch", "--no-tool", "v2", "--mirrors", str(cfg), "-o", str(out), "--have", str(inv), env=env)
    assert r.returncode == 0, r.stderr
    doc = json.loads((out / "bundle.json").read_text())
    for layer in doc["images"][0]["layers"]:
        if layer.get("omitted"):
            layer["provided_by"] = [hostile]
    doc["base"]["images"] = [hostile]
    (out / "bundle.json").write_text(json.dumps(doc, indent=2) + "\n")
    r = imgtool("verify", str(out))
    assert r.returncode == 3, r.stderr
    assert r.stderr.splitlines()[0] == (
        "error: bundle.json is malformed: `images[0].layers[0].provided_by` is not a list of names")
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()
