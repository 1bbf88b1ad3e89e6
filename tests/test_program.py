"""program.py: how a runtime's tool that failed is described (issue 36 item 7: killed, not its last progress line)."""

import pytest

from imgtool.program import _ended


@pytest.mark.parametrize("code, last, said", [
    (-9, "Copying blob 0123 done", "killed by SIGKILL"),
    (-15, "", "killed by SIGTERM"),
    (137, "Copying blob 0123 done", "killed by SIGKILL (exit status 137)"),  # a shell in between
    (125, "Error: payload does not match", "Error: payload does not match"),
    (1, "", "exit status 1"),
    (128 + 40, "", "killed by signal 40 (exit status 168)"),  # a real-time signal has no name of its own
    (200, "x", "x"),  # past 128 + 64 no signal could have made it
    (255, "ctr: failed", "ctr: failed"),
])
def test_a_tool_that_failed_is_said_as_killed_or_by_its_last_line(code, last, said):
    assert _ended(code, last) == said
