"""mirrors.toml: lookup order, the shipped copy, and one-line errors with exit 2."""

from pathlib import Path

import pytest

from imgtool.config import BUILTIN_MIRRORS, load_mirrors
from tests.support import zygote

ROOT = Path(__file__).resolve().parents[1]


def run(*args, env=None, cwd=None):
    return zygote.run(args, env=env, cwd=cwd)


def test_shipped_copy_is_the_top_level_file():
    assert BUILTIN_MIRRORS.read_bytes() == (ROOT / "mirrors.toml").read_bytes()


def test_builtin_defaults():
    cfg = load_mirrors(None)
    assert cfg.default_image == "quay.io/ascend/vllm-ascend"
    assert [(m.name, m.url, m.prefix) for m in cfg.mirrors] == [
        ("quay", "https://quay.io", ""), ("daocloud", "https://m.daocloud.io", "quay.io"), ("nju", "https://quay.nju.edu.cn", "")]


def test_lookup_order(tmp_path, monkeypatch):
    env_file = tmp_path / "env.toml"
    env_file.write_text('default_image = "quay.io/env/x"\n')
    home = tmp_path / "home"
    (home / ".config/imgtool").mkdir(parents=True)
    (home / ".config/imgtool/mirrors.toml").write_text('default_image = "quay.io/home/x"\n')
    opt = tmp_path / "opt.toml"
    opt.write_text('default_image = "quay.io/opt/x"\n')
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("IMGTOOL_MIRRORS", raising=False)
    assert load_mirrors(None).default_image == "quay.io/home/x"
    monkeypatch.setenv("IMGTOOL_MIRRORS", str(env_file))
    assert load_mirrors(None).default_image == "quay.io/env/x"
    assert load_mirrors(str(opt)).default_image == "quay.io/opt/x"


GOOD = '''default_image = "quay.io/ascend/vllm-ascend"

[[mirrors]]
name = "quay"
registry = "quay.io"
url = "https://quay.io"

[[mirrors]]
name = "local"
registry = "quay.io"
url = "http://127.0.0.1:5000"
insecure = true
'''


@pytest.mark.parametrize("body,message", [
    ("default_image = \"x\n", "invalid TOML: "),
    (GOOD + "\n[[mirrors]]\nname = \"quay\"\nregistry = \"quay.io\"\nurl = \"https://q\"\n",
     ":15: mirrors[2]: duplicate name 'quay' (also mirrors[0])"),
    (GOOD.replace('url = "https://quay.io"', 'url = "https://quay.io"\nprefx = "a"'),
     ":7: mirrors[0]: unknown key 'prefx' (expected name, registry, url, prefix, insecure, ca_cert, upstream)"),
    (GOOD.replace('registry = "quay.io"\nurl = "https://quay.io"', 'url = "https://quay.io"'),
     ":3: mirrors[0]: missing key 'registry'"),
    (GOOD.replace("insecure = true\n", ""),
     ":11: mirrors[1]: url 'http://127.0.0.1:5000' uses http://; set insecure = true for this entry to allow it"),
    (GOOD.replace('url = "https://quay.io"', 'url = "ftp://quay.io"'),
     ":6: mirrors[0]: invalid url 'ftp://quay.io': expected https://host[:port]"),
    ("default_image = 3\n", ":1: default_image must be a string like \"quay.io/ascend/vllm-ascend\""),
    ("colour = 1\n" + GOOD, ":1: unknown key 'colour' (expected default_image, mirrors, model_mirrors)"),
])
def test_malformed_file_is_one_line_exit_2(tmp_path, body, message):
    f = tmp_path / "mirrors.toml"
    f.write_text(body)
    r = run("mirrors", "--mirrors", str(f))
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith(f"error: {f}")
    assert message in lines[0]
    assert "Traceback" not in r.stderr


def test_missing_file(tmp_path):
    r = run("fetch", "v1", "--mirrors", str(tmp_path / "nope.toml"))
    assert r.returncode == 2
    assert r.stderr.strip() == f"error: {tmp_path / 'nope.toml'}: file not found"


def test_env_variable_file_is_used(tmp_path):
    f = tmp_path / "m.toml"
    f.write_text("default_image = 1\n")
    import os
    r = run("mirrors", env={**os.environ, "IMGTOOL_MIRRORS": str(f)})
    assert r.returncode == 2 and str(f) in r.stderr


DEEP = "default_image = \"quay.io/ascend/vllm-ascend\"\n# [[[[ in a comment, \"[[[[\" in a string: not nesting\nx = \"[[[[\"\ndeep = " \
    + "[" * 5000 + "]" * 5000 + "\n"


@pytest.mark.parametrize("verb,option", [("mirrors", "--mirrors"), ("presets", "IMGTOOL_PRESETS"), ("lock", "-f")])
def test_a_deeply_nested_toml_file_is_one_line_naming_its_line(tmp_path, verb, option):
    """mirrors.toml, presets.toml, a bundle spec: nesting that makes the TOML parser recurse past Python's limit
    is one line with file:line, exit 2 (it was `internal error: RecursionError`), before any network."""
    import os

    f = tmp_path / "deep.toml"
    f.write_text(DEEP)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("IMGTOOL_PRESETS", "IMGTOOL_MIRRORS"))}
    if option.startswith("IMGTOOL"):
        r = run(verb, env=dict(env, **{option: str(f)}))
    else:
        r = run(verb, option, str(f), env=env)
    assert (r.returncode, r.stderr) == (2, f"error: {f}:4: invalid TOML: arrays or inline tables nested more "
                                           "than 64 deep\n")


@pytest.mark.parametrize("name,value,said", [
    ("IMGTOOL_RESPONSE_TIMEOUT", "0", "invalid IMGTOOL_RESPONSE_TIMEOUT '0': give seconds between 0 and 3600, e.g. 120"),
    ("IMGTOOL_MIN_RATE", "fast", "invalid IMGTOOL_MIN_RATE 'fast': give bytes per second between 1 and 1G, e.g. 1024 or 10K"),
    ("IMGTOOL_MIN_RATE", "0", "invalid IMGTOOL_MIN_RATE '0': give bytes per second between 1 and 1G, e.g. 1024 or 10K"),
])
def test_a_bad_wait_variable_is_exit_2_before_any_network(tmp_path, name, value, said):
    import os

    for verb in (["mirrors", "v1"], ["tags"], ["push", str(tmp_path), "--to", "127.0.0.1:1"]):
        r = run(*verb, env=dict(os.environ, **{name: value}))
        assert (r.returncode, r.stderr) == (2, f"error: {said}\n"), verb
