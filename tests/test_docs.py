"""The README and docs/ as a newcomer reads them (issue 37): a README of at most 300 lines whose first
screen shows fetch, carry and load; every relative link leads to a file and, with #anchor, to a heading;
the Chinese part names every verb and option the English part names, under the same headings; the
README's test command is what CI runs; docs/cli.md says what the code's --help says."""

import re
import sys
import unicodedata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README] + sorted((ROOT / "docs").glob("*.md"))
FENCE = re.compile(r"^(```|~~~)")


def _prose(text):
    """The lines of a markdown text outside fenced code blocks."""
    inside = False
    for line in text.splitlines():
        if FENCE.match(line):
            inside = not inside
        elif not inside:
            yield line


def _slug(heading):
    """GitHub's anchor for a heading: lower case, punctuation dropped (letters, marks, digits, `_`,
    spaces and `-` kept), spaces made `-`."""
    kept = "".join(c for c in heading.strip().lower()
                   if c in " -_" or unicodedata.category(c)[0] in "LMN")
    return kept.replace(" ", "-")


def _anchors(path):
    anchors, seen = set(), {}
    for line in _prose(path.read_text(encoding="utf-8")):
        m = re.match(r"#{1,6} (.+)", line)
        if m:
            slug = _slug(m.group(1))
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            anchors.add(slug if n == 0 else f"{slug}-{n}")
        anchors.update(re.findall(r'<a (?:id|name)="([^"]+)"', line))
    return anchors


def test_the_readme_is_short_and_its_first_screen_shows_fetch_carry_and_load():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 300, f"README.md has {len(lines)} lines"
    first = "\n".join(lines[:45])
    for step in ("**Fetch**", "imgtool fetch v0.22.1rc1", "**Carry**", "**Load**", "imgtool load ", "self-install",
                 "python3 imgtool.pyz load .", "sh load.sh"):
        assert step in first, step


def test_every_relative_link_leads_to_a_file_and_a_heading():
    broken = []
    for page in PAGES:
        for line in _prose(page.read_text(encoding="utf-8")):
            for target in re.findall(r"\]\(([^)\s]+)\)", line):
                if re.match(r"[a-z]+:", target):
                    continue  # https:, mailto:
                file, _, anchor = target.partition("#")
                dest = (page.parent / file).resolve() if file else page
                if not dest.exists():
                    broken.append(f"{page.relative_to(ROOT)}: {target}: no such file")
                elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                    broken.append(f"{page.relative_to(ROOT)}: {target}: no such heading")
    assert broken == []


def test_the_slugs_are_githubs():
    assert _slug("Exit codes: imgtool and load.sh agree (issue 24 item 12)") == \
        "exit-codes-imgtool-and-loadsh-agree-issue-24-item-12"
    assert _slug("Kubernetes (`--format k8s`)") == "kubernetes---format-k8s"
    assert _slug("获取、携带、导入") == "获取携带导入"


def _halves():
    text = README.read_text(encoding="utf-8")
    english, chinese = text.split("\n# 中文\n", 1)
    return english, chinese


def _verbs_and_options(text):
    from imgtool.cli import cli

    verbs = set(cli.commands)
    named = {v for v in re.findall(r"\bimgtool(?:\.pyz)? ([a-z][a-z-]*)", text) if v in verbs}
    named |= {v for v in re.findall(r"`([a-z][a-z-]*)`", text) if v in verbs}
    options = set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", text))
    return named, options


def test_the_chinese_part_names_what_the_english_part_names():
    english, chinese = _halves()
    en_verbs, en_options = _verbs_and_options(english)
    zh_verbs, zh_options = _verbs_and_options(chinese)
    assert {"fetch", "load", "verify", "serve", "push", "sign", "lock", "run-flags"} <= en_verbs
    assert (sorted(en_verbs - zh_verbs), sorted(zh_verbs - en_verbs)) == ([], [])
    assert (sorted(en_options - zh_options), sorted(zh_options - en_options)) == ([], [])


def test_the_chinese_headings_mirror_the_english_ones():
    english, chinese = _halves()

    def levels(text):
        return [len(m.group(1)) for m in (re.match(r"(#+) ", line) for line in _prose(text)) if m]

    assert levels(english)[0] == levels("# 中文\n" + chinese)[0] == 1
    assert levels(english) == levels("# 中文\n" + chinese)
    # each part shows the same commands in its code blocks, the comments aside
    blocks = [re.findall(r"```sh\n(.*?)```", part, re.S) for part in (english, chinese)]
    commands = [[re.sub(r"\s+#.*", "", line).replace("目录", "DIR").strip() for b in bs for line in b.splitlines()]
                for bs in blocks]
    assert commands[0] == commands[1]


def test_the_readme_test_command_is_what_ci_runs():
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines()
          if line.strip() and not line.startswith(("#", "set ", "cd "))]
    english, chinese = _halves()
    for part, heading in ((english, "## Tests\n"), (chinese, "## 测试\n")):
        section = part.split(heading, 1)[1]
        assert re.search(r"```sh\n(.*?)\n```", section, re.S).group(1).splitlines() == ci


def test_the_cli_page_says_what_the_code_says():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import clidoc
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    assert (ROOT / "docs" / "cli.md").read_text(encoding="utf-8") == clidoc.page(), \
        "docs/cli.md is stale: run python3 scripts/clidoc.py"
    from imgtool.cli import cli

    text = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    for name, command in cli.commands.items():
        if not command.hidden:
            assert f"## imgtool {name}\n" in text
            for param in command.params:
                for opt in getattr(param, "opts", []):
                    if opt.startswith("--") and not getattr(param, "hidden", False):
                        assert opt in text, (name, opt)

