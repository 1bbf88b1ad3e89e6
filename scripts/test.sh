#!/usr/bin/env bash
# The test command of the project: venv, ruff, real services up, pytest, services down (always).
#
#   scripts/test.sh                 # = python -m pytest -q tests
#   scripts/test.sh -k registry -x  # any pytest arguments
#
# Exits with pytest's code; "no tests ran" (5) counts as a failure like any other nonzero code.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV="${IMGTOOL_VENV:-.venv}"
PYTHON="${PYTHON:-python3}"

if ! "$VENV/bin/python" -c 'import sys' >/dev/null 2>&1; then
    echo "test.sh: creating $VENV with $("$PYTHON" --version 2>&1)" >&2
    rm -rf "$VENV"
    "$PYTHON" -m venv "$VENV"
fi
# Reinstall only when the dependency declaration changed (saves seconds per run);
# IMGTOOL_REINSTALL=1 forces it.
stamp="$VENV/.imgtool-deps"
want="$( { cat pyproject.toml 2>/dev/null || true; } | sha256sum | cut -d" " -f1)"
if [ "${IMGTOOL_REINSTALL:-0}" = 1 ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    rm -f "$stamp"
    if [ -f pyproject.toml ]; then
        "$VENV/bin/python" -m pip install -q -e '.[test]'
    else
        "$VENV/bin/python" -m pip install -q pytest cryptography requests hypothesis
    fi
    echo "$want" >"$stamp"
fi

# The house's habits, checked before anything starts (rules in pyproject.toml [tool.ruff], [tool.mypy]).
"$VENV/bin/python" -m ruff check imgtool tests scripts
"$VENV/bin/python" -m mypy

# shellcheck disable=SC2317  # called by the EXIT trap
services_down() {
    scripts/services.sh down || echo "test.sh: warning: scripts/services.sh down failed" >&2
}
trap services_down EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

scripts/services.sh up
eval "$(scripts/services.sh env)"

[ "$#" -gt 0 ] || set -- -q tests
rc=0
"$VENV/bin/python" -m pytest "$@" || rc=$?
exit "$rc"
