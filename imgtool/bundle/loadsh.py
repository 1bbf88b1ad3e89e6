"""load.sh on a node: which parts it checks, whose runtime it loads into, whether the runtime has room, and what
a failed `ctr images import` leaves. The POSIX sh that texts.load_sh puts into every bundle (issue 36 item 4).

Each piece mirrors a room of imgtool's, in sh: the kubelet's runtime as kubelet.py finds it (the same places, the
same order, the same namespace caution), the space rules of bundle/hostcheck.py (the same needs and the same
words, computed from bundle.json's sizes when the script is written), and containerd.py's clean-up after a
failed import (the image records and blobs that were not there before) and its pin. Every value of bundle.json
reaches the script as an int, a digest, or through `text.sh_quote`.
"""

from typing import Dict, List, Tuple

from ..delta import chain_ids
from ..model import UNPACKED_PER_COMPRESSED
from ..runtimes import containerd, docker, kubelet, podman
from ..text import sh_quote
from .format import BUNDLE_JSON, SHA256SUMS, BundleIndex
from .layout import runtime_image_id

# the rooms' own numbers and words, so load.sh and imgtool say the same (bundle/hostcheck.py asks the rooms' traits)
PODMAN_STAGED_COPIES = podman.TRAITS.staged_copies  # Podman 4.3 holds 3.0 x the archive in its staging dir at its peak
PINNED = containerd.PINNED  # the CRI plugin reports such images pinned (1.7+)
ADVICE = {"docker": docker.SPACE_ADVICE, "containerd": containerd.SPACE_ADVICE, "podman": podman.SPACE_ADVICE}
STAGING_ADVICE = f"free space there, or {podman.TRAITS.staging_advice}"


# --- 1. which sums the parts are checked against ---------------------------------------------------------------

_SUMS = r"""
# What the files are checked against: SHA256SUMS when it names every part; else the sha256 bundle.json gives
# for every part (and file); else nothing can check the parts, and nothing is loaded. (A signed bundle had its
# files checked against the signed bundle.json above.)
only_new() {  # the lines of stdin that are not lines of $1
    before=$1 awk 'BEGIN { n = split(ENVIRON["before"], a, "\n"); for (i = 1; i <= n; i++) seen[a[i]] = 1 } !($0 in seen)'
}
part_names() {
    printf '%s\n' @PARTS@
}
sums_file=@SUMS@
why_not_sums=""
if [ ! -f @SUMS@ ]; then
    why_not_sums="@SUMS@ is missing"
elif [ ! -s @SUMS@ ]; then
    why_not_sums="@SUMS@ is empty"
else
    unlisted=$(part_names | only_new "$(sed -n 's/^[0-9a-f]\{64\} [ *]//p' @SUMS@)" | tr '\n' ' ')
    [ -z "$unlisted" ] || why_not_sums="@SUMS@ does not name every part (not: ${unlisted% })"
fi
if [ -n "$why_not_sums" ]; then
    # the sums bundle.json gives, in sha256sum -c's form (the awk of the signature check above)
    sums=$(awk '/^  "(parts|files)": \[/ { s = 1; next } /^  []]/ { s = 0 }
        s && /"name": "/ { n = $2; gsub(/[",]/, "", n) }
        s && /"sha256": "/ { h = $2; gsub(/[",]/, "", h); if (h ~ /^[0-9a-f]+$/ && length(h) == 64) print h "  " n }' @JSON@ 2>/dev/null)
    missing=$(part_names | only_new "$(printf '%s\n' "$sums" | sed -n 's/^[0-9a-f]\{64\}  //p')" | tr '\n' ' ')
    if [ -n "$signed" ]; then
        sums_file=""  # checked against the signed bundle.json already
    elif [ ! -f @JSON@ ] || [ -n "$missing" ] || [ -z "$sums" ]; then
        printf 'load.sh: error: cannot check the parts: %s, and @JSON@ does not give the sha256 of every part; %s\n' \
            "$why_not_sums" "nothing was loaded" >&2
        echo "load.sh: copy @SUMS@ and @JSON@ again from the source medium (or check the bundle with: imgtool verify .)" >&2
        exit 3
    else
        echo "load.sh: $why_not_sums: checking the files against the sha256 @JSON@ gives for them ..." >&2
        sums_file=-
    fi
fi
"""


