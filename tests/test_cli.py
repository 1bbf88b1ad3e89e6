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


def _no_floor_override():
    return {"IMGTOOL_TEST_MIN_CHUNK_SIZE": ""}  # the floor a user gets


@pytest.mark.parametrize("verb", [["fetch", "v1"], ["export", "x:1"]])
def test_chunk_size_below_1_mib_is_refused_with_the_reason(verb):
    r = imgtool(*verb, "--chunk-size", "100", env=_no_floor_override())
    assert r.returncode == 2
    assert r.stderr.splitlines() == [
        "error: invalid --chunk-size '100': parts must be at least 1 MiB "
        "(100 B parts would cut a 15 GiB image into 161,061,274 files)",
        "hint: use the largest file your medium takes, e.g. 4095M (FAT32), 4G, 700M",
    ]


def test_chunk_size_below_1_mib_in_a_spec_names_file_and_line(tmp_path):
    spec = tmp_path / "bundle.toml"
    spec.write_text('images = ["v1"]\narch = ["arm64"]\nchunk_size = "512K"\n')
    r = imgtool("fetch", "-f", str(spec), env=_no_floor_override())
    assert r.returncode == 2
    assert r.stderr.splitlines()[0] == (
        f"error: {spec}:3: invalid chunk_size '512K': parts must be at least 1 MiB "
        "(512 KiB parts would cut a 15 GiB image into 30,720 files)")
