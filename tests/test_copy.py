"""`imgtool copy`: the pipeline's pairs no other verb names, end to end through the real CLI.

registry → runtime against the plain registry and every runtime of the matrix; bundle → bundle on bundles the
real `fetch` wrote.
"""

import json
import re

import pytest

from tests.support.bundles import damage_member, imgtool
from tests.support.images import host_arch


def _mirrors(tmp_path, services, repo):
    cfg = tmp_path / "mirrors.toml"
    cfg.write_text(f'default_image = "quay.io/{repo}"\n[[mirrors]]\nname = "quay"\nregistry = "quay.io"\n'
                   f'url = "http://{services.plain}"\nupstream = true\ninsecure = true\n')
    return cfg


@pytest.mark.runtimes
def test_registry_to_runtime_lands_the_image_as_load_does(services, factory, mirrored, tmp_path, node):
    idx = factory.multiarch(media="oci", layers=2)
    ms = mirrored(idx, tag="v0.22.1rc1", targets=("upstream",))
    image, ref = idx.image(host_arch()), f"quay.io/{ms.repo}:v0.22.1rc1"
    cfg = _mirrors(tmp_path, services, ms.repo)
    env = dict(node.env, IMGTOOL_CACHE=str(tmp_path / "cache"))
    before = node.image_ids()
    node.remove_later(ref, "vllm:prod", node.bundle_id(image))
    r = imgtool("copy", "registry:v0.22.1rc1", "runtime:", "--mirrors-file", str(cfg), "--tag", "vllm:prod", env=env)
    assert r.returncode == 0, r.stderr
    assert set(node.image_ids()) - set(before) == {node.bundle_id(image)}
    assert ref in node.names(image) and "vllm:prod" in node.names(image)
    assert f"copied 1 image(s) from registry:v0.22.1rc1 to {node.title}" in r.stdout
    # the runtime holds it: with a cache of its own (nothing to take from), not one layer is downloaded
    fresh = dict(env, IMGTOOL_CACHE=str(tmp_path / "fresh-cache"))
    again = imgtool("copy", "registry:v0.22.1rc1", "runtime:", "--mirrors-file", str(cfg), "--json", env=fresh)
    assert again.returncode == 0, again.stderr
    assert [im["ref"] for im in json.loads(again.stdout)["images"]] == [ref]
    blobs = tmp_path / "fresh-cache" / "blobs" / "sha256"
    assert not any(p.name in {x.digest.split(":")[1] for x in image.layers} for p in blobs.glob("*")), \
        sorted(p.name for p in blobs.glob("*"))
    assert "download" not in again.stderr


@pytest.mark.runtimes(stores=True)
def test_a_damaged_cached_blob_cuts_the_stream_and_the_runtime_keeps_nothing(services, factory, mirrored, tmp_path,
                                                                             node):
    idx = factory.multiarch(media="oci", layers=2)
    ms = mirrored(idx, tag="v0.22.1rc1", targets=("upstream",))
    image = idx.image(host_arch())
    cfg = _mirrors(tmp_path, services, ms.repo)
    cache = tmp_path / "cache"
    # --compress gzip: the layers go through the cache (an uncompressed bundle takes them straight in)
    warm = imgtool("fetch", "v0.22.1rc1", "--arch", host_arch(), "--mirrors-file", str(cfg), "--no-tool",
                   "--compress", "gzip", "-o", str(tmp_path / "b"), env={"IMGTOOL_CACHE": str(cache)})
    assert warm.returncode == 0, warm.stderr
    last = image.layers[-1]
    blob = cache / "blobs" / "sha256" / last.digest.split(":")[1]
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0xFF
    blob.chmod(0o644)
    blob.write_bytes(bytes(data))
    before = node.image_ids()
    r = imgtool("copy", "registry:v0.22.1rc1", "runtime:", "--mirrors-file", str(cfg),
                env=dict(node.env, IMGTOOL_CACHE=str(cache)))
    assert r.returncode == 1, r.stderr
    assert f"error: blob {last.digest} (layer 2 of quay.io/{ms.repo}:v0.22.1rc1) in the cache does not match its " \
           f"digest: {blob}" in r.stderr
    assert node.image_ids() == before


