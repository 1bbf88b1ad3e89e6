#!/usr/bin/env bash
# Real services for the imgtool test suite: private dockerds (one per Docker engine of the matrix)
# and four distribution registries on loopback, all under one state dir, all started and stopped
# by this script only.
#
#   scripts/services.sh packages  install the Debian packages the suite uses, if missing; start nothing
#   scripts/services.sh up      start everything (installs the Debian packages first if missing)
#   scripts/services.sh env     print `export IMGTOOL_TEST_...=...` lines (eval-able)
#   scripts/services.sh status  say whether the services are up
#   scripts/services.sh down    stop what `up` started and remove the state dir
#
# State dir: $IMGTOOL_SERVICES_DIR or /tmp/imgtool-svc (kept short: unix socket paths are limited
# to 108 bytes and dockerd/containerd put sockets a few levels below it).
#
# Engines ($IMGTOOL_SERVICES_ENGINES, default all five; the first is IMGTOOL_TEST_DOCKER_HOST; `env`
# prints them as IMGTOOL_TEST_ENGINES="NAME=unix://... ..."):
#   20.10             Debian 12's docker.io (apt), overlay2 graphdriver: Kylin-era Docker
#   26.1              Debian 13's docker.io + containerd, unpacked with dpkg -x into a cache dir
#                     ($IMGTOOL_DEBS_CACHE, default ~/.cache/imgtool-test/trixie), never installed
#   26.1-containerd   the same dockerd with the containerd image store (containerd-snapshotter),
#                     what a fresh Docker 29 uses
#   28.5              Debian unstable's docker.io 28.5 with its containerd 2.1 on PATH (and this
#                     machine's runc: unstable's needs glibc 2.38), unpacked the same way into
#                     $IMGTOOL_SID_CACHE (default: sid beside the trixie cache)
#   28.5-containerd   the same dockerd with the containerd image store: what mounts an image
#                     (`--mount type=image`, Docker 28+); not in the tests' engine matrix
# Runtimes beside Docker ($IMGTOOL_SERVICES_RUNTIMES, default all five; `env` prints
# IMGTOOL_TEST_CONTAINERDS="1.6=/.../containerd.sock 1.7=..." and IMGTOOL_TEST_PODMAN=DIR):
#   containerd-1.6    Debian 12's containerd (comes with docker.io), as a Kubernetes node runs it:
#                     its own config, root, state and socket, the CRI plugin on (no CNI: no pods)
#   containerd-1.7    Debian 13's containerd, unpacked with the 26.1 .debs, the same way
#   containerd-2.1    Debian unstable's containerd 2.1, unpacked with the 28.5 .debs; config version 3,
#                     this machine's runc; DIR/bin holds its own ctr, first on PATH where tests use it
#                     (ctr 2.x imports through the transfer service)
#   podman-4.3        Debian 12's podman (apt); no daemon: DIR holds storage.conf and containers.conf
#                     (private graphroot/runroot, cgroupfs, no network) and bin/podman, a wrapper
#                     that runs podman in a private mount namespace with DIR/varlib over
#                     /var/lib/containers, so its blob-info cache is not the machine's. Tests put
#                     DIR/bin first in PATH and set CONTAINERS_STORAGE_CONF / CONTAINERS_CONF.
#   podman-5.8        Debian unstable's podman 5.8 (needs glibc 2.38: it cannot run unpacked here), run
#                     from a Debian unstable root made with debootstrap into $IMGTOOL_SID_CACHE/podman-root;
#                     DIR/bin/podman chroots into it in a private mount namespace (setup_podman); the first
#                     `up` makes that root (about 3 minutes). `env` prints IMGTOOL_TEST_PODMANS="4.3=DIR 5.8=DIR"
# Each dockerd is private and leaves the host alone: its own socket, data root, exec root, config
# file and containerd (dockerd starts a containerd under --exec-root when not given --containerd);
# no docker0 bridge, no iptables rules, no ip_forward change. Containers therefore have no bridge
# network: tests run them with --network "$IMGTOOL_TEST_DOCKER_NETWORK" (none).
set -euo pipefail

S="${IMGTOOL_SERVICES_DIR:-/tmp/imgtool-svc}"
SLOT="${IMGTOOL_SERVICES_SLOT:-0}"  # which set of services this is (scripts/test.sh starts one per worker)
TOKEN_SERVICE="imgtool-test-registry"
TOKEN_ISSUER="imgtool-test-issuer"
TLS_USER="imgtool"
DOCKER_NETWORK="none"
REGISTRIES="plain mirror tls token"
# (an input of its own: IMGTOOL_TEST_ENGINES is this script's output, often still in the shell)
ENGINES="${IMGTOOL_SERVICES_ENGINES:-20.10 26.1 26.1-containerd 28.5 28.5-containerd}"
RUNTIMES="${IMGTOOL_SERVICES_RUNTIMES-containerd-1.6 containerd-1.7 containerd-2.1 podman-4.3 podman-5.8}"
DEBS_CACHE="${IMGTOOL_DEBS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/imgtool-test/trixie}"
SID_CACHE="${IMGTOOL_SID_CACHE:-$(dirname "$DEBS_CACHE")/sid}"

say() { printf 'services: %s\n' "$*" >&2; }
die() { printf 'services: error: %s\n' "$*" >&2; exit 1; }

