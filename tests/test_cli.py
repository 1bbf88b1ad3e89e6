"""What every verb shares, through the real CLI: usage errors, Docker unreachable, sizes.

Each case asserts the exact lines a user sees on stderr and the exit code.
"""

import pytest

from tests.support.bundles import imgtool

# click's own errors, each as one `error:` line and one `hint:` line, exit 2
USAGE = [
    (["fetchh", "v1"], ["error: unknown command 'fetchh'",
                        "hint: did you mean fetch? imgtool -h lists the commands"]),
    (["lod", "dir"], ["error: unknown command 'lod'",
                      "hint: did you mean load? imgtool -h lists the commands"]),
    (["zzzz"], ["error: unknown command 'zzzz'", "hint: imgtool -h lists the commands"]),
    (["fetch", "v1", "--compress", "bz2"],
     ["error: invalid value for '--compress': 'bz2' is not one of 'none', 'gzip', 'zstd'",
      "hint: usage: imgtool fetch [OPTIONS] [REFS]...; imgtool fetch -h explains every option"]),
    (["verify"], ["error: missing argument 'DIR'",
                  "hint: usage: imgtool verify [OPTIONS] DIR; imgtool verify -h explains every option"]),
    (["run-flags"], ["error: missing argument 'PRESET'",
                     "hint: usage: imgtool run-flags [OPTIONS] PRESET [-- CMD...]; "
                     "imgtool run-flags -h explains every option"]),
    (["fetch", "v1", "--bogus"], ["error: no such option: --bogus",
                                  "hint: did you mean --base or --jobs? imgtool fetch -h lists the options"]),
    (["tags", "--filter"], ["error: option '--filter' requires an argument",
                            "hint: imgtool tags -h explains every option"]),
    (["load", "a", "b"], ["error: got unexpected extra argument (b)",
                          "hint: usage: imgtool load [OPTIONS] DIR; imgtool load -h explains every option"]),
    (["verify", "d", "--jobs", "0"],
     ["error: invalid value for '--jobs': 0 is not in the range 1<=x<=64",
      "hint: usage: imgtool verify [OPTIONS] DIR; imgtool verify -h explains every option"]),
]


@pytest.mark.parametrize("args,lines", USAGE, ids=[" ".join(a) for a, _ in USAGE])
def test_usage_errors_are_an_error_and_a_hint_line(args, lines):
    r = imgtool(*args)
    assert (r.returncode, r.stderr.splitlines(), r.stdout) == (2, lines, "")