@pytest.mark.parametrize("source, destination, message", [
    # a runtime is read only through Docker (docker:NAME); docker: is no destination (runtime:docker loads into it)
    ("runtime:", "bundle:b", "error: invalid source 'runtime:': a runtime is a destination; an image in the local "
                             "Docker is the source docker:NAME"),
    ("runtime:containerd", "registry:reg.local", "error: invalid source 'runtime:containerd': a runtime is a "
                                                 "destination; an image in the local Docker is the source docker:NAME"),
    ("registry:v1", "docker:x", "error: invalid destination 'docker:x': docker: is a source (an image in the local "
                                "Docker); load into Docker with runtime:docker"),
    ("oci:x", "bundle:b", "error: invalid source 'oci:x': use registry:REF, bundle:DIR or docker:NAME"),
    ("bundle:a", "tar:x", "error: invalid destination 'tar:x': use registry:HOST[:PORT][/NAMESPACE], bundle:DIR or "
                          "runtime:[NAME]"),
    ("registry:v1", "runtime:cri-o", "error: invalid destination 'runtime:cri-o': the runtime is docker, containerd, "
                                     "podman or auto"),
    ("bundle:", "bundle:b", "error: invalid source 'bundle:': bundle: needs a directory"),
    ("docker:", "bundle:b", "error: invalid source 'docker:': docker: needs an image name"),
    ("bundle:a", "registry:", "error: invalid destination 'registry:': registry: needs a registry "
                              "HOST[:PORT][/NAMESPACE]"),
    ("bundle:a", "registry:https://reg.local/Upper", "error: invalid destination 'registry:https://reg.local/Upper': "
                                                     "expected registry:HOST[:PORT][/NAMESPACE], e.g. "
                                                     "registry:harbor.local/ascend"),
])
def test_ends_copy_does_not_take_are_usage_errors(source, destination, message):
    r = imgtool("copy", source, destination)
    assert r.returncode == 2
    assert r.stderr.splitlines()[0] == message


def _doc_rows(text):
    """docs/copy.md's pair table: (source kind, destination kind, the verb that runs it too or "")."""
    row = re.compile(r"^\| `(\w+):[^`]*` \| `(\w+):[^`]*` \| (?:`imgtool (\w+)[^`]*`|—) \|")
    return {(m.group(1), m.group(2), m.group(3) or "") for m in map(row.match, text.splitlines()) if m}


def test_every_source_goes_to_every_destination_and_the_docs_list_the_pairs_as_they_run():
    """copying.PAIRS is what runs: every source with every destination; docs/copy.md's table lists exactly those
    pairs, each with the verb that runs it too."""
    from pathlib import Path

    from imgtool.copying import DESTINATIONS, PAIRS, SOURCES

    assert {(p.source, p.destination) for p in PAIRS} == {(s, d) for s in SOURCES for d in DESTINATIONS}
    assert len(PAIRS) == len(SOURCES) * len(DESTINATIONS)
    want = {(p.source, p.destination, p.verb or "") for p in PAIRS}
    root = Path(__file__).resolve().parent.parent
    assert _doc_rows((root / "docs" / "copy.md").read_text()) == want


def _two_tags(services, factory, mirrored, tmp_path):
    """v1 and v2 of one repository sharing two base layers (v2 adds one), published upstream."""
    base = factory.layers(2)
    old = factory.image(host_arch(), layers=1, base=base)
    new = factory.image(host_arch(), layers=1, base=base)
    ms = mirrored(factory.index([old]), tag="v1", targets=("upstream",))
    mirrored(factory.index([new]), tag="v2", targets=("upstream",))
    return _mirrors(tmp_path, services, ms.repo), ms, old, new


def _archive_sha(bundle):
    import hashlib

    doc = json.loads((bundle / "bundle.json").read_text())
    sha = hashlib.sha256()
    for part in doc["parts"]:
        sha.update((bundle / part["name"]).read_bytes())
    return sha.hexdigest(), doc