def sums_choice(index: BundleIndex) -> str:
    """sh: set $sums_file to what the files are checked against (SHA256SUMS, or - for bundle.json's sums in
    $sums), or refuse (exit 3) when nothing names every part with its sha256."""
    names = " ".join(sh_quote(p.name) for p in index.parts)
    return _SUMS.replace("@PARTS@", names).replace("@SUMS@", SHA256SUMS).replace("@JSON@", BUNDLE_JSON)


# --- 2. the kubelet's runtime ----------------------------------------------------------------------------------

_KUBELET = r"""
# The kubelet of this node, found as imgtool finds it (imgtool/runtimes/kubelet.py), in this order: a running
# kubelet's command line (--container-runtime-endpoint, else --config FILE's containerRuntimeEndpoint; k3s runs it
# inside its own process, on its own containerd), kubeadm's flags file, /var/lib/kubelet/config.yaml,
# /etc/crictl.yaml, then k3s/RKE2's and MicroK8s's containerd sockets. A kubelet in another PID or mount namespace
# (a kind node's, a container's) is another node's. cri-dockerd means Docker. Only read, never written.
# Only root steers root's load: a kubelet process counts when every uid of it is 0 and it is alive; root's
# kubelets that name different runtimes are none of them followed. A file counts when it is a regular file owned
# by root, writable by root alone, not empty and at most @MAX_FILE@ bytes, and is read only up to its size
# (/proc/kmsg says 0; a FIFO is no regular file). A value holding a control character (a newline, which the
# command line read a line per argument would split) is no value. Every read of the host's files has a cap.
kube_runtime=""; kube_endpoint=""; kube_source=""; kube_said=""
kube_nl='
'
kube_warn() {  # a warning, once (as imgtool says each once)
    case "$kube_nl$kube_said$kube_nl" in *"$kube_nl$1$kube_nl"*) return 0 ;; esac
    kube_said="$kube_said$kube_nl$1"
    echo "load.sh: warning: $1" >&2
}
kube_flag() {  # stdin: the arguments, one a line; the last value of --$1 (--$1=V or --$1 V, as pflag takes it)
    awk -v f="$1" 'BEGIN { p = f "=" }
        { if (want) { v = $0; want = 0 } if (index($0, p) == 1) v = substr($0, length(p) + 1); else if ($0 == f) want = 1 }
        END { printf "%s", v }'
}
kube_valid() {  # $1 is a value (no control character in it); else said, as $2 holding one
    if printf '%s' "$1" | awk '/[\001-\037\177]/ { bad = 1 } END { exit !bad }'; then
        kube_warn "$2 holds a control character: not followed"; return 1
    fi
}
kube_file() {  # $1 counts as a file of the kubelet's (absent: silently not); sets kube_size
    [ -e "$1" ] || return 1
    if [ ! -f "$1" ]; then kube_warn "cannot read $1: not a regular file"; return 1; fi
    facts=$(ls -lnLd -- "$1" 2>/dev/null | awk 'NR == 1 { print substr($1, 1, 10), $3, $5 }')
    [ -n "$facts" ] || return 1  # gone since
    mode=${facts%% *}; facts=${facts#* }; owner=${facts%% *}; kube_size=${facts#* }
    why=""
    if [ "$owner" != 0 ]; then why="owned by uid $owner, not by root"
    else
        case "$mode" in ?????w*|????????w*) why="writable by others than root (mode $mode)" ;; esac
    fi
    if [ -n "$why" ]; then :
    elif [ "$kube_size" -gt @MAX_FILE@ ]; then why="$kube_size bytes is too big for a configuration file"
    elif [ "$kube_size" -eq 0 ]; then why="its size is 0 (an empty file, or one of the kernel's)"
    elif [ ! -r "$1" ]; then why="Permission denied"
    fi
    if [ -n "$why" ]; then kube_warn "cannot read $1: $why"; return 1; fi
}
kube_read() {  # the text of the file $1, up to the size kube_file found (and within a minute, as every wait here)
    bounded head -c "$kube_size" -- "$1" 2>/dev/null | tr -d '\r'
}
kube_key() {  # kube_value: the top-level scalar $2 of the small YAML (or JSON) file $1, as kubelet.read_keys reads it
    kube_value=""
    kube_file "$1" || return 0
    kube_value=$(kube_read "$1" | awk -v k="$2" -v q="'" '
        NR == 1 && /^[ \t]*[{]/ { json = 1 }
        json { text = text $0 "\n"; next }
        /^[ \t#-]/ || !/:/ { next }
        { key = $0; sub(/:.*/, "", key); gsub(/^[ \t]+|[ \t]+$/, "", key); gsub("^[\"" q "]+|[\"" q "]+$", "", key)
          if (key != k) next
          rest = substr($0, index($0, ":") + 1); gsub(/^[ \t]+|[ \t]+$/, "", rest)
          c = substr(rest, 1, 1)
          if (c == "\"" || c == q) { end = index(substr(rest, 2), c); if (end > 0) v = substr(rest, 2, end - 1); next }
          sub(/ #.*/, "", rest); gsub(/[ \t]+$/, "", rest)
          if (rest != "" && index("[{|>&*!", substr(rest, 1, 1)) == 0) v = rest }
        END { if (json && match(text, "\"" k "\"[ \t\r\n]*:[ \t\r\n]*\"[^\"]*\"")) {
                  v = substr(text, RSTART, RLENGTH); sub(/^"[^"]*"[ \t\r\n]*:[ \t\r\n]*"/, "", v); sub(/"$/, "", v) }
              printf "%s", v }' 2>/dev/null)
}
runtime_of() {  # which runtime an endpoint is: cri-dockerd (and the old dockershim) mean Docker
    name=${1%/}; name=${name##*/}
    case "$name" in
        *dockerd*|*dockershim*) echo docker ;;
        *crio*) echo cri-o ;;
        *isulad*) echo isulad ;;
        *) echo containerd ;;
    esac
}
kube_set() { kube_endpoint=$1; kube_source=$2; kube_runtime=${3:-$(runtime_of "$1")}; }
kube_from_args() {  # $1: the kubelet's arguments, one a line; $2: where they were read. 1: none named; 2: no value
    value=$(printf '%s\n' "$1" | kube_flag --container-runtime-endpoint)
    config=$(printf '%s\n' "$1" | kube_flag --config)
    kube_valid "$value" "$2: --container-runtime-endpoint" || return 2
    kube_valid "$config" "$2: --config" || return 2
    if [ -n "$value" ]; then kube_set "$value" "$2"; return 0; fi
    if [ -n "$config" ]; then
        kube_key "$config" containerRuntimeEndpoint
        if [ -n "$kube_value" ]; then
            kube_valid "$kube_value" "$config: containerRuntimeEndpoint" || return 2
            kube_set "$kube_value" "$config"; return 0
        fi
    fi
    if [ "$(printf '%s\n' "$1" | kube_flag --container-runtime)" = docker ]; then  # before 1.24: the dockershim
        kube_set unix:///var/run/dockershim.sock "$2" docker; return 0
    fi
    return 1
}
ns_of() { ls -l "/proc/$1/ns/$2" 2>/dev/null | sed -n 's/.* -> //p'; }
same_namespaces() {  # where they cannot be compared (not root), the kubelet is taken as this node's; gone: none
    for ns in pid mnt; do
        theirs=$(ns_of "$1" "$ns"); ours=$(ns_of self "$ns")
        if [ -z "$theirs" ]; then [ "$(id -u)" != 0 ] || return 1; continue; fi
        [ -z "$ours" ] || [ "$theirs" = "$ours" ] || return 1
    done
}
kube_found=""  # "pid runtime endpoint" of each of root's kubelets, a line each
kube_first=""  # the first one's runtime, endpoint and source, a line each
for pid in $(grep -lxE 'kubelet|k3s|k3s-server|k3s-agent' /proc/[0-9]*/comm 2>/dev/null | sed 's|^/proc/||; s|/comm$||' | sort -n); do
    # (the groups: a redirection that fails is reported to the stderr in force before its own 2>/dev/null applies;
    # a process that ended since the listing is no kubelet)
    comm=$( { head -c @MAX_COMM@ "/proc/$pid/comm"; } 2>/dev/null) || continue
    case "$comm" in kubelet|k3s|k3s-server|k3s-agent) ;; *) continue ;; esac
    # a NUL ends an argument; a newline in one becomes \001, which kube_valid refuses as imgtool refuses the newline
    args=$( { head -c @MAX_FILE@ "/proc/$pid/cmdline" | tr '\n\000' '\001\n'; } 2>/dev/null) || continue
    [ -n "$args" ] || continue  # a zombie, or a kernel thread
    # read after the command line: the process was root's, and alive, as that was read
    { head -c @MAX_STATUS@ "/proc/$pid/status" | awk '$1 == "State:" { s = $2 } $1 == "Uid:" { n = NF; u = $2 $3 $4 $5 }
        END { exit !(s != "" && s != "Z" && s != "X" && n == 5 && u == "0000") }'; } 2>/dev/null || continue
    same_namespaces "$pid" || continue
    case "$comm" in kubelet) source="the kubelet's command line, pid $pid" ;; *) source="k3s's command line, pid $pid" ;; esac
    kube_from_args "$(printf '%s\n' "$args" | sed 1d)" "$source"
    case $? in
        0) ;;
        2) continue ;;
        *) case "$comm" in
               k3s*)  # the embedded kubelet: on k3s's containerd, or on cri-dockerd with --docker
                   if printf '%s\n' "$args" | grep -qx -e --docker; then
                       kube_set unix:///run/k3s/cri-dockerd/cri-dockerd.sock "$source" docker
                   else
                       kube_set unix:///run/k3s/containerd/containerd.sock "$source" containerd
                   fi ;;
               *) kube_set unix:///run/containerd/containerd.sock "$source: no endpoint given, the kubelet's default" containerd ;;
           esac ;;
    esac
    kube_found="$kube_found$pid $kube_runtime $kube_endpoint$kube_nl"
    [ -n "$kube_first" ] || kube_first="$kube_runtime$kube_nl$kube_endpoint$kube_nl$kube_source"
done
kube_runtime=""; kube_endpoint=""; kube_source=""
if [ -n "$kube_first" ]; then
    if [ "$(printf '%s' "$kube_found" | sed 's/^[^ ]* //' | sort -u | awk 'END { print NR }')" -gt 1 ]; then
        named=$(printf '%s' "$kube_found" | awk '{ e = $0; sub(/^[^ ]* [^ ]* /, "", e)
            printf "%spid %s: %s at %s", (NR > 1 ? ", " : ""), $1, $2, e }')
        kube_warn "kubelets that name different runtimes run here ($named): none of them is followed"
    else
        kube_runtime=${kube_first%%"$kube_nl"*}; rest=${kube_first#*"$kube_nl"}
        kube_endpoint=${rest%%"$kube_nl"*}; kube_source=${rest#*"$kube_nl"}
    fi
fi
if [ -z "$kube_runtime" ] && kube_file /var/lib/kubelet/kubeadm-flags.env; then
    text=$(kube_read /var/lib/kubelet/kubeadm-flags.env)
    while IFS= read -r line; do
        value=$(printf '%s\n' "$line" | sed -n 's/^[[:blank:]]*KUBELET_KUBEADM_ARGS[[:blank:]]*=//p' |
            sed "s/^[[:blank:]]*//; s/[[:blank:]]*\$//; s/^\"//; s/\"\$//; s/^'//; s/'\$//")
        [ -n "$value" ] || continue
        set -f
        kube_from_args "$(printf '%s\n' $value)" /var/lib/kubelet/kubeadm-flags.env && { set +f; break; }
        set +f
    done <<KUBEADM_FLAGS
$text
KUBEADM_FLAGS
fi
if [ -z "$kube_runtime" ]; then
    for f in /var/lib/kubelet/config.yaml:containerRuntimeEndpoint /etc/crictl.yaml:runtime-endpoint; do
        kube_key "${f%%:*}" "${f#*:}"
        if [ -n "$kube_value" ] && kube_valid "$kube_value" "${f%%:*}: ${f#*:}"; then
            kube_set "$kube_value" "${f%%:*}"; break
        fi
    done
fi
if [ -z "$kube_runtime" ]; then
    k3s=/run/k3s/containerd/containerd.sock; microk8s=/var/snap/microk8s/common/run/containerd.sock
    if [ -e "$k3s" ]; then kube_set "unix://$k3s" "k3s/RKE2's containerd socket, $k3s" containerd
    elif [ -e "$microk8s" ]; then kube_set "unix://$microk8s" "MicroK8s's containerd socket, $microk8s" containerd; fi
fi
kube_address=${kube_endpoint#unix://}
follows=""
case "$runtime:$kube_runtime" in auto:containerd|auto:docker) runtime=$kube_runtime; follows=1 ;; esac
[ -n "$address" ] || { [ "$kube_runtime" = containerd ] && address=$kube_address; } || address=/run/containerd/containerd.sock
# where the images go when that is not where the kubelet reads them: said, then done as asked
elsewhere=""
case "$kube_runtime" in
    '') ;;
    containerd|docker)
        theirs="the kubelet reads images from $kube_runtime at $kube_endpoint (from $kube_source)"
        if [ "$runtime" != auto ] && [ "$runtime" != "$kube_runtime" ]; then
            elsewhere="$theirs, but --runtime $runtime sends them to $runtime"
        elif [ "$runtime" = containerd ] && [ "$address" != "$kube_address" ]; then
            elsewhere="$theirs, but this load goes to containerd at $address (CONTAINERD_ADDRESS)"
        elif [ "$runtime" = containerd ] && [ "$namespace" != k8s.io ]; then
            elsewhere="$theirs, namespace k8s.io, but this load goes to namespace $namespace (CONTAINERD_NAMESPACE)"
        fi ;;
    *) elsewhere="the kubelet uses $kube_runtime at $kube_endpoint (from $kube_source), which load.sh does not load into" ;;
esac
[ -z "$elsewhere" ] || echo "load.sh: warning: $elsewhere: Pods on this node will not find the images there" >&2
"""
# kubelet.py's caps, the same numbers in load.sh (tests/test_load_sh.py holds them equal)
KUBELET = (_KUBELET.replace("@MAX_FILE@", str(int(kubelet.MAX_FILE))).replace("@MAX_COMM@", str(int(kubelet.MAX_COMM)))
           .replace("@MAX_STATUS@", str(int(kubelet.MAX_STATUS))))


