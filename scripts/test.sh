#!/usr/bin/env bash
# The test command of the project: venv, ruff and mypy, then the suite in two tiers.
#
#   scripts/test.sh                 # both tiers: the fast tier (no service: no daemon, registry or
#                                   # runtime) first, stopping at its first failure, before any service
#                                   # starts; then the services up, the tests that need them, services down
#   scripts/test.sh --fast [ARGS]   # the fast tier alone (starts nothing); ARGS go to pytest
#   scripts/test.sh ARGS...         # services up, then pytest ARGS as given (e.g. -q tests/test_load.py -x)
#
# The services tier runs on $IMGTOOL_TEST_WORKERS pytest-xdist workers (default 3: its tests wait on daemons,
# so a third worker on 2 cores took it from 561 s to 517 s), each with a set of services of its own (below);
# the fast tier, all CPU, on $IMGTOOL_TEST_WORKERS too (default 2: a third gained nothing).
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
    # The real model-hub clients ([tool.imgtool] hub-clients) in a venv of their own inside $VENV: their click
    # and imgtool's cannot share one (pyproject.toml says why); tests/support/hubclients.py runs them there.
    # Installed beside the checks below (compileall, ruff, mypy: CPU; this: mostly pip waiting on the index), ~10 s
    # of a fresh clone; waited for, and the stamp written, before any test runs.
    if [ -f pyproject.toml ]; then
        rm -rf "$VENV/hub-clients"
        mapfile -t hub_clients < <("$VENV/bin/python" -c \
            'import sys, tomli; print("\n".join(tomli.load(open(sys.argv[1], "rb"))["tool"]["imgtool"]["hub-clients"]))' pyproject.toml)
        ( "$PYTHON" -m venv "$VENV/hub-clients" && "$VENV/hub-clients/bin/python" -m pip install -q "${hub_clients[@]}" ) \
            >"$VENV/hub-clients.log" 2>&1 &
        hub_clients_pid=$!
    else
        echo "$want" >"$stamp"
    fi
fi

# Every module compiled once: the tests run imgtool as a command hundreds of times, and where
# PYTHONDONTWRITEBYTECODE is set (this machine's shells set it) each run compiled every module it imports from
# source again (0.2-0.3 CPU s a run); compileall writes the .pyc files even so, and every run then reads them.
"$VENV/bin/python" -m compileall -q imgtool tests scripts >/dev/null
# And pytest may keep the test modules it rewrote for its asserts (tests/__pycache__/*-pytest-*.pyc): where
# PYTHONDONTWRITEBYTECODE is set, each worker of each tier rewrote all ~85 of them again (~5 CPU s a worker).
unset PYTHONDONTWRITEBYTECODE

# The house's habits, checked before anything starts (rules in pyproject.toml [tool.ruff], [tool.mypy]).
"$VENV/bin/python" -m ruff check imgtool tests scripts
"$VENV/bin/python" -m mypy

if [ -n "${hub_clients_pid:-}" ]; then
    if ! wait "$hub_clients_pid"; then
        cat "$VENV/hub-clients.log" >&2
        echo "test.sh: installing the model-hub clients into $VENV/hub-clients failed (above)" >&2
        exit 1
    fi
    cat "$VENV/hub-clients.log" >&2  # pip's warnings, as before
    echo "$want" >"$stamp"
fi

mode=args
if [ "${1:-}" = "--fast" ]; then
    mode=fast
    shift
elif [ "$#" -eq 0 ]; then
    mode=all
fi

# The tools the tests run (skopeo, ssh-keygen, busybox, pigz, ...): installed if missing, nothing started.
scripts/services.sh packages

if [ "$mode" != args ]; then
    # The fast tier cannot reach a service even where an earlier `eval "$(scripts/services.sh env)"` left
    # its variables: every IMGTOOL_TEST_* but the data seed is unset for it.
    unset_services=()
    for v in $(compgen -e); do
        case "$v" in IMGTOOL_TEST_SEED) ;; IMGTOOL_TEST_*) unset_services+=(-u "$v") ;; esac
    done
    echo "test.sh: the fast tier (tests that need no service) on ${IMGTOOL_TEST_WORKERS:-2} workers" >&2
    env "${unset_services[@]}" "$VENV/bin/python" -m pytest -q -x -m "not services" -n "${IMGTOOL_TEST_WORKERS:-2}" tests "$@"
    [ "$mode" = fast ] && exit 0
fi

# One set of services per worker, each its own dockerds, containerds, Podman storage, registries and
# token issuer (state dirs $IMGTOOL_SERVICES_DIR, then -1, -2, ...; port ranges from IMGTOOL_SERVICES_SLOT on,
# so two checkouts tested at once on one machine give each a different IMGTOOL_SERVICES_DIR and SLOT):
# no two workers ever share a runtime, so a test that compares a runtime's images before and after sees
# only its own. ARGS runs get one set unless IMGTOOL_TEST_WORKERS is given (then pass -n yourself).
if [ "$mode" = all ]; then
    workers="${IMGTOOL_TEST_WORKERS:-3}"
else
    workers="${IMGTOOL_TEST_WORKERS:-1}"
fi
case "$workers" in [1-8]) ;; *) echo "test.sh: IMGTOOL_TEST_WORKERS must be 1-8 (got $workers)" >&2; exit 2;; esac
base_dir="${IMGTOOL_SERVICES_DIR:-/tmp/imgtool-svc}"
set_dirs=()
for ((i = 0; i < workers; i++)); do
    if [ "$i" -eq 0 ]; then set_dirs+=("$base_dir"); else set_dirs+=("$base_dir-$i"); fi
done

# shellcheck disable=SC2317  # called by the EXIT trap
services_down() {
    local dir
    for dir in "${set_dirs[@]}"; do
        IMGTOOL_SERVICES_DIR="$dir" scripts/services.sh down \
            || echo "test.sh: warning: scripts/services.sh down failed for $dir" >&2
    done
}
trap services_down EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

env_files=()
for ((i = 0; i < workers; i++)); do
    IMGTOOL_SERVICES_DIR="${set_dirs[$i]}" IMGTOOL_SERVICES_SLOT="$((${IMGTOOL_SERVICES_SLOT:-0} + i))" scripts/services.sh up
    env_files+=("${set_dirs[$i]}/env.sh")
done
# the first set for this process (and a run without workers); worker gwN reads set N (tests/conftest.py)
eval "$(IMGTOOL_SERVICES_DIR="${set_dirs[0]}" scripts/services.sh env)"
export IMGTOOL_TEST_SERVICE_SETS="${env_files[*]}"

if [ "$mode" = all ]; then
    echo "test.sh: the services tier on $workers workers, one set of services each" >&2
    set -- -q -m services -n "$workers" tests
fi
rc=0
"$VENV/bin/python" -m pytest "$@" || rc=$?
exit "$rc"