def test_bundle_to_bundle_cuts_again_compresses_and_gives_back_the_same_archive(services, factory, mirrored,
                                                                                 tmp_path):
    cfg, ms, old, _ = _two_tags(services, factory, mirrored, tmp_path)
    src = tmp_path / "v1"
    r = imgtool("fetch", "v1", "--mirrors-file", str(cfg), "-o", str(src), "--chunk-size", "1M",
                env={"IMGTOOL_CACHE": str(tmp_path / "cache")})
    assert r.returncode == 0, r.stderr
    original, doc = _archive_sha(src)
    assert len(doc["parts"]) >= 3
    big = tmp_path / "one-part"
    r = imgtool("copy", f"bundle:{src}", f"bundle:{big}", "--chunk-size", "100M")
    assert r.returncode == 0, r.stderr
    assert imgtool("verify", str(big)).returncode == 0
    sha, copied = _archive_sha(big)
    assert sha == original and len(copied["parts"]) == 1  # the same tar, one part
    assert [im["manifest_digest"] for im in copied["images"]] == [im["manifest_digest"] for im in doc["images"]]
    assert (big / "imgtool.pyz").read_bytes() == (src / "imgtool.pyz").read_bytes()
    small = tmp_path / "zstd"
    r = imgtool("copy", f"bundle:{big}", f"bundle:{small}", "--compress", "zstd")
    assert r.returncode == 0, r.stderr
    assert json.loads((small / "bundle.json").read_text())["archive"]["compression"] == "zstd"
    assert imgtool("verify", str(small)).returncode == 0
    back = tmp_path / "back"
    r = imgtool("copy", f"bundle:{small}", f"bundle:{back}", "--chunk-size", "1M")  # from the compressed stream
    assert r.returncode == 0, r.stderr
    assert _archive_sha(back)[0] == original


def test_bundle_to_bundle_names_a_damaged_part_and_writes_no_bundle(services, factory, mirrored, tmp_path):
    cfg, ms, old, _ = _two_tags(services, factory, mirrored, tmp_path)
    src = tmp_path / "v1"
    r = imgtool("fetch", "--no-tool", "v1", "--mirrors-file", str(cfg), "-o", str(src), "--chunk-size", "1M",
                env={"IMGTOOL_CACHE": str(tmp_path / "cache")})
    assert r.returncode == 0, r.stderr
    spans = damage_member(src, old.layers[-1].digest)  # the third layer: with 1 MiB parts, it spans two
    assert len(spans) == 2
    out = tmp_path / "out"
    r = imgtool("copy", f"bundle:{src}", f"bundle:{out}")
    assert r.returncode == 3, r.stderr
    errors = [line for line in r.stderr.splitlines() if line.startswith(("error:", "hint:"))]
    short = old.layers[-1].digest.split(":")[1][:12]
    assert errors[0] == (f"error: layer 3 of quay.io/{ms.repo}:v1 (blob {short}) is damaged in the bundle "
                         f"(parts {spans[0] + 1:03d}-{spans[1] + 1:03d}): its sha256 differs from its digest"), errors
    assert errors[1] == "hint: run `imgtool verify` on the bundle and re-copy the parts it names"
    assert not out.exists()  # nothing half-written: not even the directory


def test_a_delta_cut_offline_from_a_full_bundle_loads_where_its_base_is(services, factory, mirrored, tmp_path,
                                                                        docker_cli, docker_cleanup):
    # the cut is offline work; a delta's load is every engine's in test_delta: here the first engine loads it
    cfg, ms, old, new = _two_tags(services, factory, mirrored, tmp_path)
    env = {"IMGTOOL_CACHE": str(tmp_path / "cache")}
    old_ref, new_ref = f"quay.io/{ms.repo}:v1", f"quay.io/{ms.repo}:v2"
    docker_cleanup.image(old_ref, old.config_digest)
    docker_cleanup.image(new_ref, new.config_digest)
    for tag in ("v1", "v2"):
        r = imgtool("fetch", "--no-tool", tag, "--mirrors-file", str(cfg), "-o", str(tmp_path / tag), env=env)
        assert r.returncode == 0, r.stderr
    assert imgtool("load", str(tmp_path / "v1"), docker_host=services.docker_host).returncode == 0
    inv = tmp_path / "inventory.json"
    assert imgtool("inventory", "-o", str(inv), docker_host=services.docker_host).returncode == 0
    delta = tmp_path / "v2-delta"
    r = imgtool("copy", f"bundle:{tmp_path / 'v2'}", f"bundle:{delta}", "--have", str(inv), "--json")
    assert r.returncode == 0, r.stderr
    layers = json.loads((delta / "bundle.json").read_text())["images"][0]["layers"]
    assert [bool(x.get("omitted")) for x in layers] == [True, True, False]
    assert json.loads(r.stdout)["delta"]["omitted_layers"] == 2
    loaded = imgtool("load", str(delta), docker_host=services.docker_host)
    assert loaded.returncode == 0, loaded.stderr
    assert docker_cli.holds(new_ref, new)


