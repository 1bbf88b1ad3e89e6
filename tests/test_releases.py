"""vllm-ascend tags: one reading and one order for `imgtool tags` and the run presets."""

from imgtool.releases import TagInfo, pick_tag


def newest_first(tags):
    return [t.tag for t in sorted(map(TagInfo.parse, tags), key=TagInfo.sort_key, reverse=True)]


def test_releases_order_by_version_then_stage():
    tags = ["v0.9.1", "v0.10.0rc2", "v0.10.0.post1", "v0.9.10", "v0.10.0", "v0.10.0rc10", "v0.10.0.dev3",
            "v0.10.0rc1", "main", "v0.7.3.post1", "latest"]
    assert newest_first(tags) == ["v0.10.0.post1", "v0.10.0", "v0.10.0rc10", "v0.10.0rc2", "v0.10.0rc1",
                                  "v0.10.0.dev3", "v0.9.10", "v0.9.1", "v0.7.3.post1", "main", "latest"]
    # a missing patch number is a zero, and a fourth number sorts above a post release of the third
    assert TagInfo.parse("v1.0rc1").version == TagInfo.parse("v1.0.0rc1").version
    assert newest_first(["v0.9.1.post1", "v0.9.1.1"]) == ["v0.9.1.1", "v0.9.1.post1"]


def test_a_tag_says_release_hardware_and_os():
    t = TagInfo.parse("v0.11.0rc1-310p-openeuler")
    assert (t.release, t.hardware, t.os, t.variant, t.suffix) == ("v0.11.0rc1", "300i-duo", "openeuler",
                                                                  "310p-openeuler", "-310p-openeuler")
    assert TagInfo.parse("v0.9.1").suffix == ""
    t = TagInfo.parse("nightly-main")
    assert (t.release, t.hardware, t.suffix, t.version) == (None, None, None, None)
    assert TagInfo.parse("v0.9.1-dev-a3").hardware is None  # two hardware words: unknown, not a guess


def test_presets_pick_in_the_listing_order_but_never_a_dev_build():
    tags = ["v0.10.0.dev1-a3", "v0.9.0-a3", "v0.10.0rc1-a3-openeuler", "v0.10.0rc1-a3", "v0.10.0-310p"]
    assert pick_tag(tags, ("-a3", "-a3-openeuler")) == "v0.10.0rc1-a3"  # equal versions: the first suffix
    assert pick_tag(tags, ("-a3-openeuler", "-a3")) == "v0.10.0rc1-a3-openeuler"
    listed = [t for t in newest_first(tags) if TagInfo.parse(t).suffix in ("-a3", "-a3-openeuler")]
    assert listed[:2] == ["v0.10.0rc1-a3-openeuler", "v0.10.0rc1-a3"]  # same release as the pick
    assert pick_tag(["v0.10.0.dev1-a3"], ("-a3",)) is None
