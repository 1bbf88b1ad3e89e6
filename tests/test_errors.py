"""errors.py: an error restated by a caller that knows more is a new error of the same kind; the caught
one stays as it was (issue 28 item 8: exceptions were mutated after they were caught)."""

import pytest

from imgtool.bundle.signature import sign_written
from imgtool.errors import ImgtoolError, ProgramFailed, SignatureError, VerifyError


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
    assert e.value.hint.endswith(f"sign it: imgtool sign {tmp_path / 'nowhere'} --key key")