def test_the_pyz_cuts_a_bundle_again_on_kylins_python(factory, tmp_path):
    """bundle → bundle is offline work: imgtool.pyz on Python 3.7 (isolated, stdlib only) cuts a bundle into other
    parts and the result is the same archive, checked by 3.11's verify."""
    from imgtool.bundle import loadsh
    from imgtool.bundle.reader import read_index
    from tests.support.bundles import BlobDir, write
    from tests.test_selfbundle import old_python, run_clean

    store = BlobDir(tmp_path / "blobs")
    src = tmp_path / "src"
    write(src, [store.pulled(factory.image(host_arch(), layers=3), "quay.io/ascend/vllm-ascend:v1")], store,
          chunk_size=700 * 1024)
    pyz = tmp_path / "imgtool.pyz"
    assert imgtool("self-bundle", "-o", str(pyz), "-q").returncode == 0
    r = run_clean(old_python("3.7"), str(pyz), "copy", "bundle:src", "bundle:out", "--chunk-size", "1M",
                  cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert imgtool("verify", str(tmp_path / "out")).returncode == 0
    assert _archive_sha(tmp_path / "out")[0] == _archive_sha(src)[0]
    # load.sh is the package's shell file with the bundle's parameters (bundle/loadsh.py), carried in the pyz:
    # the one 3.7 wrote is the one this checkout writes
    index, _ = read_index(tmp_path / "out")
    assert (tmp_path / "out" / "load.sh").read_bytes() == loadsh.load_sh(index)


def test_a_signed_source_is_signed_again_with_sign_key_or_the_copy_says_it_is_unsigned(factory, tmp_path):
    """A signature covers one bundle.json's bytes, and a copy's bundle.json is new (its parts, compression, time of
    making): the copy is signed with --sign-key, or says plainly (stderr, and --json's warnings) that it is not."""
    import hashlib
    import subprocess

    from tests.support.bundles import BlobDir, write
    from tests.test_edited import Keys

    store = BlobDir(tmp_path / "blobs")
    src = tmp_path / "src"
    write(src, [store.pulled(factory.image(host_arch(), layers=2), "quay.io/ascend/vllm-ascend:v1")], store,
          chunk_size=700 * 1024)
    home = tmp_path / "home"
    home.mkdir()
    env = {"HOME": str(home), "IMGTOOL_SIGNERS": ""}
    keys = Keys(tmp_path / "keys")
    assert imgtool("sign", str(src), "--sign-key", str(keys.key), env=env).returncode == 0
    expect = hashlib.sha256((src / "bundle.json").read_bytes()).hexdigest()
    fingerprint = subprocess.run(["ssh-keygen", "-l", "-f", f"{keys.key}.pub"], capture_output=True, text=True,
                                 check=True, timeout=60).stdout.split()
    signer = f"{fingerprint[-1].strip('()')} key {fingerprint[1]}"

    plain = tmp_path / "plain"
    r = imgtool("copy", f"bundle:{src}", f"bundle:{plain}", "--chunk-size", "100M", "--expect", expect,
                "--signers", str(keys.policy), "--json", env=env)
    assert r.returncode == 0, r.stderr
    said = (f"the new bundle {plain} is unsigned: {src} is signed (by {signer}), but a signature covers only the "
            "bundle.json it was made for, and the copy's bundle.json is new (its parts, compression and time of "
            f"making); sign it: imgtool sign {plain} --sign-key KEY (or copy with --sign-key KEY)")
    assert f"warning: {said}" in r.stderr.splitlines()
    out = json.loads(r.stdout)
    assert said in out["warnings"] and out["signature"] is None
    assert not (plain / "bundle.json.sig").exists()
    refused = imgtool("verify", str(plain), "--signers", str(keys.policy), env=env)
    assert refused.returncode == 3

    signed = tmp_path / "signed"
    r = imgtool("copy", f"bundle:{src}", f"bundle:{signed}", "--chunk-size", "100M", "--sign-key", str(keys.key),
                env=env)
    assert r.returncode == 0, r.stderr
    assert "unsigned" not in r.stderr
    assert f"signed: {signed / 'bundle.json.sig'} by {signer}" in r.stdout.splitlines()
    ok = imgtool("verify", str(signed), "--signers", str(keys.policy), env=env)
    assert ok.returncode == 0, ok.stderr
    assert "signature: signed by release@example.com" in ok.stdout


@pytest.mark.parametrize("args, message, hint", [
    (("registry:v1", "runtime:", "--expect", "x"), "error: --expect is for a bundle source (copy bundle:DIR ...)",
     "hint: a registry source is checked by its digests as it is downloaded"),
    (("docker:x", "runtime:", "--signers", "x"), "error: --signers is for a bundle source (copy bundle:DIR ...)",
     "hint: a registry source is checked by its digests as it is downloaded"),
    (("registry:v1", "runtime:", "--sign-key", "x"),
     "error: --sign-key is for a bundle destination (copy ... bundle:DIR)", None),
    (("bundle:a", "registry:reg.local", "--have", "x"),
     "error: --have is for a bundle destination (copy ... bundle:DIR)", None),
    (("bundle:a", "bundle:b", "--insecure"), "error: --insecure is for a registry destination (copy ... registry:HOST)",
     None),
    (("docker:x", "bundle:b", "--base", "x"),
     "error: --have and --base are for a registry or bundle source: a copy from Docker (as export) writes a full "
     "bundle", None),
])
def test_an_option_for_another_end_is_a_usage_error(args, message, hint):
    r = imgtool("copy", *args)
    assert r.returncode == 2
    lines = [line for line in r.stderr.splitlines() if line.startswith(("error:", "hint:"))]
    assert lines == [message] + ([hint] if hint else [])


def test_bundle_to_bundle_carries_the_models_unchanged(factory, tmp_path):
    """copy bundle:A bundle:B of an image+model bundle: B's bundle.json names the same models (same artifact
    digests, same files), its archive is the same bytes whatever the parts and compression, and a model placed
    from a zstd copy is the model."""
    from tests.support.bundles import BlobDir, canonical_tar, put_model, write
    from tests.support.models import small_model

    store = BlobDir(tmp_path / "blobs")
    model = small_model(seed=4804)
    image = factory.image(host_arch(), layers=1)
    src = tmp_path / "src"
    write(src, [store.pulled(image, "quay.io/ascend/vllm-ascend:withmodel")], store,
          models=[put_model(store, model, modelcar=True)], chunk_size=64 << 10)
    zstd, back = tmp_path / "zstd", tmp_path / "back"
    for a, b, args in ((src, zstd, ("--compress", "zstd")), (zstd, back, ("--chunk-size", "1M"))):
        r = imgtool("copy", f"bundle:{a}", f"bundle:{b}", *args)
        assert r.returncode == 0, r.stderr
        assert imgtool("verify", str(b)).returncode == 0
        assert json.loads((b / "bundle.json").read_text())["models"] == json.loads((src / "bundle.json").read_text())["models"]
        assert all("modelcar" in f for f in json.loads((b / "bundle.json").read_text())["models"][0]["files"])
    assert canonical_tar(back) == canonical_tar(src)
    r = imgtool("load", str(zstd), "--models-only", "--models-dir", str(tmp_path / "plain"))
    assert r.returncode == 0, r.stderr
    for path, f in model.head.files.items():
        assert (tmp_path / "plain" / model.repo_id / path).read_bytes() == f.read()
