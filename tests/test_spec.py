"""Release bundles from a spec file: bundle.toml, bundle.lock, byte-identical rebuilds.

Against the real `plain` registry standing in for quay.io: three tags x two arches on one
shared base, locked, the tag moved, rebuilt from a fresh cache.
"""

import hashlib
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from imgtool.errors import ConfigError, UsageError
from imgtool.spec import load_spec, parse_created
from tests.support.registry import RegistryClient, push_image

TAGS = ("v0.22.1rc1", "v0.22.1rc1-a3", "v0.22.1rc1-310p")
CREATED = "2025-06-01T08:00:00Z"


def imgtool(*args, cache, cwd=None, env=None):
    return subprocess.run([sys.executable, "-m", "imgtool", *args], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, "IMGTOOL_CACHE": str(cache), **(env or {})}, timeout=120)


def write_spec(root: Path, services, repo: str, images=TAGS, extra="") -> Path:
    (root / "mirrors.toml").write_text(
        f'default_image = "quay.io/{repo}"\n[[mirrors]]\nname = "quay"\nregistry = "quay.io"\n'
        f'url = "http://{services.plain}"\nupstream = true\ninsecure = true\n')
    spec = root / "bundle.toml"
    spec.write_text("# release bundle\n"
                    f"images = {json.dumps(list(images))}\n"
                    'arch = ["arm64", "amd64"]\n'
                    'chunk_size = "1M"\n'
                    'compress = "none"\n'
                    'mirrors = "mirrors.toml"\n' + extra)
    return spec


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def files_of(bundle: Path) -> dict:
    return {p.name: sha(p) for p in sorted(bundle.iterdir())}


@pytest.fixture
def release(services, factory, uniq, tmp_path):
    """Three tags of one release on one shared base, pushed; returns (repo, base layers, indexes)."""
    base = [factory.layer(200_000), factory.layer(200_000)]
    repo = f"{uniq}/vllm-ascend"
    indexes = {}
    for tag in TAGS:
        indexes[tag] = factory.multiarch(layers=1, base=base, layer_size=150_000)
        push_image(services.plain, repo, tag, indexes[tag])
    return repo, base, indexes