# --- 3. room where the runtime keeps images -------------------------------------------------------------------


def _ids(im) -> Tuple[str, str]:
    """The IDs a runtime knows the image by once loaded: its config digest (Docker's graphdriver store, Podman)
    and the manifest digest the archive's index.json names (Docker's containerd image store)."""
    return str(runtime_image_id(im, False)), str(runtime_image_id(im, True))


def _layer_table(index: BundleIndex) -> List[Tuple[str, int, int, str]]:
    """(chain ID, compressed, unpacked, the IDs of the images holding it) of every layer the bundle carries, once
    per chain, as hostcheck.need_for counts them."""
    seen: Dict[str, Tuple[str, int, int, List[str]]] = {}
    for im in index.images:
        for layer, chain in zip(im.layers, chain_ids([x.diff_id for x in im.layers])):
            if layer.omitted:
                continue
            row = seen.get(str(chain))
            if row is None:
                size = layer.unpacked_size if layer.unpacked_size is not None else int(layer.size * UNPACKED_PER_COMPRESSED)
                row = seen[str(chain)] = (str(chain), layer.size, size, [])
            row[3].extend(x for x in _ids(im) if x not in row[3])
    return [(chain, c, u, ",".join(ids)) for chain, c, u, ids in seen.values()]


_SPACE = r"""
# Room where the runtime keeps images, against what this load writes there, by the rules (and in the words) of
# imgtool load (imgtool/bundle/hostcheck.py): Docker's graphdriver store unpacks the whole archive under
# <root>/tmp before it registers the layers it lacks; the containerd store (containerd, Docker's containerd
# image store) keeps the compressed layers and unpacks them into snapshots; Podman loads from a copy of the
# archive in its staging dir ($TMPDIR, else /var/tmp) and copies the layers there twice more. A layer of an image
# the runtime holds (containerd: a snapshot of its chain) is not counted. Where the root cannot be measured from
# here, it says so and loads.
layers() {
    cat <<'EOF'
@LAYERS@
EOF
}
free_k() { df -kP "$1" 2>/dev/null | awk 'NR == 2 { print $4 }'; }
mount_of() { df -kP "$1" 2>/dev/null | awk 'NR == 2 { print $6 }'; }
held=""; store=""; root=""; nocheck=""
case "$runtime" in
    containerd)
        title=containerd; store=containerd; advice=$(printf '%s' @ADVICE_CONTAINERD@ | sed "s|@NAMESPACE@|$namespace|")
        root=$(bounded $CTR -a "$address" -n "$namespace" plugins ls --detailed 2>/dev/null | awk '
            $1 == "ID:" { id = $2 } $1 == "root" && id == "content" && !found { found = 1; print $2 }')
        root=${root%/*}
        held=$(bounded $CTR -a "$address" -n "$namespace" snapshots ls 2>/dev/null | awk 'NR > 1 { print $1 }') ;;
    docker)
        title=Docker; advice=@ADVICE_DOCKER@
        case "${DOCKER_HOST:-} $DOCKER" in *tcp://*|*ssh://*|*http://*|*https://*) nocheck="the daemon is not on this host" ;; esac
        root=$(bounded $DOCKER info --format '{{.DockerRootDir}}' 2>/dev/null)
        if bounded $DOCKER info --format '{{json .DriverStatus}}' 2>/dev/null | grep -q io.containerd.snapshotter; then store=containerd; fi
        for id in @IDS@; do
            if bounded $DOCKER image inspect "$id" >/dev/null 2>&1; then held="$held$id
"; fi
        done ;;
    podman)
        title=Podman; advice=@ADVICE_PODMAN@
        root=$(bounded $PODMAN info --format '{{.Store.GraphRoot}}' 2>/dev/null)
        while [ -n "$root" ] && [ ! -d "$root" ] && [ "${root%/*}" != "$root" ]; do root=${root%/*}; root=${root:-/}; done
        for id in @IDS@; do
            if bounded $PODMAN image exists "$id" >/dev/null 2>&1; then held="$held$id
"; fi
        done ;;
esac
stage=${TMPDIR:-/var/tmp}
if [ -z "$nocheck" ] && { [ -z "$root" ] || [ ! -d "$root" ]; }; then
    nocheck="${root:-its root} is not a directory here"
fi
free=""; stage_free=""; same_fs=1
if [ -z "$nocheck" ]; then
    free=$(free_k "$root")
    [ -n "$free" ] || nocheck="df cannot measure $root"
    if [ "$runtime" = podman ] && [ -d "$stage" ] && [ "$(mount_of "$stage")" != "$(mount_of "$root")" ]; then
        same_fs=""; stage_free=$(free_k "$stage")
    fi
fi
verdict=$(layers | KIND=$runtime STORE=$store TITLE=$title ROOT=${root:-its root} STAGE=$stage FREE_K=$free \
    STAGE_FREE_K=$stage_free SAME_FS=$same_fs HELD=$held awk -v tar=@TAR@ -v copies=@COPIES@ '
    function size(n,   v, i, u) {
        if (n < 1024) return sprintf("%d B", n)
        split("KiB MiB GiB", u, " "); v = n
        for (i = 1; i <= 3; i++) { v = v / 1024; if (v < 1024) return sprintf("%.1f %s", v, u[i]) }
        return sprintf("%.1f TiB", v / 1024)
    }
    BEGIN { n = split(ENVIRON["HELD"], h, "\n"); for (i = 1; i <= n; i++) if (h[i] != "") have[h[i]] = 1 }
    { mine = 0; k = split($4, ids, ","); for (i = 1; i <= k; i++) if (ids[i] in have) mine = 1
      if (($1 in have) || mine) { held++; next }
      kept += $2; unpacked += $3 }
    END {
        title = ENVIRON["TITLE"]; root = ENVIRON["ROOT"]; staged = 0
        podman = "the copy of the archive Podman loads from and the two Podman makes of its layers"
        if (ENVIRON["STORE"] == "containerd") {
            how = size(kept) " of compressed layers kept in the content store + "
            how = how size(unpacked) " unpacked into snapshots"
            staged = kept
        } else if (ENVIRON["KIND"] == "podman") {
            if (ENVIRON["SAME_FS"] != "") staged = copies * tar
            how = (staged ? size(staged) " in " ENVIRON["STAGE"] " for " podman " + " : "") size(unpacked) " unpacked"
        } else {
            staged = tar
            how = size(staged) " for the archive " title " unpacks into " root "/tmp before it registers the layers + "
            how = how size(unpacked) " unpacked"
        }
        if (held == 1) how = how "; 1 layer " title " holds already is not unpacked again"
        if (held > 1) how = how "; " held " layers " title " holds already are not unpacked again"
        need = staged + unpacked
        how = "the bundle needs about " size(need) " (" how ")"
        free = ENVIRON["FREE_K"] * 1024; stage_free = ENVIRON["STAGE_FREE_K"] * 1024
        if (ENVIRON["FREE_K"] == "") { print "nocheck"; print how }
        else if (ENVIRON["STAGE_FREE_K"] != "" && stage_free < copies * tar) {
            print "stagefail"
            print "not enough space for " title "\047s copy of the archive in " ENVIRON["STAGE"] ": it needs " \
                size(copies * tar) " (" podman "), " size(stage_free) " is free"
        } else if (free < need) { print "fail"; print "not enough space for " title " under " root ": " how ", " size(free) " is free" }
        else { print "ok"; print how }
    }')
nl='
'
status=${verdict%%"$nl"*}
verdict=${verdict#*"$nl"}
case "$status" in
    nocheck) echo "load.sh: warning: cannot check free space for $title (${nocheck:-df cannot measure ${root:-its root}}); $verdict" >&2 ;;
    fail|stagefail)
        [ "$status" = fail ] || advice=@STAGING_ADVICE@
        if [ -n "$force" ]; then
            echo "load.sh: warning: $verdict (--force: trying anyway)" >&2
        else
            echo "load.sh: error: $verdict; nothing was loaded" >&2
            echo "load.sh: $advice; or pass --force to try anyway" >&2
            exit 1
        fi ;;
esac
"""


