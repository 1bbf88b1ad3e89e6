"""The pure model: references, platforms, digests, manifests, sizes."""

import json

import pytest
from hypothesis import given, strategies as st

from imgtool.errors import UsageError
from imgtool.model import (DOCKER_LIST, DOCKER_MANIFEST, OCI_INDEX, Digest, ImageConfig, ImageRef, Index, Manifest,
                           ManifestError, Platform, format_size, is_docker_name, parse_manifest, parse_size)

D = "sha256:" + "a" * 64


@pytest.mark.parametrize("text,expected", [
    ("v0.22.1rc1", "quay.io/ascend/vllm-ascend:v0.22.1rc1"),
    ("v0.22.1rc1-a3", "quay.io/ascend/vllm-ascend:v0.22.1rc1-a3"),
    ("main", "quay.io/ascend/vllm-ascend:main"),
    ("vllm-ascend:v0.10.0rc1-310p", "quay.io/ascend/vllm-ascend:v0.10.0rc1-310p"),
    ("cann:8.2.rc1-910b-ubuntu22.04-py3.11", "quay.io/ascend/cann:8.2.rc1-910b-ubuntu22.04-py3.11"),
    ("ascend/vllm-ascend:v1", "quay.io/ascend/vllm-ascend:v1"),
    ("m.daocloud.io/quay.io/ascend/vllm-ascend:v1", "m.daocloud.io/quay.io/ascend/vllm-ascend:v1"),
    ("127.0.0.1:5000/x/y:t", "127.0.0.1:5000/x/y:t"),
    ("localhost/x", "localhost/x:latest"),
    (f"quay.io/ascend/vllm-ascend@{D}", f"quay.io/ascend/vllm-ascend@{D}"),
    (f"quay.io/ascend/vllm-ascend:v1@{D}", f"quay.io/ascend/vllm-ascend:v1@{D}"),
])
def test_reference_forms(text, expected):
    assert str(ImageRef.parse(text)) == expected


@pytest.mark.parametrize("text", ["", " ", "UPPER/x:t", "a b", "x:", "x:-bad", "quay.io/a//b:t", "x@sha256:12",
                                  "quay.io/x:" + "t" * 129, "@" + D, "quay.io/x:t:u", "../x:t"])
def test_invalid_references(text):
    with pytest.raises(UsageError) as e:
        ImageRef.parse(text)
    assert "\n" not in e.value.message and repr(text.strip())[1:-1] in e.value.message or "digest" in e.value.message


def test_reference_message_is_exact():
    with pytest.raises(UsageError) as e:
        ImageRef.parse("UPPER/x:t")
    assert e.value.message == "invalid image reference 'UPPER/x:t'"


@given(st.text(max_size=80))
def test_reference_parser_never_crashes(text):
    try:
        ref = ImageRef.parse(text)
    except UsageError:
        return
    assert ImageRef.parse(str(ref)) == ref  # what we print parses back to the same value


@pytest.mark.parametrize("text,expected", [
    ("arm64", "linux/arm64"), ("aarch64", "linux/arm64"), ("x86_64", "linux/amd64"), ("amd64", "linux/amd64"),
    ("linux/arm64/v8", "linux/arm64/v8"), ("linux/arm/v7", "linux/arm/v7"), ("armv7l", "linux/arm/v7"),
])
def test_platform_parse(text, expected):
    assert str(Platform.parse(text)) == expected


def test_platform_satisfies_variant_defaults():
    assert Platform("linux", "arm64", "v8").satisfies(Platform.parse("arm64"))
    assert Platform("linux", "arm64", None).satisfies(Platform.parse("linux/arm64/v8"))
    assert not Platform("linux", "amd64").satisfies(Platform.parse("arm64"))
    assert not Platform("linux", "arm", "v6").satisfies(Platform.parse("linux/arm/v7"))


@pytest.mark.parametrize("text", ["sparc", "linux/", "a/b/c/d", "linux/ARM 64"])
def test_platform_invalid(text):
    with pytest.raises(UsageError):
        Platform.parse(text)


def test_unknown_arch_message():
    with pytest.raises(UsageError) as e:
        Platform.parse("sparc")
    assert e.value.message == "unknown architecture 'sparc' in 'sparc'"


@pytest.mark.parametrize("text,value", [("4G", 4 << 30), ("700M", 700 << 20), ("4GiB", 4 << 30), ("1k", 1024),
                                        ("1048576", 1 << 20), ("1.5g", 3 << 29), ("2 MB", 2 << 20)])
def test_sizes(text, value):
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["4X", "0", "-1", "", "G", "0M"])
def test_bad_sizes(text):
    with pytest.raises(UsageError):
        parse_size(text, "--chunk-size")


@pytest.mark.parametrize("name,ok", [("vllm-ascend:prod", True), ("quay.io/ascend/vllm-ascend:v0.9.1", True),
                                     ("localhost:5000/team/app", True), ("[::1]:5000/app:1", True),
                                     ("Bad Name", False), ("UPPER:tag", False), ("app:", False), ("app@sha256:" + "a" * 64, False)])
def test_docker_names_follow_the_reference_grammar(name, ok):
    # `load --tag NAME` and ImageRef read names by the same rules
    assert is_docker_name(name) is ok