def test_spec_builds_locks_and_rebuilds_byte_identical_after_the_tag_moved(services, factory, release, tmp_path):
    repo, base, indexes = release
    root = tmp_path / "release"
    root.mkdir()
    spec = write_spec(root, services, repo)

    r = imgtool("lock", "-f", str(spec), cache=tmp_path / "c0")
    assert r.returncode == 0, r.stderr
    lock = json.loads((root / "bundle.lock").read_text())
    assert lock["lock_version"] == 1 and lock["platforms"] == ["linux/arm64", "linux/amd64"]
    assert [(x["ref"], x["name"], x["digest"]) for x in lock["images"]] == [
        (t, f"quay.io/{repo}:{t}", indexes[t].manifest_digest) for t in TAGS]
    for x in lock["images"]:
        idx = indexes[x["ref"]]
        assert x["platforms"] == {"linux/arm64": idx.image("arm64").manifest_digest,
                                  "linux/amd64": idx.image("amd64").manifest_digest}
        assert x["source"] == f"quay ({services.plain}/{repo})"
    assert r.stdout.splitlines()[-1] == f"wrote {root / 'bundle.lock'}: 3 image(s) x 2 platform(s)"

    r = imgtool("fetch", "-f", str(spec), "-o", str(tmp_path / "one"), "--created", CREATED, "--json",
                cache=tmp_path / "c1")
    assert r.returncode == 0, r.stderr
    assert f"using {root / 'bundle.lock'}: 3 image(s) pinned by digest" in r.stderr
    out = json.loads(r.stdout)
    assert (out["spec"], out["lock"]) == (str(spec), str(root / "bundle.lock"))
    first = tmp_path / "one"
    index = json.loads((first / "bundle.json").read_text())
    assert index["created"] == CREATED
    assert [(im["ref"], im["platform"]) for im in index["images"]] == [
        (f"quay.io/{repo}:{t}", indexes[t].image(a).platform) for t in TAGS for a in ("arm64", "amd64")]
    assert all(im["index_digest"] == indexes[im["ref"].rsplit(":", 1)[1]].manifest_digest for im in index["images"])
    # one bundle; the shared base layers are stored once: the tar holds each distinct blob exactly once
    with open(tmp_path / "archive.tar", "wb") as whole:
        for part in index["parts"]:
            whole.write((first / part["name"]).read_bytes())
    with tarfile.open(tmp_path / "archive.tar") as tar:
        names = [m.name for m in tar.getmembers()]
    blobs = {n.rsplit("/", 1)[1] for n in names if n.startswith("blobs/")}
    images = [im for idx in indexes.values() for im in idx.images]
    want = {layer.digest[7:] for im in images for layer in im.layers}
    want |= {im.config_digest[7:] for im in images} | {im.manifest_digest[7:] for im in images}
    assert len(names) == len(set(names)) and blobs == want
    assert out["blobs"] == len(want) == 2 + 6 + 6 + 6
    assert sum(1 for n in names if n.endswith(base[0].digest[7:])) == 1
    assert len(index["parts"]) > 1

    # the tag moves upstream after locking
    moved = factory.multiarch(layers=1, base=base, layer_size=150_000)
    push_image(services.plain, repo, TAGS[0], moved)
    with RegistryClient(services.plain) as c:
        assert c.head_manifest(repo, TAGS[0]) == moved.manifest_digest

    # rebuild (same output name, elsewhere) from a fresh cache: the same bytes, bundle.json included
    (tmp_path / "again").mkdir()
    r = imgtool("fetch", "-f", str(spec), "-o", str(tmp_path / "again" / "one"), "-q", cache=tmp_path / "c2",
                env={"SOURCE_DATE_EPOCH": "1748764800"})
    assert r.returncode == 0, r.stderr
    assert files_of(tmp_path / "again" / "one") == files_of(first)

    # --update re-resolves and says what moved
    r = imgtool("lock", "--update", "-f", str(spec), cache=tmp_path / "c0")
    assert r.returncode == 0, r.stderr
    old, new = indexes[TAGS[0]].manifest_digest, moved.manifest_digest
    assert r.stdout.splitlines() == [
        f"moved      quay.io/{repo}:{TAGS[0]}: {old[7:19]} -> {new[7:19]} (linux/arm64, linux/amd64 changed)",
        f"unchanged  quay.io/{repo}:{TAGS[1]}: {indexes[TAGS[1]].manifest_digest[7:19]}",
        f"unchanged  quay.io/{repo}:{TAGS[2]}: {indexes[TAGS[2]].manifest_digest[7:19]}",
        f"wrote {root / 'bundle.lock'}: 3 image(s) x 2 platform(s), 1 change(s)",
    ]
    assert json.loads((root / "bundle.lock").read_text())["images"][0]["digest"] == new
    r = imgtool("lock", "-f", str(spec), cache=tmp_path / "c0")
    assert r.returncode == 0 and r.stdout.startswith(f"{root / 'bundle.lock'}: up to date with {spec}")

    # the next release: what it shares with the last one
    r = imgtool("fetch", "-f", str(spec), "-o", str(tmp_path / "next"), "-q", cache=tmp_path / "c1")
    assert r.returncode == 0, r.stderr
    r = imgtool("diff", str(first), str(tmp_path / "next"), "--json", cache=tmp_path / "c1")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert [(x["status"], x["name"].rsplit(":", 1)[1]) for x in d["images"]] == [
        (s, t) for s, t in (("changed", TAGS[0]), ("unchanged", TAGS[1]), ("unchanged", TAGS[2])) for _ in "ab"]
    assert d["platforms"]["both"] == ["linux/amd64", "linux/arm64/v8"]
    rows = {x["digest"]: x["status"] for x in d["layers"]}
    assert [rows[x.digest] for x in base] == ["shared", "shared"]
    assert rows[moved.image("arm64").layers[-1].digest] == "added"
    assert rows[indexes[TAGS[0]].image("arm64").layers[-1].digest] == "removed"
    assert d["totals"]["added_bytes"] == sum(im.layers[-1].size for im in moved.images)


