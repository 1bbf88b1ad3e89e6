"""Release bundles from a spec file: bundle.toml, bundle.lock, byte-identical rebuilds.

Against the real `plain` registry standing in for quay.io: three tags x two arches on one
shared base, locked, the tag moved, rebuilt from a fresh cache.
"""

import hashlib
import json
import os
import secrets
import tarfile
from pathlib import Path

import pytest

from imgtool.errors import ConfigError, UsageError
from imgtool.spec import load_spec, parse_created
from tests.support import zygote
from tests.support.images import ImageFactory
from tests.support.registry import RegistryClient, push_image

TAGS = ("v0.22.1rc1", "v0.22.1rc1-a3", "v0.22.1rc1-310p")
CREATED = "2025-06-01T08:00:00Z"


def imgtool(*args, cache, cwd=None, env=None):
    return zygote.run(args, env={**os.environ, "IMGTOOL_CACHE": str(cache), **(env or {})}, cwd=cwd, timeout=120)


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
    return _push_release(services, factory, f"{uniq}/vllm-ascend")


def _push_release(services, factory, repo):
    base = [factory.layer(200_000), factory.layer(200_000)]
    indexes = {}
    for tag in TAGS:
        indexes[tag] = factory.multiarch(layers=1, base=base, layer_size=150_000)
        push_image(services.plain, repo, tag, indexes[tag])
    return repo, base, indexes


class Story:
    """A release's life, one step at a time, each run once by the first test that needs it (and the
    steps before it, in order): lock; fetch from the spec; the tag moves upstream; a rebuild from a fresh
    cache; lock --update; the next release fetched and diffed against the first. Each test below asserts
    one step, so a failure shows which step broke and the others still report."""

    def __init__(self, services, tmp):
        self.services, self.tmp = services, tmp
        self.factory = ImageFactory("test_spec.Story")
        self.repo, self.base, self.indexes = _push_release(services, self.factory, f"t{secrets.token_hex(4)}/vllm-ascend")
        self.root = tmp / "release"
        self.root.mkdir()
        self.spec = write_spec(self.root, services, self.repo)
        self.lock_path = self.root / "bundle.lock"
        self.first = tmp / "one"
        self.done = {}

    def step(self, name, run):
        if name not in self.done:
            self.done[name] = run()
        return self.done[name]

    def run(self, *args, cache, env=None):
        r = imgtool(*args, cache=self.tmp / cache, env=env)
        assert r.returncode == 0, f"imgtool {' '.join(args)}: {r.stderr}"
        return r

    def locked(self):
        return self.step("lock", lambda: self.run("lock", "-f", str(self.spec), cache="c0"))

    def fetched(self):
        def fetch():
            self.locked()
            return self.run("fetch", "-f", str(self.spec), "-o", str(self.first), "--created", CREATED, "--json",
                            cache="c1")
        return self.step("fetch", fetch)

    def moved(self):
        def move():
            self.fetched()
            moved = self.factory.multiarch(layers=1, base=self.base, layer_size=150_000)
            push_image(self.services.plain, self.repo, TAGS[0], moved)
            return moved
        return self.step("move", move)

    def rebuilt(self):
        def rebuild():
            self.moved()
            (self.tmp / "again").mkdir()
            return self.run("fetch", "-f", str(self.spec), "-o", str(self.tmp / "again" / "one"), "-q", cache="c2",
                            env={"SOURCE_DATE_EPOCH": "1748764800"})
        return self.step("rebuild", rebuild)

    def updated(self):
        def update():
            self.rebuilt()
            return self.run("lock", "--update", "-f", str(self.spec), cache="c0")
        return self.step("update", update)

    def diffed(self):
        def diff():
            self.updated()
            self.run("fetch", "-f", str(self.spec), "-o", str(self.tmp / "next"), "-q", cache="c1")
            return json.loads(self.run("diff", str(self.first), str(self.tmp / "next"), "--json", cache="c1").stdout)
        return self.step("diff", diff)


@pytest.fixture(scope="module")
def story(_services, tmp_path_factory):
    return Story(_services, tmp_path_factory.mktemp("story"))