# dockerd needs root. Re-run through sudo when we are not root, and hand the state back to the
# invoking user afterwards (socket group, readable keys) so the test process can use it.
if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || die "must run as root (dockerd needs it) and sudo is not installed"
    exec sudo --preserve-env=IMGTOOL_SERVICES_DIR,IMGTOOL_SERVICES_SLOT,IMGTOOL_SERVICES_ENGINES,IMGTOOL_SERVICES_RUNTIMES,IMGTOOL_DEBS_CACHE,IMGTOOL_SID_CACHE \
        IMGTOOL_SERVICES_OWNER="$(id -u):$(id -g)" bash "$0" "$@"
fi
OWNER="${IMGTOOL_SERVICES_OWNER:-}"

case "$S" in /*) ;; *) die "IMGTOOL_SERVICES_DIR must be an absolute path (got $S)";; esac
case "$SLOT" in [0-7]) ;; *) die "IMGTOOL_SERVICES_SLOT must be 0-7 (got $SLOT)";; esac
S="${S%/}"
[ "${#S}" -le 60 ] || die "state dir path too long for unix sockets (${#S} > 60 chars): $S"

# ---------------------------------------------------------------------------------------------
# packages

ensure_packages() {
    local missing=() pkg cmd
    while read -r pkg cmd; do
        if [ "$cmd" = "-" ]; then
            dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
        else
            command -v "$cmd" >/dev/null 2>&1 || missing+=("$pkg")
        fi
    done <<'EOF'
docker.io dockerd
docker.io docker
docker-registry docker-registry
skopeo skopeo
pigz pigz
openssl openssl
apache2-utils htpasswd
curl curl
ca-certificates -
busybox-static -
openssh-client ssh-keygen
containerd ctr
podman podman
util-linux unshare
shellcheck shellcheck
EOF
    [ "${#missing[@]}" -eq 0 ] && return 0
    mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)
    say "installing missing packages: ${missing[*]}"
    command -v apt-get >/dev/null || die "missing ${missing[*]} and apt-get is not available"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >&2
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
}

# ---------------------------------------------------------------------------------------------
# process helpers: every PID we touch must be ours, i.e. carry the state dir in its command line

pid_is_ours() {
    local pid="$1"
    [ -n "$pid" ] && [ -r "/proc/$pid/cmdline" ] || return 1
    { tr '\0' ' ' <"/proc/$pid/cmdline"; } 2>/dev/null | grep -qF -- "$S/"
}

# stop_pid NAME PID GRACE_SECONDS: SIGTERM, wait, then SIGKILL
stop_pid() {
    local name="$1" pid="$2" grace="$3" i
    pid_is_ours "$pid" || return 0
    kill -TERM "$pid" 2>/dev/null || return 0
    for ((i = 0; i < grace * 10; i++)); do
        pid_is_ours "$pid" || return 0
        sleep 0.1
    done
    say "$name (pid $pid) did not stop in ${grace}s; killing it"
    kill -KILL "$pid" 2>/dev/null || true
    for ((i = 0; i < 50; i++)); do
        pid_is_ours "$pid" || return 0
        sleep 0.1
    done
    say "warning: $name (pid $pid) is still alive after SIGKILL"
}

# containerd-shims are started by our containerd and re-parented to init, so `up` cannot know
# their PIDs; they name our containerd socket on their command line, which identifies them.
our_shims() {
    local p
    for p in /proc/[0-9]*; do
        [ -r "$p/cmdline" ] || continue
        local cmd
        cmd="$({ tr '\0' ' ' <"$p/cmdline"; } 2>/dev/null || true)"
        if [[ "$cmd" == *containerd-shim* && "$cmd" == *"$S/"*"containerd.sock"* ]]; then
            echo "${p#/proc/}"
        fi
    done
}

free_ports() { # N free loopback TCP ports, all bound at once so they differ
    # Chosen below the kernel's ephemeral range: the token issuer's port stays unbound until
    # pytest starts it, and any port-0 bind by a test in between (serve, fault proxies) draws
    # from the ephemeral range, so it can never take a port reserved here. Each set of services
    # (IMGTOOL_SERVICES_SLOT, one per pytest-xdist worker) draws from a range of its own, so one
    # set's issuer port, unbound until its worker starts, is never another set's.
    python3 - "$1" "$SLOT" <<'EOF'
import random, socket, sys
try:
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        low = int(f.read().split()[0])
except (OSError, ValueError, IndexError):
    low = 32768
low = min(low, 32768)
span = 1500
start = max(1024, low - 12000) + int(sys.argv[2]) * span
socks = []
rng = random.SystemRandom()
while len(socks) < int(sys.argv[1]):
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", rng.randrange(start, start + span)))
    except OSError:
        s.close()
        continue
    socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
EOF
}

log_tail() { # FILE: last lines of a log, indented, to stderr
    [ -f "$1" ] || return 0
    echo "---- last lines of $1:" >&2
    tail -n 25 "$1" | sed 's/^/    /' >&2
}

# ---------------------------------------------------------------------------------------------
# down

down() {
    if [ ! -e "$S" ]; then
        say "already down ($S does not exist)"
        return 0
    fi
    if [ ! -f "$S/.imgtool-services" ]; then
        # never rm -rf a directory this script did not create (IMGTOOL_SERVICES_DIR=/tmp...)
        rmdir "$S" 2>/dev/null && { say "down"; return 0; }
        die "refusing to clean $S: it was not created by scripts/services.sh (no .imgtool-services)"
    fi
    local name pid
    if [ -f "$S/pids" ]; then
        # registries first (fast), then dockerd, which stops its containers and its containerd
        while read -r name pid; do
            case "$name" in registry-*) stop_pid "$name" "$pid" 5 ;; esac
        done <"$S/pids"
        while read -r name pid; do
            case "$name" in dockerd-*) stop_pid "$name" "$pid" 20 ;; esac
        done <"$S/pids"
        while read -r name pid; do
            case "$name" in containerd-*) stop_pid "$name" "$pid" 10 ;; esac
        done <"$S/pids"
    fi
    # containers a dockerd failed to stop (only if it was killed), and those left by our own
    # containerds (their runc state is under the state dir, see write_containerd_config) and by
    # podman (its runroot): remove them with runc directly
    local id root
    for root in "$S"/*/exec/runtime-runc/moby "$S"/c[0-9]*/runc/* "$S"/podman/run/runc; do
        [ -d "$root" ] && command -v runc >/dev/null || continue
        for id in $(runc --root "$root" list -q 2>/dev/null); do
            say "removing leftover container $id"
            runc --root "$root" delete -f "$id" >/dev/null 2>&1 || true
        done
    done
    for pid in $(our_shims); do stop_pid containerd-shim "$pid" 5; done

    # dockerd leaves mounts behind (netns files, overlay layers of killed containers, shm):
    # unmount deepest first so the state dir can be removed.
    local mnt
    awk -v s="$S/" 'index($2, s) == 1 { print $2 }' /proc/mounts | sort -r | while read -r mnt; do
        umount "$mnt" 2>/dev/null || umount -l "$mnt" 2>/dev/null || say "warning: cannot unmount $mnt"
    done
    rm -rf "$S"
    say "down"
}

# ---------------------------------------------------------------------------------------------
# up

all_running() {
    [ -f "$S/pids" ] && [ -f "$S/env.sh" ] || return 1
    local name pid n=0
    while read -r name pid; do
        pid_is_ours "$pid" || return 1
        n=$((n + 1))
    done <"$S/pids"
    [ "$n" -ge $((4 + 2 * $(wc -w <<<"$ENGINES") + $(containerd_count))) ] || return 1
    [ "$(cat "$S/engines" 2>/dev/null)" = "$ENGINES" ] || return 1
    [ "$(cat "$S/runtimes" 2>/dev/null)" = "$RUNTIMES" ] || return 1
    local runtime
    for runtime in $RUNTIMES; do
        case "$runtime" in
        containerd-*)
            "$(runtime_bin "$runtime")/ctr" --address "$(runtime_dir "$runtime")/containerd.sock" \
                --timeout 2s version >/dev/null 2>&1 || return 1 ;;
        esac
    done
    local engine
    for engine in $ENGINES; do
        curl -fsS --max-time 2 --unix-socket "$(engine_dir "$engine")/docker.sock" http://docker/_ping \
            >/dev/null 2>&1 || return 1
    done
}

make_certs() {
    local ec=(-newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes)
    mkdir -p "$S/tls" "$S/token"
    # CA + server certificate (127.0.0.1 and localhost) for the `tls` registry; the extensions
    # keep them valid for strict verifiers (Python 3.13's VERIFY_X509_STRICT, Go).
    openssl req -x509 "${ec[@]}" -keyout "$S/tls/ca.key" -out "$S/tls/ca.pem" -days 7 \
        -subj "/CN=imgtool test CA" \
        -addext "basicConstraints=critical,CA:TRUE" \
        -addext "keyUsage=critical,keyCertSign,cRLSign" \
        -addext "subjectKeyIdentifier=hash" 2>/dev/null
    openssl req "${ec[@]}" -keyout "$S/tls/server.key" -out "$S/tls/server.csr" \
        -subj "/CN=localhost" 2>/dev/null
    cat >"$S/tls/server.ext" <<'EOF'
subjectAltName = IP:127.0.0.1, DNS:localhost
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = serverAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
EOF
    openssl x509 -req -in "$S/tls/server.csr" -CA "$S/tls/ca.pem" -CAkey "$S/tls/ca.key" \
        -CAcreateserial -days 7 -extfile "$S/tls/server.ext" -out "$S/tls/server.pem" 2>/dev/null
    TLS_PASSWORD="$(openssl rand -hex 16)"
    htpasswd -Bbn "$TLS_USER" "$TLS_PASSWORD" >"$S/tls/htpasswd" 2>/dev/null
    # ES256 key + self-signed certificate of the token issuer (= the registry's rootcertbundle)
    openssl req -x509 "${ec[@]}" -keyout "$S/token/key.pem" -out "$S/token/cert.pem" -days 7 \
        -subj "/CN=$TOKEN_ISSUER" 2>/dev/null
}

write_registry_config() { # NAME PORT
    local name="$1" port="$2" dir="$S/reg/$1"
    mkdir -p "$dir/data"
    {
        cat <<EOF
version: 0.1
log:
  level: info
  formatter: text
  fields:
    registry: $name
storage:
  filesystem:
    rootdirectory: $dir/data
  delete:
    enabled: true
  cache:
    blobdescriptor: inmemory
  maintenance:
    uploadpurging:
      enabled: false
http:
  addr: 127.0.0.1:$port
  secret: $(openssl rand -hex 16)
  headers:
    X-Content-Type-Options: [nosniff]
EOF
        case "$name" in
        tls)
            cat <<EOF
  tls:
    certificate: $S/tls/server.pem
    key: $S/tls/server.key
auth:
  htpasswd:
    realm: imgtool-test
    path: $S/tls/htpasswd
EOF
            ;;
        token)
            cat <<EOF
auth:
  token:
    realm: http://127.0.0.1:$TOKEN_PORT/token
    service: $TOKEN_SERVICE
    issuer: $TOKEN_ISSUER
    rootcertbundle: $S/token/cert.pem
EOF
            ;;
        esac
    } >"$dir/config.yml"
}

start_registry() { # NAME
    local name="$1"
    setsid /usr/bin/docker-registry serve "$S/reg/$name/config.yml" \
        </dev/null >"$S/reg/$name/registry.log" 2>&1 &
    echo "registry-$name $!" >>"$S/pids"
}

wait_registry() { # NAME HOSTPORT SCHEME EXPECTED_STATUS
    local name="$1" url="$3://$2/v2/" want="$4" code i pid
    pid="$(awk -v n="registry-$name" '$1 == n { print $2 }' "$S/pids")"
    for ((i = 0; i < 150; i++)); do
        code="$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 --cacert "$S/tls/ca.pem" "$url" || true)"
        [ "$code" = "$want" ] && return 0
        if ! pid_is_ours "$pid"; then
            log_tail "$S/reg/$name/registry.log"
            die "registry $name exited during start-up"
        fi
        sleep 0.1
    done
    log_tail "$S/reg/$name/registry.log"
    die "registry $name did not answer $url with $want within 15s (last status: $code)"
}

# ---------------------------------------------------------------------------------------------
# Docker engines

engine_dir() { # ENGINE -> its directory under the state dir (short: sockets live below it)
    case "$1" in
    20.10) echo "$S/d20" ;;
    26.1) echo "$S/d26" ;;
    26.1-containerd) echo "$S/d26c" ;;
    28.5) echo "$S/d28" ;;
    28.5-containerd) echo "$S/d28c" ;;
    *) die "unknown engine $1 in IMGTOOL_SERVICES_ENGINES (known: 20.10 26.1 26.1-containerd 28.5 28.5-containerd)" ;;
    esac
}

engine_root() { # ENGINE -> the root its binaries are unpacked in ("" = the system's)
    case "$1" in
    20.10) echo "" ;;
    28.5*) echo "$SID_CACHE/root" ;;
    *) echo "$DEBS_CACHE/root" ;;
    esac
}

ensure_root_of() { # ENGINE or RUNTIME: the unpacked packages it runs from, fetched when missing
    case "$1" in
    28.5* | containerd-2.*) ensure_sid_docker ;;
    podman-5.*) ensure_sid_podman ;;
    26.1* | containerd-1.7) ensure_trixie_docker ;;
    esac
}

# Debian 13's (trixie) and unstable's (sid) docker.io and containerd, downloaded with a private apt
# configuration whose one source is the Debian mirror this machine's apt already uses, unpacked with
# dpkg -x into a cache dir: nothing is installed over the system's packages. runc is not taken:
# unstable's needs glibc 2.38, and the system's (1.1.5) runs both containerds' containers.
ensure_trixie_docker() { unpack_suite trixie "$DEBS_CACHE" "docker.io containerd" "Debian 13"; }
ensure_sid_docker() { unpack_suite sid "$SID_CACHE" "docker.io containerd" "Debian unstable"; }

# Debian unstable's podman 5 needs glibc 2.38, libsubid6 and libgpgme45 (Debian 12 has glibc 2.36), so it
# cannot run unpacked here: it runs from a Debian unstable root of its own, made with debootstrap from the
# same mirror (minbase and podman's run-time parts), chrooted into by DIR/bin/podman (setup_podman).
ensure_sid_podman() {
    local root="$SID_CACHE/podman-root" want="podman crun conmon netavark fuse-overlayfs runc"
    if [ -x "$root/usr/bin/podman" ] && [ "$(cat "$SID_CACHE/podman-stamp" 2>/dev/null)" = "$want" ]; then
        return 0
    fi
    command -v debootstrap >/dev/null 2>&1 || {
        say "installing debootstrap (for podman-5.8's root)"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >&2
    }
    local mirror
    mirror="$(debian_mirror)"
    say "making a Debian unstable root with ${want// /, } from $mirror in $root (about 3 minutes)"
    rm -rf "$root.tmp"
    mkdir -p "$SID_CACHE"
    debootstrap --variant=minbase --include="${want// /,}" sid "$root.tmp" "$mirror" >"$SID_CACHE/debootstrap.log" 2>&1 || {
        log_tail "$SID_CACHE/debootstrap.log"
        die "debootstrap of Debian unstable from $mirror failed"
    }
    rm -rf "$root"
    mv "$root.tmp" "$root"
    echo "$want" >"$SID_CACHE/podman-stamp"
}

debian_mirror() { # the Debian mirror this machine's apt already uses
    local mirror
    mirror="$(sed -n 's/^URIs:[[:space:]]*//p' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -n 1)"
    [ -n "$mirror" ] || mirror="$(awk '$1 == "deb" && $2 !~ /^\[/ { print $2; exit } $1 == "deb" { print $3; exit }' \
        /etc/apt/sources.list 2>/dev/null)"
    [ -n "$mirror" ] || die "cannot find this machine's Debian mirror in /etc/apt/sources.list{,.d}"
    echo "$mirror"
}