def space_check(index: BundleIndex) -> str:
    """sh: refuse (exit 1, unless --force) when the runtime's root lacks the room this load needs there."""
    rows = "\n".join(f"{chain} {int(c)} {int(u)} {ids}" for chain, c, u, ids in _layer_table(index))
    ids = " ".join(dict.fromkeys(x for im in index.images for x in _ids(im)))
    return (_SPACE.replace("@LAYERS@", rows).replace("@IDS@", ids).replace("@TAR@", str(int(index.archive.tar_size)))
            .replace("@COPIES@", str(PODMAN_STAGED_COPIES))
            .replace("@ADVICE_CONTAINERD@", sh_quote(ADVICE["containerd"].format(namespace="@NAMESPACE@")))
            .replace("@ADVICE_DOCKER@", sh_quote(ADVICE["docker"])).replace("@ADVICE_PODMAN@", sh_quote(ADVICE["podman"]))
            .replace("@STAGING_ADVICE@", sh_quote(STAGING_ADVICE)))


# --- 4. containerd: what a failed import recorded, and the pin ------------------------------------------------

_BEFORE_IMPORT = r"""
if [ "$runtime" = containerd ]; then  # what was there before: a failed import removes only what it recorded
    images_before=$(bounded $CTR -a "$address" -n "$namespace" images ls -q 2>/dev/null)
    blobs_before=$(bounded $CTR -a "$address" -n "$namespace" content ls -q 2>/dev/null)
fi
"""