def test_lock_pins_each_tag_and_platform_to_its_digests(story, services):
    r = story.locked()
    lock = json.loads(story.lock_path.read_text())
    assert lock["lock_version"] == 1 and lock["platforms"] == ["linux/arm64", "linux/amd64"]
    assert [(x["ref"], x["name"], x["digest"]) for x in lock["images"]] == [
        (t, f"quay.io/{story.repo}:{t}", story.indexes[t].manifest_digest) for t in TAGS]
    for x in lock["images"]:
        idx = story.indexes[x["ref"]]
        assert x["platforms"] == {"linux/arm64": idx.image("arm64").manifest_digest,
                                  "linux/amd64": idx.image("amd64").manifest_digest}
        assert x["source"] == f"quay ({services.plain}/{story.repo})"
    assert r.stdout.splitlines()[-1] == f"wrote {story.lock_path}: 3 image(s) x 2 platform(s)"


def test_fetch_from_the_spec_uses_the_lock(story):
    r = story.fetched()
    assert f"using {story.lock_path}: 3 image(s) pinned by digest" in r.stderr
    out = json.loads(r.stdout)
    assert (out["spec"], out["lock"]) == (str(story.spec), str(story.lock_path))
    index = json.loads((story.first / "bundle.json").read_text())
    assert index["created"] == CREATED
    assert [(im["ref"], im["platform"]) for im in index["images"]] == [
        (f"quay.io/{story.repo}:{t}", story.indexes[t].image(a).platform) for t in TAGS for a in ("arm64", "amd64")]
    assert all(im["index_digest"] == story.indexes[im["ref"].rsplit(":", 1)[1]].manifest_digest
               for im in index["images"])
    assert len(index["parts"]) > 1


def test_the_bundle_holds_each_blob_once_the_shared_base_included(story, tmp_path):
    out = json.loads(story.fetched().stdout)
    index = json.loads((story.first / "bundle.json").read_text())
    with open(tmp_path / "archive.tar", "wb") as whole:
        for part in index["parts"]:
            whole.write((story.first / part["name"]).read_bytes())
    with tarfile.open(tmp_path / "archive.tar") as tar:
        names = [m.name for m in tar.getmembers()]
    blobs = {n.rsplit("/", 1)[1] for n in names if n.startswith("blobs/")}
    images = [im for idx in story.indexes.values() for im in idx.images]
    want = {layer.digest[7:] for im in images for layer in im.layers}
    want |= {im.config_digest[7:] for im in images} | {im.manifest_digest[7:] for im in images}
    assert len(names) == len(set(names)) and blobs == want
    assert out["blobs"] == len(want) == 2 + 6 + 6 + 6
    assert sum(1 for n in names if n.endswith(story.base[0].digest[7:])) == 1


def test_a_rebuild_after_the_tag_moved_is_byte_identical(story, services):
    story.rebuilt()
    with RegistryClient(services.plain) as c:  # the tag did move: the lock, not the tag, decided
        assert c.head_manifest(story.repo, TAGS[0]) == story.moved().manifest_digest
    assert files_of(story.tmp / "again" / "one") == files_of(story.first)  # bundle.json included


def test_lock_update_says_what_moved_and_then_is_up_to_date(story):
    r = story.updated()
    old, new = story.indexes[TAGS[0]].manifest_digest, story.moved().manifest_digest
    assert r.stdout.splitlines() == [
        f"moved      quay.io/{story.repo}:{TAGS[0]}: {old[7:19]} -> {new[7:19]} (linux/arm64, linux/amd64 changed)",
        f"unchanged  quay.io/{story.repo}:{TAGS[1]}: {story.indexes[TAGS[1]].manifest_digest[7:19]}",
        f"unchanged  quay.io/{story.repo}:{TAGS[2]}: {story.indexes[TAGS[2]].manifest_digest[7:19]}",
        f"wrote {story.lock_path}: 3 image(s) x 2 platform(s), 1 change(s)",
    ]
    assert json.loads(story.lock_path.read_text())["images"][0]["digest"] == new
    r = story.run("lock", "-f", str(story.spec), cache="c0")
    assert r.stdout.startswith(f"{story.lock_path}: up to date with {story.spec}")


def test_the_next_release_says_what_it_shares_with_the_last(story):
    d = story.diffed()
    moved, indexes = story.moved(), story.indexes
    assert [(x["status"], x["name"].rsplit(":", 1)[1]) for x in d["images"]] == [
        (s, t) for s, t in (("changed", TAGS[0]), ("unchanged", TAGS[1]), ("unchanged", TAGS[2])) for _ in "ab"]
    assert d["platforms"]["both"] == ["linux/amd64", "linux/arm64/v8"]
    rows = {x["digest"]: x["status"] for x in d["layers"]}
    assert [rows[x.digest] for x in story.base] == ["shared", "shared"]
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
     "unknown key 'compres' (expected images, models, arch, platforms, output, chunk_size, compress, mirrors, mirror)"),
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