def test_without_a_lock_fetch_resolves_tags_now(services, release, tmp_path):
    repo, _, indexes = release
    spec = write_spec(tmp_path, services, repo, images=TAGS[:1], extra='output = "rel-out"\n')
    r = imgtool("fetch", "-f", str(spec), "--json", cache=tmp_path / "c", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert f"no bundle.lock beside {spec}: tags are resolved now (imgtool lock -f {spec} pins them)" in r.stderr
    index = json.loads((tmp_path / "rel-out" / "bundle.json").read_text())
    assert [(im["index_digest"], im["platform"]) for im in index["images"]] == [
        (indexes[TAGS[0]].manifest_digest, indexes[TAGS[0]].image(a).platform) for a in ("arm64", "amd64")]


def test_a_lock_that_no_longer_fits_the_spec_is_an_error(services, release, tmp_path):
    repo, _, _ = release
    spec = write_spec(tmp_path, services, repo)
    assert imgtool("lock", "-f", str(spec), cache=tmp_path / "c").returncode == 0
    write_spec(tmp_path, services, repo, images=TAGS[:2] + ("v0.22.1rc2",))
    lock = tmp_path / "bundle.lock"
    expected = [f"error: {lock} does not match {spec}: not locked: quay.io/{repo}:v0.22.1rc2; "
                f"no longer in the spec: quay.io/{repo}:{TAGS[2]}",
                f"hint: run imgtool lock --update -f {spec}"]
    for verb in (("fetch", "-f", str(spec), "-o", str(tmp_path / "b")), ("lock", "-f", str(spec))):
        r = imgtool(*verb, cache=tmp_path / "c")
        assert (r.returncode, r.stderr.splitlines()[-2:]) == (2, expected), r.stderr
    assert not (tmp_path / "b").exists()
    r = imgtool("fetch", "-f", str(spec), "--arch", "arm64", cache=tmp_path / "c")
    assert r.returncode == 2 and "error: --arch/--platform cannot be used with -f: the spec's platforms decide" in r.stderr
    r = imgtool("fetch", "-f", str(spec), "v1", cache=tmp_path / "c")
    assert r.returncode == 2 and "error: give image references or -f SPEC, not both" in r.stderr


def test_a_pinned_digest_gone_from_the_registry_says_to_update_the_lock(services, release, tmp_path):
    repo, _, indexes = release
    spec = write_spec(tmp_path, services, repo, images=TAGS[:1])
    assert imgtool("lock", "-f", str(spec), cache=tmp_path / "c").returncode == 0
    with RegistryClient(services.plain) as c:
        c.delete_manifest(repo, indexes[TAGS[0]].manifest_digest)
    r = imgtool("fetch", "-f", str(spec), "-o", str(tmp_path / "b"), cache=tmp_path / "c")
    assert r.returncode == 4, r.stderr
    assert r.stderr.splitlines()[-1] == ("hint: bundle.lock pins a digest no source serves any more: "
                                         "imgtool lock --update -f SPEC")


@pytest.mark.parametrize("body, where, problem", [
    ('images = ["v1"]\narch = ["arm64"]\nchunk_size = "4X"\n', 3,
     "invalid chunk_size '4X': use a carrier (fat32, dvd, dvd-dl, bd25, bd50) or a number with an optional unit "
     "K, M, G, T (binary), e.g. 700M"),
    ('images = ["v1"]\narch = "arm64"\ncompres = "gzip"\n', 3,
     "unknown key 'compres' (expected images, arch, platforms, output, chunk_size, compress, mirrors, mirror)"),
    ('# spec\nimages = ["v1", "v1"]\narch = ["arm64"]\n', 2, "image 'v1' is listed twice"),
    ('images = ["v1"]\narch = ["arm64", "sparc"]\n', 2, "unknown architecture 'sparc' in 'sparc'"),
    ('images = ["v1"]\narch = ["arm64"]\nplatforms = ["linux/amd64"]\n', 3, "use arch or platforms, not both"),
    ('images = ["v1"]\n', None,
     "missing key 'arch' (e.g. arch = [\"arm64\", \"amd64\"]); a release bundle names its platforms"),
    ('images = []\narch = ["arm64"]\n', 1, "images must be a non-empty array of image references (strings)"),
    ('images = ["v1"]\narch = ["arm64"]\ncompress = "xz"\n', 3, "invalid compress 'xz': use one of none, gzip, zstd"),
    ('images = ["bad ref"]\narch = ["arm64"]\n', 1, "invalid image reference 'bad ref'"),
])
def test_spec_errors_name_the_line_and_key(tmp_path, body, where, problem):
    spec = tmp_path / "bundle.toml"
    spec.write_text(body)
    with pytest.raises(ConfigError) as e:
        load_spec(str(spec))
    assert e.value.message == (f"{spec}:{where}: {problem}" if where else f"{spec}: {problem}")
    r = imgtool("fetch", "-f", str(spec), cache=tmp_path / "c")
    assert (r.returncode, r.stderr.splitlines()[0]) == (2, f"error: {e.value.message}")


def test_spec_values_and_defaults(tmp_path):
    spec = tmp_path / "bundle.toml"
    spec.write_text('images = ["v1", "cann:8.2.rc1-910b-ubuntu22.04-py3.11"]\nplatforms = ["linux/arm64/v8"]\n'
                    'chunk_size = 1048576\noutput = "out"\nmirrors = "m.toml"\nmirror = "nju"\n')
    s = load_spec(str(spec))
    assert (s.images, [str(p) for p in s.platforms], s.chunk_size, s.compress, s.output, s.mirror) == (
        ("v1", "cann:8.2.rc1-910b-ubuntu22.04-py3.11"), ["linux/arm64/v8"], 1 << 20, "none", "out", "nju")
    assert s.mirrors == str(tmp_path / "m.toml") and s.lock_path == tmp_path / "bundle.lock"


def test_created_from_option_or_source_date_epoch():
    assert parse_created(None, None) is None
    assert parse_created("2025-06-01T08:00:00Z", "1") == "2025-06-01T08:00:00Z"
    assert parse_created(None, "1748764800") == "2025-06-01T08:00:00Z"
    with pytest.raises(UsageError) as e:
        parse_created("yesterday")
    assert e.value.message == "invalid --created 'yesterday': use UTC like 2025-06-01T08:00:00Z, or unix seconds"
    with pytest.raises(UsageError):
        parse_created(None, "2025-13-01T00:00:00Z")