_FORGET = r"""
# After a failed `ctr images import` (a damaged archive, the disk full during the unpack; containerd 1.7 keeps
# an image it could not complete, which the CRI then reports present): remove the image records it created and
# the blobs it wrote, as imgtool's containerd room does. ctr's own lease, which held what it had unpacked, ended
# with ctr; `images rm --sync` then lets containerd's GC take the snapshots. What was there before stays.
forget() {
    set -f
    new=$(bounded $CTR -a "$address" -n "$namespace" images ls -q 2>/dev/null | only_new "$images_before")
    [ -z "$new" ] || bounded $CTR -a "$address" -n "$namespace" images rm --sync $new >/dev/null 2>&1
    left=$(bounded $CTR -a "$address" -n "$namespace" content ls -q 2>/dev/null | only_new "$blobs_before")
    [ -z "$left" ] || bounded $CTR -a "$address" -n "$namespace" content rm $left >/dev/null 2>&1
    set +f
    if [ -n "$new$left" ]; then
        printf 'load.sh: removed what the failed import had recorded: %s image record(s), %s blob(s)\n' \
            "$(printf '%s' "$new" | grep -c .)" "$(printf '%s' "$left" | grep -c .)" >&2
    fi
}
"""

_PIN = r"""
# Pinned: the CRI plugin (containerd 1.7+) reports images labelled @LABEL@ as pinned, and the
# kubelet's image GC leaves them (an air-gapped node cannot pull them back); --no-pin leaves them as they are.
if [ "$runtime" = containerd ] && [ -z "$no_pin" ]; then
    rows=$(bounded $CTR -a "$address" -n "$namespace" images ls 2>/dev/null | awk -v ids=@MANIFESTS@ '
        BEGIN { n = split(ids, a, " "); for (i = 1; i <= n; i++) mine[a[i]] = 1 }
        NR > 1 && ($3 in mine) { print $1 }')
    set -f
    for name in $rows; do  # every name of the image (the CRI's sha256:<config> one too), as imgtool pins
        if ! said=$(bounded $CTR -a "$address" -n "$namespace" images label "$name" @LABEL@ 2>&1 >/dev/null); then
            set +f
            echo "load.sh: error: cannot pin $name (ctr images label: $said); the image is loaded, not pinned" >&2
            exit 5
        fi
    done
    set +f
    pinned=$(printf '%s\n' "$rows" | grep -v -e '^sha256:' -e @ | tr '\n' ' ' | sed 's/ *$//; s/ /, /g')
    [ -z "$pinned" ] || echo "load.sh: pinned: $pinned (@LABEL@: the kubelet's image GC keeps them on containerd 1.7+)" >&2
fi
"""


def before_import() -> str:
    return _BEFORE_IMPORT


def forget() -> str:
    return _FORGET


def pin(index: BundleIndex) -> str:
    # the manifest digests index.json names: what ctr import records each image by
    manifests = sh_quote(" ".join(dict.fromkeys(str(runtime_image_id(im, True)) for im in index.images)))
    return _PIN.replace("@MANIFESTS@", manifests).replace("@LABEL@", PINNED)