unpack_suite() { # SUITE CACHE_DIR "PACKAGES" TITLE
    local suite="$1" cache="$2" want="$3" title="$4"
    local root="$cache/root"
    if [ -x "$root/usr/sbin/dockerd" ] && [ "$(cat "$cache/stamp" 2>/dev/null)" = "$want" ]; then
        return 0
    fi
    local mirror
    mirror="$(debian_mirror)"
    say "fetching $title ($suite) $want from $mirror into $cache"
    local apt="$cache/apt"
    rm -rf "$apt" "$root.tmp"
    mkdir -p "$apt/lists/partial" "$apt/cache/archives/partial" "$apt/debs" "$root.tmp"
    echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror $suite main" >"$apt/sources.list"
    local opts=(-o "Dir::Etc::sourcelist=$apt/sources.list" -o "Dir::Etc::sourceparts=-"
        -o "Dir::State::Lists=$apt/lists" -o "Dir::Cache=$apt/cache" -o "APT::Get::List-Cleanup=0"
        -o "APT::Sandbox::User=root")
    apt-get -qq "${opts[@]}" update >&2 || die "apt-get update of $suite from $mirror failed"
    # shellcheck disable=SC2086  # a list of package names
    (cd "$apt/debs" && apt-get -qq "${opts[@]}" download $want >&2) ||
        die "apt-get download $want ($suite) failed"
    local deb
    for deb in "$apt"/debs/*.deb; do dpkg -x "$deb" "$root.tmp"; done
    [ -x "$root.tmp/usr/sbin/dockerd" ] && [ -x "$root.tmp/usr/bin/containerd" ] ||
        die "the $suite packages did not hold usr/sbin/dockerd and usr/bin/containerd"
    rm -rf "$root"
    mv "$root.tmp" "$root"
    rm -rf "$apt/lists" "$apt/cache"
    echo "$want" >"$cache/stamp"
}

start_dockerd() { # ENGINE
    local engine="$1" dir root
    dir="$(engine_dir "$engine")"
    root="$(engine_root "$engine")"
    mkdir -p "$dir/data" "$dir/exec"
    # our own config file, so /etc/docker/daemon.json of this machine is not read
    if [ "${engine#*-}" = containerd ]; then
        echo '{"features": {"containerd-snapshotter": true}}' >"$dir/daemon.json"
    else
        echo '{}' >"$dir/daemon.json"
    fi
    local group=() path="$PATH" dockerd=dockerd
    [ -n "$OWNER" ] && group=(--group "${OWNER#*:}")
    if [ -n "$root" ]; then
        path="$root/usr/bin:$root/usr/sbin:$PATH"  # its own containerd and shims first
        dockerd="$root/usr/sbin/dockerd"
    fi
    PATH="$path" setsid "$dockerd" \
        --config-file "$dir/daemon.json" \
        --data-root "$dir/data" \
        --exec-root "$dir/exec" \
        --pidfile "$dir/dockerd.pid" \
        --host "unix://$dir/docker.sock" \
        "${group[@]}" \
        --bridge=none \
        --iptables=false \
        --ip-forward=false \
        --ip-masq=false \
        --shutdown-timeout 5 \
        </dev/null >"$dir/dockerd.log" 2>&1 &
    echo "dockerd-$engine $!" >>"$S/pids"
}

wait_dockerd() { # ENGINE
    local engine="$1" dir pid i cpid
    dir="$(engine_dir "$engine")"
    pid="$(awk -v n="dockerd-$engine" '$1 == n { print $2 }' "$S/pids")"
    for ((i = 0; i < 600; i++)); do
        curl -fsS --max-time 2 --unix-socket "$dir/docker.sock" http://docker/_ping >/dev/null 2>&1 && break
        if ! pid_is_ours "$pid"; then
            log_tail "$dir/dockerd.log"
            die "dockerd $engine exited during start-up"
        fi
        sleep 0.1
    done
    if [ "$i" -ge 600 ]; then
        log_tail "$dir/dockerd.log"
        die "dockerd $engine did not answer on unix://$dir/docker.sock within 60s"
    fi
    local version
    version="$(docker -H "unix://$dir/docker.sock" version --format '{{.Server.Version}}' 2>/dev/null)" || {
        log_tail "$dir/dockerd.log"
        die "docker -H unix://$dir/docker.sock version failed"
    }
    case "$version" in "${engine%%-*}".*) ;; *) die "engine $engine answers as Docker $version" ;; esac
    # each dockerd runs its own containerd under its exec root; record it, and make sure it is
    # a child of our dockerd, not somebody else's containerd.
    cpid="$(cat "$dir/exec/containerd/containerd.pid" 2>/dev/null || true)"
    if [ -z "$cpid" ] || ! pid_is_ours "$cpid" ||
        [ "$(awk '/^PPid:/ { print $2 }' "/proc/$cpid/status")" != "$pid" ]; then
        log_tail "$dir/dockerd.log"
        die "dockerd $engine is not running its own containerd under $dir/exec (pid file: ${cpid:-none})"
    fi
    echo "containerd-$engine $cpid" >>"$S/pids"
}

# ---------------------------------------------------------------------------------------------
# containerd and Podman, the runtimes of nodes without Docker

runtime_dir() { # RUNTIME -> its directory under the state dir
    case "$1" in
    containerd-1.6) echo "$S/c16" ;;
    containerd-1.7) echo "$S/c17" ;;
    containerd-2.1) echo "$S/c21" ;;
    podman-4.3) echo "$S/podman" ;;
    podman-5.8) echo "$S/p58" ;;
    *) die "unknown runtime $1 in IMGTOOL_SERVICES_RUNTIMES (known: containerd-1.6 containerd-1.7 containerd-2.1 podman-4.3 podman-5.8)" ;;
    esac
}

runtime_bin() { # RUNTIME -> the directory of its binaries
    case "$1" in
    containerd-1.7) echo "$DEBS_CACHE/root/usr/bin" ;;
    containerd-2.*) echo "$SID_CACHE/root/usr/bin" ;;
    containerd-*) echo /usr/bin ;;
    *) echo /usr/bin ;;
    esac
}

containerd_count() {
    local runtime n=0
    for runtime in $RUNTIMES; do
        case "$runtime" in containerd-*) n=$((n + 1)) ;; esac
    done
    echo "$n"
}

# A node's containerd, private: every path it writes under its directory, nothing under /run,
# /var/lib or /opt. The CRI plugin's registry hosts (hosts.toml mirrors, as a node's
# /etc/containerd/certs.d) are $dir/certs.d: tests write a mirror there for a kubelet-style pull. runc's state goes under it too (the CRI runtime's Root; `ctr run` gets
# --runc-root in the tests), so `down` can find containers left behind.
write_containerd_config() { # RUNTIME
    local dir
    dir="$(runtime_dir "$1")"
    mkdir -p "$dir/root" "$dir/state" "$dir/opt" "$dir/runc" "$dir/cni/bin" "$dir/cni/conf" "$dir/certs.d"
    case "$1" in containerd-2.*) write_containerd_config_v3 "$1" "$dir"; return ;; esac
    cat >"$dir/config.toml" <<EOF
version = 2
root = "$dir/root"
state = "$dir/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
                    "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs"]
[grpc]
  address = "$dir/containerd.sock"
[ttrpc]
  address = "$dir/containerd.sock.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "$dir/opt"
[plugins."io.containerd.grpc.v1.cri"]
  disable_tcp_service = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
    Root = "$dir/runc/k8s.io"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$dir/cni/bin"
    conf_dir = "$dir/cni/conf"
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "$dir/certs.d"
EOF
}

# containerd 2.x reads `version = 3`: the CRI plugin split into io.containerd.cri.v1.images (the registry's
# config_path) and io.containerd.cri.v1.runtime, the server part left in io.containerd.grpc.v1.cri. NRI is
# on by default in 2.x with a socket under /var/run/nri: off, or every set of services would share it.
# restrict_oom_score_adj: root here lacks CAP_SYS_RESOURCE, so a pod sandbox dies without it (CONTEXT.md).
# DIR/bin/ctr is this containerd's own ctr, which the tests put first on PATH, as on a 2.x node.
# The pod sandbox's image is PAUSE_IMAGE, never pulled (nothing can be): a test that runs a Pod sandbox imports one
# built from local files under that name first (tests/support/cri.py pause_image).
PAUSE_IMAGE="imgtool.local/pause:1"
write_containerd_config_v3() { # RUNTIME DIR
    local dir="$2"
    cat >"$dir/config.toml" <<EOF
version = 3
root = "$dir/root"
state = "$dir/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
                    "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs",
                    "io.containerd.snapshotter.v1.erofs", "io.containerd.differ.v1.erofs",
                    "io.containerd.nri.v1.nri"]
[grpc]
  address = "$dir/containerd.sock"
[ttrpc]
  address = "$dir/containerd.sock.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "$dir/opt"
[plugins."io.containerd.grpc.v1.cri"]
  disable_tcp_service = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
[plugins."io.containerd.cri.v1.images".registry]
  config_path = "$dir/certs.d"
[plugins."io.containerd.cri.v1.images".pinned_images]
  sandbox = "$PAUSE_IMAGE"
[plugins."io.containerd.cri.v1.runtime"]
  restrict_oom_score_adj = true
  [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
    Root = "$dir/runc/k8s.io"
    BinaryName = "/usr/bin/runc"
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["$dir/cni/bin"]
    conf_dir = "$dir/cni/conf"
EOF
    mkdir -p "$dir/bin"
    ln -sfn "$(runtime_bin "$1")/ctr" "$dir/bin/ctr"
}

start_containerd() { # RUNTIME
    local runtime="$1" dir bin
    dir="$(runtime_dir "$runtime")"
    bin="$(runtime_bin "$runtime")"
    write_containerd_config "$runtime"
    PATH="$bin:$PATH" setsid "$bin/containerd" --config "$dir/config.toml" \
        </dev/null >"$dir/containerd.log" 2>&1 &
    echo "$runtime $!" >>"$S/pids"
}

wait_containerd() { # RUNTIME
    local runtime="$1" dir bin pid i version
    dir="$(runtime_dir "$runtime")"
    bin="$(runtime_bin "$runtime")"
    pid="$(awk -v n="$runtime" '$1 == n { print $2 }' "$S/pids")"
    for ((i = 0; i < 300; i++)); do
        version="$("$bin/ctr" --address "$dir/containerd.sock" --timeout 2s version 2>/dev/null |
            awk '/^Server:/ { s = 1 } s && $1 == "Version:" { print $2; exit }')" && [ -n "$version" ] && break
        if ! pid_is_ours "$pid"; then
            log_tail "$dir/containerd.log"
            die "containerd $runtime exited during start-up"
        fi
        sleep 0.1
    done
    if [ -z "$version" ]; then
        log_tail "$dir/containerd.log"
        die "containerd $runtime did not answer on $dir/containerd.sock within 30s"
    fi
    case "$version" in "${runtime#containerd-}".*) ;; *) die "runtime $runtime answers as containerd $version" ;; esac
    "$bin/ctr" --address "$dir/containerd.sock" plugins ls 2>/dev/null |
        awk '$1 == "io.containerd.grpc.v1" && $2 == "cri" && $4 == "ok" { found = 1 } END { exit !found }' || {
        log_tail "$dir/containerd.log"
        die "containerd $runtime is up without its CRI plugin"
    }
}

# Podman has no daemon: its private configuration and a wrapper are all there is to start.
setup_podman() { # RUNTIME
    local runtime="$1" dir
    dir="$(runtime_dir "$runtime")"
    mkdir -p "$dir/storage" "$dir/run" "$dir/tmp" "$dir/varlib" "$dir/bin" "$dir/volumes" "$dir/networks"
    cat >"$dir/storage.conf" <<EOF
[storage]
driver = "overlay"
graphroot = "$dir/storage"
runroot = "$dir/run"
EOF
    # the sandboxes this suite runs in cannot raise RLIMIT_NOFILE/NPROC to podman's defaults.
    # No static_dir: its default (graphroot/libpod) is private already, and with a custom one every
    # `podman run` waited 20 s after its container exited ("Exceeded conmon timeout waiting for
    # container", as containers/podman#19938 reports for a custom static_dir)
    local oci=""  # podman 5's OCI runtime: runc (below, the wrapper)
    [ "$runtime" = podman-4.3 ] || oci='runtime = "runc"'
    cat >"$dir/containers.conf" <<EOF
[containers]
netns = "none"
default_ulimits = ["nofile=1024:1024", "nproc=4096:4096"]
[engine]
$oci
cgroup_manager = "cgroupfs"
events_logger = "file"
events_logfile_path = "$dir/events.log"
tmp_dir = "$dir/tmp"
volume_path = "$dir/volumes"
[network]
network_config_dir = "$dir/networks"
EOF
    if [ "$runtime" = podman-4.3 ]; then
        cat >"$dir/bin/podman" <<EOF
#!/bin/sh
# podman in a mount namespace of its own, $dir/varlib over /var/lib/containers (scripts/services.sh)
exec unshare --mount --propagation private sh -c \
    'mount --bind "\$0" /var/lib/containers && exec /usr/bin/podman "\$@"' "$dir/varlib" "\$@"
EOF
    else
        # podman 5 from the Debian unstable root (ensure_sid_podman), chrooted into in a mount namespace of its
        # own: the root bound onto itself (runc makes / a slave mount, which must be a mount point), its /proc,
        # /sys and /dev the host's, this directory is bound in at its own path (the
        # storage.conf paths), $dir/varlib over /var/lib/containers, $dir/runroot over /run (crun's and
        # Podman's state: the root is shared by every set of services), and the host's /tmp and /var/tmp (the
        # archives imgtool stages, the bundles tests load) and /root (the presets' /root/.cache, which `imgtool
        # run` mounts into the container: Podman 4.3 sees the host's, so 5.8 must too) at theirs. cgroups v1
        # here: Podman 5 warns on every call, which the variable silences. runc (unstable's 1.3, inside the root), not crun: crun 1.28 refuses
        # cgroups in hybrid mode ("drop all controllers from cgroupv2"), which this machine runs.
        mkdir -p "$dir/runroot"
        cat >"$dir/bin/podman" <<EOF
#!/bin/sh
# podman 5 from $SID_CACHE/podman-root in a mount namespace of its own (scripts/services.sh)
PODMAN_IGNORE_CGROUPSV1_WARNING=1 exec unshare --mount --propagation private sh -c '
R="\$0"; D="\$1"; shift
mount --bind "\$R" "\$R" && mount -t proc proc "\$R/proc" && mount --rbind /sys "\$R/sys" && mount --rbind /dev "\$R/dev" &&
mount --rbind /tmp "\$R/tmp" && mount --rbind /var/tmp "\$R/var/tmp" && mount --bind /root "\$R/root" &&
mkdir -p "\$R\$D" && mount --bind "\$D" "\$R\$D" && mount --bind "\$D/varlib" "\$R/var/lib/containers" &&
mount --bind "\$D/runroot" "\$R/run" &&
cd / && exec chroot "\$R" /usr/bin/podman "\$@"' "$SID_CACHE/podman-root" "$dir" "\$@"
EOF
    fi
    chmod 755 "$dir/bin/podman"
    [ -d /var/lib/containers ] || mkdir -p /var/lib/containers
    [ "$runtime" = podman-4.3 ] || mkdir -p "$SID_CACHE/podman-root/var/lib/containers"
    local version
    version="$(CONTAINERS_STORAGE_CONF="$dir/storage.conf" CONTAINERS_CONF="$dir/containers.conf" \
        "$dir/bin/podman" version --format '{{.Client.Version}}' 2>"$dir/podman.log")" || {
        log_tail "$dir/podman.log"
        die "podman version failed with the private configuration in $dir"
    }
    case "$version" in "${runtime#podman-}".*) ;; *) die "$runtime is podman $version here" ;; esac
}

runtime_vars() { # the IMGTOOL_TEST_CONTAINERDS, IMGTOOL_TEST_PODMAN (4.3's) and IMGTOOL_TEST_PODMANS values
    local runtime out=() podman="" podmans=()
    for runtime in $RUNTIMES; do
        case "$runtime" in
        containerd-*) out+=("${runtime#containerd-}=$(runtime_dir "$runtime")/containerd.sock") ;;
        podman-*)
            podmans+=("${runtime#podman-}=$(runtime_dir "$runtime")")
            [ -n "$podman" ] && [ "$runtime" != podman-4.3 ] || podman="$(runtime_dir "$runtime")" ;;
        esac
    done
    printf '%s\n%s\n%s\n' "${out[*]}" "$podman" "${podmans[*]}"
}

write_env() {
    local v
    {
        for v in \
            "IMGTOOL_TEST_SERVICES_DIR=$S" \
            "IMGTOOL_TEST_DOCKER_HOST=unix://$(engine_dir "${ENGINES%% *}")/docker.sock" \
            "IMGTOOL_TEST_ENGINES=$(engine_list)" \
            "IMGTOOL_TEST_DOCKER_NETWORK=$DOCKER_NETWORK" \
            "IMGTOOL_TEST_CONTAINERDS=$(runtime_vars | sed -n 1p)" \
            "IMGTOOL_TEST_PODMAN=$(runtime_vars | sed -n 2p)" \
            "IMGTOOL_TEST_PODMANS=$(runtime_vars | sed -n 3p)" \
            "IMGTOOL_TEST_REGISTRY_PLAIN=127.0.0.1:$PORT_plain" \
            "IMGTOOL_TEST_REGISTRY_MIRROR=127.0.0.1:$PORT_mirror" \
            "IMGTOOL_TEST_REGISTRY_TLS=127.0.0.1:$PORT_tls" \
            "IMGTOOL_TEST_TLS_CA=$S/tls/ca.pem" \
            "IMGTOOL_TEST_TLS_USER=$TLS_USER" \
            "IMGTOOL_TEST_TLS_PASSWORD=$TLS_PASSWORD" \
            "IMGTOOL_TEST_REGISTRY_TOKEN=127.0.0.1:$PORT_token" \
            "IMGTOOL_TEST_TOKEN_PORT=$TOKEN_PORT" \
            "IMGTOOL_TEST_TOKEN_KEY=$S/token/key.pem" \
            "IMGTOOL_TEST_TOKEN_CERT=$S/token/cert.pem" \
            "IMGTOOL_TEST_TOKEN_SERVICE=$TOKEN_SERVICE" \
            "IMGTOOL_TEST_TOKEN_ISSUER=$TOKEN_ISSUER"; do
            printf 'export %s=%q\n' "${v%%=*}" "${v#*=}"
        done
    } >"$S/env.sh.tmp"
    mv "$S/env.sh.tmp" "$S/env.sh"
}

engine_list() { # "20.10=unix://.../docker.sock 26.1=unix://..."
    local engine out=()
    for engine in $ENGINES; do out+=("$engine=unix://$(engine_dir "$engine")/docker.sock"); done
    echo "${out[*]}"
}

on_up_exit() {
    local rc=$?
    if [ "$rc" -ne 0 ]; then
        say "start-up failed; stopping what was started"
        down
    fi
}

up() {
    if all_running; then
        say "already up ($S)"
        return 0
    fi
    if [ -e "$S" ]; then
        say "found a stale or partial state dir; cleaning it first"
        down
    fi
    ensure_packages
    local engine
    for engine in $ENGINES; do
        engine_dir "$engine" >/dev/null  # dies on an unknown name
        ensure_root_of "$engine"
    done
    local runtime
    for runtime in $RUNTIMES; do
        runtime_dir "$runtime" >/dev/null
        ensure_root_of "$runtime"
    done
    local t0=$SECONDS
    mkdir -p "$S"
    chmod 755 "$S"
    : >"$S/.imgtool-services"
    : >"$S/pids"
    echo "$ENGINES" >"$S/engines"
    echo "$RUNTIMES" >"$S/runtimes"
    # if anything below fails, leave nothing running
    trap on_up_exit EXIT

    read -r PORT_plain PORT_mirror PORT_tls PORT_token TOKEN_PORT <<<"$(free_ports 5)"
    make_certs
    for engine in $ENGINES; do start_dockerd "$engine"; done
    for runtime in $RUNTIMES; do
        case "$runtime" in containerd-*) start_containerd "$runtime" ;; podman-*) setup_podman "$runtime" ;; esac
    done
    local name
    for name in $REGISTRIES; do
        eval "write_registry_config $name \$PORT_$name"
        start_registry "$name"
    done
    wait_registry plain "127.0.0.1:$PORT_plain" http 200
    wait_registry mirror "127.0.0.1:$PORT_mirror" http 200
    wait_registry tls "127.0.0.1:$PORT_tls" https 401
    wait_registry token "127.0.0.1:$PORT_token" http 401
    for engine in $ENGINES; do wait_dockerd "$engine"; done
    for runtime in $RUNTIMES; do
        case "$runtime" in containerd-*) wait_containerd "$runtime" ;; esac
    done
    write_env
    if [ -n "$OWNER" ]; then
        chown -R "$OWNER" "$S/tls" "$S/token" "$S/env.sh"
    fi
    trap - EXIT
    say "up in $((SECONDS - t0))s: dockerd $(engine_list), runtimes ${RUNTIMES:-none}," \
        "registries plain=$PORT_plain" \
        "mirror=$PORT_mirror tls=$PORT_tls token=$PORT_token (issuer port $TOKEN_PORT)"
}

# ---------------------------------------------------------------------------------------------

case "${1:-}" in
packages) ensure_packages ;;
up) up ;;
down) down ;;
env)
    [ -f "$S/env.sh" ] || die "services are not up ($S/env.sh missing): run scripts/services.sh up"
    cat "$S/env.sh"
    ;;
status)
    if all_running; then say "up ($S)"; else say "not running ($S)"; exit 1; fi
    ;;
*)
    echo "usage: $0 packages|up|down|env|status" >&2
    exit 2
    ;;
esac
