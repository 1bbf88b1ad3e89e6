"""errors.py: an error restated by a caller that knows more is a new error of the same kind; the caught
one stays as it was (issue 28 item 8: exceptions were mutated after they were caught). The exit codes
every doc and the top-level help name are errors.py's."""

import re
from pathlib import Path

import pytest

from imgtool.bundle.signature import sign_written
from imgtool.errors import EXIT_MEANINGS, ImgtoolError, ProgramFailed, SignatureError, VerifyError


@pytest.mark.parametrize("error", [
    VerifyError("bad", "look", problems=("one", "two")),
    SignatureError("unsigned", "sign it", reason="unsigned", signer="ci"),
    ProgramFailed("ctr failed", "output", 7, "hint"),
])
def test_restated_keeps_the_kind_and_the_fields_and_leaves_the_caught_one(error):
    before = dict(vars(error))
    again = error.restated("said again", "do this")
    assert (type(again), again.exit_code, again.message, again.hint, str(again)) == (
        type(error), error.exit_code, "said again", "do this", "said again")
    assert {k: v for k, v in vars(again).items() if k not in ("message", "hint")} == {
        k: v for k, v in before.items() if k not in ("message", "hint")}
    assert vars(error) == before and str(error) == before["message"]
    assert error.restated(hint="other").message == before["message"]


def test_sign_written_says_the_bundle_is_unsigned_without_changing_what_it_caught(tmp_path):
    with pytest.raises(ImgtoolError) as e:
        sign_written(tmp_path / "nowhere", "key", "0" * 64)
    cause = e.value.__cause__
    assert isinstance(cause, ImgtoolError) and type(e.value) is type(cause)
    assert e.value.message == f"the bundle {tmp_path / 'nowhere'} is complete but not signed: {cause.message}"
    assert not cause.message.startswith("the bundle")
    assert e.value.hint.endswith(f"sign it: imgtool sign {tmp_path / 'nowhere'} --sign-key key")


ROOT = Path(__file__).resolve().parents[1]


def _table(path, heading, columns):
    """The rows of the first table under `heading` in a doc: cells of each row with `columns` cells."""
    section = (ROOT / path).read_text(encoding="utf-8").split(heading + "\n", 1)[1].split("\n## ", 1)[0]
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in section.splitlines()
            if line.startswith("|")]
    return [r for r in rows if len(r) == columns and r[0] not in ("code", "refusal") and not set(r[0]) <= {"-"}]


def test_every_exit_code_table_says_what_errors_py_says():
    # a table that explains a code starts with its general meaning's head ("bad usage or input", "the container runtime")
    meanings = {code: re.split(r" \(|:", meaning, maxsplit=1)[0] for code, meaning in EXIT_MEANINGS}
    # docs/cli.md (the README links to it): the whole table, word for word
    assert [(int(code), meaning) for code, meaning in _table("docs/cli.md", "## Exit codes", 2)] == list(EXIT_MEANINGS)
    # the run presets' codes and the offline refusals' codes: each one of errors.py's, explained from its
    # general meaning on
    run = _table("docs/presets.md", "## Exit codes", 2)
    assert [int(code) for code, _ in run] == [0, 1, 2, 5]
    for code, meaning in run:
        assert meaning.startswith(meanings[int(code)]), (code, meaning)
    refusals = _table("docs/reliability.md", "## Exit codes: imgtool and load.sh agree (issue 24 item 12)", 4)
    assert len(refusals) == 9
    for refusal, by_imgtool, by_load_sh, why in refusals:
        assert by_imgtool == by_load_sh, refusal
        assert why.startswith(meanings[int(by_imgtool)]), (refusal, why)


def test_the_top_level_help_lists_the_exit_codes():
    from click.testing import CliRunner

    from imgtool.cli import cli

    out = CliRunner().invoke(cli, ["--help"]).output
    listed = out.split("Exit codes:\n", 1)[1].splitlines()
    assert [line.split(None, 1) for line in listed if line.strip()] == [[str(c), m] for c, m in EXIT_MEANINGS]


@pytest.mark.parametrize("lock,said", [
    ("copy 4242\n", ("error: incomplete bundle: {d} has no bundle.json (an imgtool copy was writing it and has not "
                     "finished)", "hint: let that imgtool copy finish, or run it again if it was stopped")),
    ("export 4242\n", ("error: incomplete bundle: {d} has no bundle.json (an imgtool export was writing it and has "
                       "not finished)", "hint: let that imgtool export finish, or run it again if it was stopped")),
    (None, ("error: incomplete bundle: {d} has no bundle.json (what made it did not finish, or bundle.json was not "
            "copied)", "hint: copy bundle.json from the source medium, or make the bundle again as it was made "
                       "(imgtool fetch, export or copy)")),
    ("serve 4242\n", ("error: incomplete bundle: {d} has no bundle.json (what made it did not finish, or bundle.json "
                      "was not copied)", "hint: copy bundle.json from the source medium, or make the bundle again as "
                                         "it was made (imgtool fetch, export or copy)")),
])
def test_an_unfinished_bundle_names_what_was_writing_it(lock, said, tmp_path):
    """Issue 46 item 7: a bundle re-cut by `imgtool copy` (or made by `export`) and stopped before its bundle.json
    was told to "run the fetch again". The writer's lock file (dirlock.py: `VERB PID`, left by a killed run) says
    which verb was writing it; without one, the hint names every verb that makes a bundle."""
    from tests.support.bundles import imgtool

    d = tmp_path / "bundle"
    d.mkdir()
    (d / "vllm.tar.part001").write_bytes(b"\0" * 512)
    if lock is not None:
        (d / ".imgtool-lock").write_text(lock)
    r = imgtool("verify", str(d), env={"HOME": "/nonexistent", "IMGTOOL_SIGNERS": ""})
    assert (r.returncode, r.stderr.splitlines()) == (3, [said[0].format(d=d), said[1]])


def test_a_count_agrees_with_its_noun(factory, tmp_path):
    """Issue 46 item 7: serve said "without the 1 entries". errors.counted is the one agreement of a count and its
    noun; serve's startup note about upstream's index is one of its users."""
    from imgtool.bundle.catalog import Catalog
    from imgtool.bundle.reader import read_index
    from imgtool.errors import counted
    from imgtool.serve import index_notes
    from tests.support.bundles import BlobDir, write

    assert [counted(n, "entry", "entries") for n in (0, 1, 2)] == ["0 entries", "1 entry", "2 entries"]
    assert counted(1, "blob") == "1 blob" and counted(3, "blob") == "3 blobs"
    store = BlobDir(tmp_path / "blobs")
    idx = factory.multiarch(("amd64", "arm64"), layers=1, media="docker")
    out = tmp_path / "b"
    write(out, [store.pulled(idx.images[0], "quay.io/ascend/vllm-ascend:v3", index=idx)], store)
    repo = Catalog([read_index(out)[0]]).repository("ascend/vllm-ascend")
    notes = index_notes(repo)
    assert len(notes) == 1 and notes[0].endswith(
        f"upstream's index {idx.manifest_digest} by digest, without the 1 entry the bundles lack (linux/arm64/v8)"), notes
