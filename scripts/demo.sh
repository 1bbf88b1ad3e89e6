#!/usr/bin/env bash
# The whole imgtool flow without internet, so anyone can watch it:
#   a local registry stands in for quay.io, a small multi-arch vllm-ascend-like image is pushed
#   to it, then: imgtool fetch -> verify -> load (into a private dockerd) -> run-flags.
# Everything it starts (dockerd, registries) is stopped at the end; the bundle stays in $DEMO_DIR.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"

DEMO_DIR="${DEMO_DIR:-/tmp/imgtool-demo}"
export IMGTOOL_SERVICES_DIR="${IMGTOOL_SERVICES_DIR:-/tmp/imgtool-demo-svc}"
# the demo loads into Docker: the containerd and Podman runtimes of the tests are not started
export IMGTOOL_SERVICES_RUNTIMES="${IMGTOOL_SERVICES_RUNTIMES-}"
VENV="${IMGTOOL_VENV:-.venv}"
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
VENV="$(cd "$VENV" && pwd)"
# the test extras (the demo builds its image with the test suite's factory), unless this checkout's
# imgtool and pytest are there already
"$VENV/bin/python" -I - "$ROOT" <<'PY' 2>/dev/null || "$VENV/bin/python" -m pip install -q -e '.[test]'
import os, sys, imgtool.cli, pytest  # noqa: F401
sys.exit(os.path.dirname(os.path.dirname(os.path.abspath(imgtool.__file__))) != os.path.abspath(sys.argv[1]))
PY
PATH="$VENV/bin:$PATH"

trap '"$ROOT/scripts/services.sh" down >/dev/null 2>&1 || true' EXIT
scripts/services.sh up
eval "$(scripts/services.sh env)"
export DOCKER_HOST="$IMGTOOL_TEST_DOCKER_HOST" IMGTOOL_CACHE="$DEMO_DIR/cache"
rm -rf "$DEMO_DIR" && mkdir -p "$DEMO_DIR"

# bold commands on a terminal only, and never with NO_COLOR set (https://no-color.org)
if [ -t 1 ] && [ -z "${NO_COLOR:-}" ]; then bold=$'\033[1m' normal=$'\033[0m'; else bold='' normal=''; fi
step() { printf '\n%s$ %s%s\n' "$bold" "$*" "$normal"; "$@"; }

echo "== pushing a small linux/amd64 + linux/arm64 image as quay.io/ascend/vllm-ascend:v0.22.1rc1 (local stand-in)"
python - <<PY
from tests.support.images import ImageFactory
from tests.support.registry import push_image
idx = ImageFactory("demo").multiarch(layers=3, layer_size=2 << 20, runnable=False)
print(push_image("$IMGTOOL_TEST_REGISTRY_PLAIN", "ascend/vllm-ascend", "v0.22.1rc1", idx))
PY
cat >"$DEMO_DIR/mirrors.toml" <<TOML
default_image = "quay.io/ascend/vllm-ascend"
[[mirrors]]
name = "quay"          # the real quay.io is not reachable here: this entry is down on purpose
registry = "quay.io"
url = "http://127.0.0.1:1"
insecure = true
upstream = true
[[mirrors]]
name = "local"
registry = "quay.io"
url = "http://$IMGTOOL_TEST_REGISTRY_PLAIN"
insecure = true
TOML
export IMGTOOL_MIRRORS="$DEMO_DIR/mirrors.toml"
arch=$(python -c 'from imgtool.model import Platform; print(Platform.host().architecture)')

cd "$DEMO_DIR"
step imgtool mirrors v0.22.1rc1
step imgtool inspect v0.22.1rc1
step imgtool fetch v0.22.1rc1 --arch "$arch" --chunk-size 2M
bundle="vllm-ascend-v0.22.1rc1-$arch"
step ls -l "$bundle"
step imgtool verify "$bundle"
step imgtool load "$bundle"
step imgtool load "$bundle"
step imgtool run-flags a2 --image quay.io/ascend/vllm-ascend:v0.22.1rc1
echo
echo "demo done: the bundle is in $DEMO_DIR/$bundle (services stopped)"