@pytest.mark.parametrize("n,text", [(0, "0 B"), (1023, "1023 B"), (1024, "1.0 KiB"), (3 << 29, "1.5 GiB"),
                                    (1023 << 40, "1023.0 TiB"), (5 << 50, "5120.0 TiB")])
def test_sizes_as_messages_show_them(n, text):
    # TiB is the largest unit: a bundle's sizes never pass it, and a PiB figure would read as a typo
    assert format_size(n) == text


def test_bad_size_message():
    with pytest.raises(UsageError) as e:
        parse_size("4X", "--chunk-size")
    assert e.value.message == "invalid --chunk-size '4X': use a number with an optional unit K, M, G, T (binary), e.g. 4G or 700M"


def test_digest_rejects_path_tricks():
    for bad in ["sha256:../../etc/passwd", "sha256:" + "A" * 64, "md5:" + "a" * 32, "sha256:" + "a" * 63]:
        with pytest.raises(UsageError):
            Digest.parse(bad)


def _desc(media, digest=D, size=1, **extra):
    return {"mediaType": media, "digest": digest, "size": size, **extra}


def test_parse_index_and_select():
    data = json.dumps({"schemaVersion": 2, "mediaType": DOCKER_LIST, "manifests": [
        _desc(DOCKER_MANIFEST, platform={"os": "linux", "architecture": "amd64"}),
        _desc(DOCKER_MANIFEST, "sha256:" + "b" * 64, platform={"os": "linux", "architecture": "arm64", "variant": "v8"}),
        _desc(DOCKER_MANIFEST, "sha256:" + "c" * 64, platform={"os": "unknown", "architecture": "unknown"}),
    ]}).encode()
    idx = parse_manifest(data)
    assert isinstance(idx, Index)
    assert idx.select(Platform.parse("aarch64")).digest.hex == "b" * 64
    with pytest.raises(UsageError) as e:
        idx.select(Platform.parse("s390x"))
    assert e.value.message == "platform linux/s390x not found in the image index; it offers: linux/amd64, linux/arm64/v8"


def test_parse_manifest_checks():
    good = {"schemaVersion": 2, "mediaType": DOCKER_MANIFEST, "config": _desc("application/vnd.docker.container.image.v1+json"),
            "layers": [_desc("application/vnd.docker.image.rootfs.diff.tar.gzip", size=10)]}
    m = parse_manifest(json.dumps(good).encode())
    assert isinstance(m, Manifest) and m.size == 11
    with pytest.raises(ManifestError, match="schema 1"):
        parse_manifest(json.dumps({"schemaVersion": 1, "fsLayers": []}).encode())
    with pytest.raises(ManifestError, match="unsupported manifest media type"):
        parse_manifest(json.dumps({"schemaVersion": 2, "mediaType": "text/plain"}).encode())
    with pytest.raises(ManifestError, match="over the"):
        parse_manifest(b" " * (5 << 20))
    bad = dict(good, layers=[_desc("application/vnd.docker.image.rootfs.diff.tar.gzip", digest="sha256:../../x")])
    with pytest.raises(ManifestError, match="bad digest"):
        parse_manifest(json.dumps(bad).encode())
    assert isinstance(parse_manifest(json.dumps({"schemaVersion": 2, "manifests": []}).encode(), OCI_INDEX), Index)


def test_image_config():
    cfg = ImageConfig.parse(json.dumps({"architecture": "aarch64", "os": "linux", "rootfs": {"diff_ids": [D]}}).encode())
    assert str(cfg.platform) == "linux/arm64" and cfg.diff_ids == (Digest.parse(D),)


def test_grammars_are_matched_whole_not_up_to_a_final_newline():
    """issue 35: `$` also matches before a final newline, so "sha256:<hex>\\n" was a digest and "base:v0\\n" a
    name `docker tag` takes (it then reached load.sh)."""
    from imgtool.model import is_tag

    good = "sha256:" + "a" * 64
    assert str(Digest.parse(good)) == good
    with pytest.raises(UsageError):
        Digest.parse(good + "\n")
    assert is_docker_name("base:v0") and not is_docker_name("base:v0\n")
    assert is_tag("v0.9.1") and not is_tag("v0.9.1\n")
    from imgtool.bundle import catalog

    assert not catalog.DIGEST.match(good + "\n") and not catalog.TAG.match("v1\n")
    assert catalog.valid_name("ascend/vllm") and not catalog.valid_name("ascend/vllm\n")


def test_platform_fields_from_a_registry_are_oci_tokens():
    assert Platform.from_json({"os": "linux", "architecture": "arm64", "variant": "v8"}) == Platform("linux", "arm64", "v8")
    for field, value in (("variant", "v8\ntouch /tmp/x\n#"), ("architecture", "amd64\x1b[2J"), ("os", "Linux"),
                         ("variant", 8), ("architecture", "x" * 65)):
        with pytest.raises(ManifestError) as e:
            Platform.from_json({"os": "linux", "architecture": "arm64", field: value}, "image config")
        assert e.value.message == f"malformed image config: `{field}` is not a platform token: {value!r}"
    assert Platform("linux", "arm64").agrees(Platform("linux", "arm64", "v8"))
    assert not Platform("linux", "amd64").agrees(Platform("linux", "arm64", "v8"))
    assert not Platform("linux", "arm", "v6").agrees(Platform("linux", "arm", "v7"))
