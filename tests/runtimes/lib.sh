# shellcheck shell=bash
# Shared helpers of the packaging and real-runtime tests (sourced, not run).
#
# Conventions: each test file defines `test_*` functions and ends with `run_tests "$@"`.
# Every test runs in its own subshell with its own scratch directory and cleanup stack; the
# root network namespace is snapshotted before and compared after each test (routes, rules,
# addresses, links, qdiscs, forwarding sysctls, iptables rules), so a test that changes it fails.

set -euo pipefail

RT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$RT_DIR/../.." && pwd)
BIN_DIR=${ALIASNET_BIN_DIR:-$REPO/target/release}
# Kept short: netns and interface names derive from it.
RT_ID=${RT_ID:-$$}

log() { printf '    %s\n' "$*" >&2; }
fail() {
  printf '    FAIL: %s\n' "$*" >&2
  exit 1
}
# check DESCRIPTION CMD...: run CMD, fail with DESCRIPTION if it fails.
check() {
  local what=$1
  shift
  "$@" || fail "$what"
}
assert_eq() { [[ $1 == "$2" ]] || fail "$3: expected '$2', got '$1'"; }
# has GREP-ARGS...: `grep -q GREP-ARGS` over the whole of stdin. A bare `producer | grep -q`
# fails under pipefail when grep exits at its first match while the producer is still
# writing (the producer dies of SIGPIPE), so a match would read as "not found".
has() {
  local input
  input=$(cat)
  grep -q "$@" <<<"$input"
}

# ---- cleanup stack (LIFO), run on the test subshell's exit ----
_cleanups=()
defer() { _cleanups+=("$*"); }
_run_cleanups() {
  local i
  for ((i = ${#_cleanups[@]} - 1; i >= 0; i--)); do
    # In a subshell: under `set -u` an unset variable in one cleanup (a test that failed before
    # setting it) would otherwise end the shell and skip the rest (namespaces, the holder).
    (eval "${_cleanups[i]}") >/dev/null 2>&1 || true
  done
  _cleanups=()
}

# ---- binaries ----
need_bins() {
  local b
  for b in "$@"; do
    [[ -x $BIN_DIR/$b ]] || fail "$BIN_DIR/$b missing: build with 'cargo build --release --bins' or set ALIASNET_BIN_DIR"
  done
}

# ---- root netns invariants ----
root_snapshot() {
  # Each probe is allowed to fail (e.g. no IPv6): a missing section still compares equal.
  {
    echo "## links"
    ip -o link show | awk -F': ' '{print $2}' | sed 's/@.*//' | sort
    echo "## addrs"
    ip -o addr show | awk '{print $2, $3, $4}' | sort
    echo "## routes"
    ip route show table all | grep -Ev '^(local|broadcast|multicast|anycast) ' | sort
    ip -6 route show table all | grep -Ev '^(local|multicast|anycast) ' | sort
    echo "## rules"
    ip rule show
    echo "## qdiscs"
    tc qdisc show | sort
    echo "## sysctls"
    sysctl net.ipv4.ip_forward net.ipv4.conf.all.forwarding net.ipv4.conf.default.forwarding \
      net.ipv4.conf.all.rp_filter net.ipv4.conf.all.proxy_arp net.ipv6.conf.all.forwarding
    echo "## iptables"
    iptables-save | grep -v '^#' | sed 's/\[[0-9]*:[0-9]*\]//'
    ip6tables-save | grep -v '^#' | sed 's/\[[0-9]*:[0-9]*\]//'
  } 2>/dev/null || true
}

# ---- network namespaces ----
# new_netns NAME: create (removed by the cleanup stack), lo up.
new_netns() {
  ip netns add "$1"
  defer "ip netns del $1"
  ip -n "$1" link set lo up
}
# in_ns NAME CMD...: run CMD in netns NAME without remounting /sys (bpffs stays visible).
in_ns() {
  local ns=$1
  shift
  nsenter --net="/run/netns/$ns" -- "$@"
}

# make_fabric NODE ROUTER INET POD_RANGE [MTU]: a node netns whose uplink eth0 (198.51.100.2/24)
# goes to a router netns (198.51.100.1 / 203.0.113.1) that routes POD_RANGE back to the node,
# and an "internet" host netns at 203.0.113.10. TEST-NET addresses only. Every link has MTU
# (default ALIASNET_TEST_MTU, as in the Rust test fabric, else 9000: the cloud VNets aliasnet
# targets run jumbo frames, and the plugin gives pods the uplink's MTU).
make_fabric() {
  local node=$1 rtr=$2 inet=$3 pods=$4 mtu=${5:-${ALIASNET_TEST_MTU:-9000}}
  new_netns "$node"
  new_netns "$rtr"
  new_netns "$inet"
  ip -n "$node" link add eth0 mtu "$mtu" type veth peer name to-node mtu "$mtu" netns "$rtr"
  ip -n "$rtr" link add to-inet mtu "$mtu" type veth peer name eth0 mtu "$mtu" netns "$inet"
  ip -n "$node" addr add 198.51.100.2/24 dev eth0
  ip -n "$node" link set eth0 up
  ip -n "$node" route add default via 198.51.100.1
  ip -n "$rtr" addr add 198.51.100.1/24 dev to-node
  ip -n "$rtr" addr add 203.0.113.1/24 dev to-inet
  ip -n "$rtr" link set to-node up
  ip -n "$rtr" link set to-inet up
  ip -n "$rtr" route add "$pods" via 198.51.100.2
  in_ns "$rtr" sysctl -qw net.ipv4.ip_forward=1
  ip -n "$inet" addr add 203.0.113.10/24 dev eth0
  ip -n "$inet" link set eth0 up
  ip -n "$inet" route add default via 203.0.113.1
}

# add_fabric_ipv6 NODE ROUTER INET POD_PREFIX6: IPv6 on make_fabric's links (node
# fd00:100::2/64 behind router fd00:100::1; router 2001:db8::1/64, internet host 2001:db8::10) and
# POD_PREFIX6 routed to the node. The addresses skip duplicate address detection (nothing else is
# on these links): a tentative address would not route for 1-2 s.
add_fabric_ipv6() {
  local node=$1 rtr=$2 inet=$3 pods6=$4
  in_ns "$rtr" sysctl -qw net.ipv6.conf.all.forwarding=1
  ip -n "$node" addr add fd00:100::2/64 dev eth0 nodad
  ip -n "$node" -6 route add default via fd00:100::1
  ip -n "$rtr" addr add fd00:100::1/64 dev to-node nodad
  ip -n "$rtr" addr add 2001:db8::1/64 dev to-inet nodad
  ip -n "$rtr" -6 route add "$pods6" via fd00:100::2
  ip -n "$inet" addr add 2001:db8::10/64 dev eth0 nodad
  ip -n "$inet" -6 route add default via 2001:db8::1
}

# The internet host's second address (make_fabric gives it 203.0.113.10): a destination that a
# policy can put in a named class of its own while the first stays plain internet.
MIRROR_IP=203.0.113.20
# add_mirror INET: MIRROR_IP on the internet host's link.
add_mirror() { ip -n "$1" addr add "$MIRROR_IP/24" dev eth0; }

# An internal host beyond the node's uplink, as another node's pod is: 10.99.0.10 (in the
# policies' internal_cidrs 10.0.0.0/8), behind the router.
PEER_IP=10.99.0.10
# add_fabric_peer ROUTER PEER [MTU]: the netns PEER on a link of its own to the router, which
# forwards between it and the node (the node's default route leads there).
add_fabric_peer() {
  local rtr=$1 peer=$2 mtu=${3:-${ALIASNET_TEST_MTU:-9000}}
  new_netns "$peer"
  ip -n "$rtr" link add to-peer mtu "$mtu" type veth peer name eth0 mtu "$mtu" netns "$peer"
  ip -n "$rtr" addr add 10.99.0.1/24 dev to-peer
  ip -n "$rtr" link set to-peer up
  ip -n "$peer" addr add "$PEER_IP/24" dev eth0
  ip -n "$peer" link set eth0 up
  ip -n "$peer" route add default via 10.99.0.1
}

# node_links NODE: links of the node netns other than lo, eth0 and the datapath's aggregate
# devices (a policy with namespace or node limits makes them; they stay with the datapath):
# pod host veths.
node_links() {
  ip -n "$1" -o link show | awk -F': ' '{print $2}' | sed 's/@.*//' |
    grep -vx 'lo\|eth0\|aliasnet-nsin\|aliasnet-nsout\|aliasnet-nodein' || true
}
# node_pod_routes NODE: host routes to pods (scope link /32s and /128s via veths; not the
# link-local routes of the uplink and the aggregate devices).
node_pod_routes() {
  ip -n "$1" route show | grep -v '^default\|^198\.51\.100\.0/24' || true
  ip -n "$1" -6 route show | grep -v '^default\|^fd00:100::/64\|^fe80::/64 dev \(eth0\|aliasnet-\)\|^multicast' || true
}

# ---- a private mount namespace for a runtime ----
# Runtimes write to fixed host paths (/var/lib/cni/results, /var/lib/containers/cache,
# /run/runc, /run/netns, ctr's /etc/cni/net.d and /opt/cni/bin). start_mount_ns starts a
# process holding a private mount namespace whose /var/lib, /run and /opt are empty tmpfs;
# `mns` runs a command in it (nsenter opens /run/netns/<node> before it enters). Everything mounted there (tmpfs, overlays, netns bind mounts) vanishes with
# the namespace, so the host's filesystem never sees the runtime's files.
start_mount_ns() {
  unshare --mount --propagation private -- sleep infinity &
  HOLDER=$!
  defer "kill $HOLDER"
  local i
  for ((i = 0; i < 100; i++)); do
    [[ $(readlink "/proc/$HOLDER/ns/mnt" 2>/dev/null) != "$(readlink /proc/self/ns/mnt)" ]] && break
    sleep 0.02
  done
  local d
  for d in /var/lib /run /opt; do
    mns mount -t tmpfs -o mode=755 aliasnet-rt "$d"
  done
  mns mkdir -p /run/netns /run/lock
}
mns() { nsenter --mount="/proc/$HOLDER/ns/mnt" -- "$@"; }
# in_node CMD...: in the node's netns and the runtime's mount namespace.
in_node() { nsenter --mount="/proc/$HOLDER/ns/mnt" --net="/run/netns/${NODE:?}" -- "$@"; }

# remove_cgroups NAME: rmdir the cgroup NAME (and below, deepest first) in every hierarchy; the
# runtimes leave their cgroup directories behind (runtimes.md).
remove_cgroups() {
  local d
  for d in /sys/fs/cgroup/*/"$1" /sys/fs/cgroup/"$1"; do
    [[ -d $d ]] && find "$d" -depth -type d -exec rmdir {} + 2>/dev/null
  done
  return 0
}

# ---- images without a registry ----
# docker_archive ROOTFS TAR TAG CMD_JSON: a one-layer docker-archive of directory ROOTFS, tagged
# TAG, with CMD_JSON (e.g. '["/bin/sh"]') as its command, for `ctr images import`.
docker_archive() {
  tar -C "$1" -cf "$2.layer" .
  python3 - "$2.layer" "$2" "$3" "$4" <<'EOF'
import hashlib, io, json, sys, tarfile
layer, out, tag, cmd = sys.argv[1:]
digest = hashlib.sha256(open(layer, "rb").read()).hexdigest()
config = {"architecture": "amd64", "os": "linux",
          "config": {"Cmd": json.loads(cmd), "Env": ["PATH=/bin"]},
          "rootfs": {"type": "layers", "diff_ids": ["sha256:" + digest]}}
cfg = json.dumps(config).encode()
cfg_name = hashlib.sha256(cfg).hexdigest() + ".json"
manifest = [{"Config": cfg_name, "RepoTags": [tag], "Layers": [digest + "/layer.tar"]}]
with tarfile.open(out, "w") as t:
    def add(name, data):
        ti = tarfile.TarInfo(name)
        ti.size = len(data)
        t.addfile(ti, io.BytesIO(data))
    add(cfg_name, cfg)
    t.add(layer, digest + "/layer.tar")
    add("manifest.json", json.dumps(manifest).encode())
EOF
  rm -f "$2.layer"
}

# ---- the eBPF datapath ----
# start_datapath DIR: a private bpffs instance at DIR/bpf in the runtime's mount namespace (it
# goes with the namespace; /sys/fs/bpf is not touched) and the datapath pinned there by
# `aliasnet-shaperd --once` in the node's netns with DIR/src/shaper.toml. Pods attach from the
# pinned objects; shaperd need not keep running. Sets PIN_ROOT (the conflist's bpfPinRoot).
start_datapath() {
  local dir=$1
  need_bins aliasnet-shaperd aliasnetctl
  command -v bpftool >/dev/null || skip "bpftool not installed"
  PIN_ROOT=$dir/bpf/aliasnet
  mkdir -p "$dir/bpf"
  mns mount -t bpf bpf "$dir/bpf" || fail "cannot mount a bpffs instance at $dir/bpf"
  in_node "$BIN_DIR/aliasnet-shaperd" --once --config "$dir/src/shaper.toml" --pin-root "$PIN_ROOT" \
    >"$dir/shaperd.log" 2>&1 || fail "aliasnet-shaperd --once: $(tail -n 5 "$dir/shaperd.log")"
}

# install_policy DIR: DIR/shaper.toml for install.sh: RT_POLICY (the policy's text) when the
# test set it, else the shipped install/etc/shaper.toml.
install_policy() {
  if [[ -n ${RT_POLICY:-} ]]; then
    printf '%s\n' "$RT_POLICY" >"$1/shaper.toml"
  else
    cp "$REPO/install/etc/shaper.toml" "$1/"
  fi
}

# start_shaperd_daemon DIR: aliasnet-shaperd as the DaemonSet runs it, after start_datapath:
# in the node's netns and the runtime's mount namespace, polling DIR/src/shaper.toml every
# second and following the pods (it sets up the namespaces' and the node's aggregates as pods
# come and go). Sets SHAPERD_PID; stop it with stop_shaperd_daemon (a deferred stop_pid is the
# backstop).
start_shaperd_daemon() {
  local dir=$1 i
  SHAPERD_LOG=$dir/shaperd-daemon.log
  in_node env RUST_LOG=info "$BIN_DIR/aliasnet-shaperd" --config "$dir/src/shaper.toml" --pin-root "$PIN_ROOT" \
    --poll-interval 1 --metrics-address off >"$SHAPERD_LOG" 2>&1 &
  SHAPERD_PID=$!
  defer "stop_pid $SHAPERD_PID"
  for ((i = 0; i < 200; i++)); do
    grep -q 'running;' "$SHAPERD_LOG" && return 0
    kill -0 "$SHAPERD_PID" 2>/dev/null || fail "aliasnet-shaperd exited: $(tail -n 5 "$SHAPERD_LOG")"
    sleep 0.05
  done
  fail "aliasnet-shaperd did not start: $(tail -n 5 "$SHAPERD_LOG")"
}

# stop_shaperd_daemon: SIGTERM; the daemon must exit 0 (leaving the datapath in place).
stop_shaperd_daemon() {
  local rc=0
  # The daemon, not the subshell that started it (whose status is the daemon's).
  kill -TERM "$(shaperd_pid)"
  wait "$SHAPERD_PID" || rc=$?
  ((rc == 0)) || fail "aliasnet-shaperd exited with $rc on SIGTERM: $(tail -n 5 "$SHAPERD_LOG")"
}

# set_policy DIR TEXT: a new policy for the running shaperd (written atomically, then SIGHUP:
# no waiting for the next poll).
set_policy() {
  printf '%s\n' "$2" >"$1/src/shaper.toml.new"
  mv "$1/src/shaper.toml.new" "$1/src/shaper.toml"
  kill -HUP "$(shaperd_pid)"
}

# shaperd_pid: the daemon's pid (start_shaperd_daemon's job is a subshell running it, or it).
shaperd_pid() { pgrep -P "$SHAPERD_PID" || echo "$SHAPERD_PID"; }

# status_json: `aliasnetctl status --json` (what the maps hold: classes, limits, aggregates).
status_json() {
  in_node "$BIN_DIR/aliasnetctl" status --pin-root "$PIN_ROOT" --socket "${SOCK:?}" --json
}

# wait_aggregate NAMESPACE PODS: until the datapath has NAMESPACE's aggregate with PODS pods
# (shaperd reconciles within a few of its 250 ms looks after an ADD or a policy change).
wait_aggregate() {
  local i got
  for ((i = 0; i < 100; i++)); do
    got=$(status_json | jq --arg ns "$1" '[.datapath.config.namespace_limits[] | select(.namespace == $ns) | .pods][0] // 0')
    [[ $got == "$2" ]] && return 0
    sleep 0.1
  done
  fail "namespace '$1': no aggregate of $2 pods after 10 s (has $got): $(tail -n 5 "$SHAPERD_LOG")"
}

# pods_json: the node's attached pods as the operator sees them (`aliasnetctl pods --json`
# reads the pinned maps).
pods_json() {
  in_node "$BIN_DIR/aliasnetctl" pods --pin-root "$PIN_ROOT" --socket "${SOCK:?}" --json
}

# attached_pods: "CONTAINER_ID IP" of every pod with a datapath attachment.
attached_pods() {
  pods_json | jq -r '.[] | "\(.container_id) \(.ip)"'
}

# assert_no_map_entries: no pod left in the pinned maps (the per-pod filters and qdiscs go
# with the veth pair, which assert_clean checks).
assert_no_map_entries() {
  local m n l
  for m in an_pods an_pod_ips; do
    n=$(mns bpftool -j map dump pinned "$PIN_ROOT/maps/$m" | jq length) || fail "bpftool map dump $m"
    [[ $n == 0 ]] || fail "leaked $m entries: $n"
  done
  l=$(attached_pods) || fail "aliasnetctl pods failed"
  [[ -z $l ]] || fail "leaked datapath attachments: $l"
}

# ---- downloads ----
# in_net TARGET CMD...: CMD in a pod's netns (TARGET is its path, a bind mount in the runtime's
# mount namespace) or in a netns of the fabric (TARGET is its name).
in_net() {
  local t=$1
  shift
  if [[ $t == /* ]]; then
    mns nsenter --net="$t" -- "$@"
  else
    in_ns "$t" "$@"
  fi
}

# tcp_counters TARGET: "OutSegs RetransSegs" of the netns's TCP stack.
tcp_counters() {
  in_net "$1" cat /proc/net/snmp | awk '$1 == "Tcp:" && $2 ~ /^[0-9]+$/ {print $12, $13}'
}

# downloads DIR SECS CELL...: TCP downloads, all at once, for SECS seconds. CELL is
# "NAME|CLIENT|SENDER|ADDR|PACE": an iperf3 client in CLIENT receiving (-R) from a server of
# its own in SENDER on ADDR (in_net targets), paced at PACE (iperf3 -b, e.g. 400M; empty: as
# fast as the path takes it). Writes DIR/NAME.json (the receiver's report) and DIR/senders (each
# sender's "TARGET OutSegs RetransSegs" over the run) for downloads.py.
downloads() {
  local dir=$1 secs=$2 cell name client sender addr pace port=5400 i
  shift 2
  mkdir -p "$dir"
  local -a servers=() clients=() senders=() before=()
  for cell in "$@"; do
    IFS='|' read -r name client sender addr pace <<<"$cell"
    port=$((port + 1))
    in_net "$sender" timeout $((secs + 20)) iperf3 -s -1 -B "$addr" -p "$port" >"$dir/$name.server" 2>&1 &
    servers+=($!)
    for ((i = 0; i < 100; i++)); do
      [[ -n $(in_net "$sender" ss -Hltn "sport = :$port") ]] && break
      sleep 0.05
    done
    [[ " ${senders[*]} " == *" $sender "* ]] || senders+=("$sender")
  done
  for sender in "${senders[@]}"; do before+=("$(tcp_counters "$sender")"); done
  port=5400
  for cell in "$@"; do
    IFS='|' read -r name client sender addr pace <<<"$cell"
    port=$((port + 1))
    # A transfer that stalls (its control connection too) ends 8 s after its time.
    in_net "$client" timeout $((secs + 8)) iperf3 -c "$addr" -p "$port" -R -t "$secs" -J ${pace:+-b "$pace"} \
      --connect-timeout 3000 >"$dir/$name.json" 2>"$dir/$name.err" &
    clients+=($!)
  done
  for i in "${clients[@]}" "${servers[@]}"; do wait "$i" || true; done
  : >"$dir/senders"
  for i in "${!senders[@]}"; do
    echo "${senders[i]} ${before[i]} $(tcp_counters "${senders[i]}")" >>"$dir/senders"
  done
}

# assert_class_counters SECS: after SECS of downloads into pod "cls" from the class "mirrors"
# (10M) and the rest of the internet (10M) and into "greedy" from the internal host
# (INTERNAL_PACE), the datapath counted each in its class (bytes of 90 % of the rate at least).
assert_class_counters() {
  local secs=$1 got mirrors internet internal
  pods_json >"$S/pods-after.json" || fail "aliasnetctl pods failed"
  got=$(jq -r '(.[] | select(.pod == "cls") | .ingress | "\(.classes.mirrors.bytes) \(.internet.bytes)"),
      (.[] | select(.pod == "greedy" or .pod == "lim") | .ingress.internal.bytes)' "$S/pods-after.json" | xargs)
  read -r mirrors internet internal <<<"$got"
  log "ingress bytes counted: cls mirrors $mirrors, internet (mirrors in it) $internet; internal beside the limited download $internal"
  local want=$((secs * 10000000 * 9 / 80)) want_internal=$((secs * ${INTERNAL_PACE%M} * 1000000 * 9 / 80))
  ((mirrors >= want && internet - mirrors >= want && internal >= want_internal)) ||
    fail "downloads counted by class: want mirrors and the rest of the internet >= $want B each, internal >= $want_internal B"
}

# check_downloads DIR CHECK...: downloads.py's table of the bounds (see there); logs it, fails
# the test naming what is out of bounds.
check_downloads() {
  local out rc=0
  out=$(python3 "$RT_DIR/downloads.py" "$@") || rc=$?
  while IFS= read -r l; do log "$l"; done <<<"$out"
  ((rc == 0)) || fail "downloads out of bounds: $(grep -c FAIL <<<"$out") check(s) failed"
}

# ---- aliasnet-ipamd ----
# ipamd_config DIR POOL_CIDR: write DIR/ipamd.toml with everything under DIR.
ipamd_config() {
  local dir=$1 cidr=$2
  mkdir -p "$dir/spool"
  cat >"$dir/ipamd.toml" <<EOF
socket = "$dir/ipamd.sock"
state_dir = "$dir/ipam"
spool_dir = "$dir/spool"
cooldown = "0"
host_veth_prefix = "ali"
log_level = "debug"

[[pool]]
name = "test"
source = "static"
cidrs = ["$cidr"]
EOF
}

# start_ipamd NS DIR [SOCKET]: run aliasnet-ipamd in netns NS with DIR/ipamd.toml, logging to
# DIR/ipamd.log; waits until SOCKET (default DIR/ipamd.sock) answers.
start_ipamd() {
  local ns=$1 dir=$2 sock=${3:-$2/ipamd.sock} pid i
  in_ns "$ns" "$BIN_DIR/aliasnet-ipamd" --config "$dir/ipamd.toml" >>"$dir/ipamd.log" 2>&1 &
  pid=$!
  echo "$pid" >"$dir/ipamd.pid"
  defer "stop_pid $pid"
  for ((i = 0; i < 100; i++)); do
    if ipam_call "$sock" '{"op":"stats"}' >/dev/null 2>&1; then return 0; fi
    kill -0 "$pid" 2>/dev/null || fail "aliasnet-ipamd exited: $(tail -n 5 "$dir/ipamd.log")"
    sleep 0.05
  done
  fail "aliasnet-ipamd did not answer on $sock: $(tail -n 5 "$dir/ipamd.log")"
}

# descendants PID: PID's descendant processes, deepest first.
descendants() {
  local child
  for child in $(pgrep -P "$1" || true); do
    descendants "$child"
    echo "$child"
  done
}

# stop_pid PID: SIGTERM to PID and its descendants (a backgrounded `in_ns cmd &` is a subshell
# whose child is the daemon: signalling the subshell alone would orphan the daemon), then
# SIGKILL after 5 s.
stop_pid() {
  local pid=$1 i p alive
  local -a tree
  mapfile -t tree < <(descendants "$pid")
  tree+=("$pid")
  kill -TERM "${tree[@]}" 2>/dev/null || true
  for ((i = 0; i < 100; i++)); do
    alive=0
    # A dead child of ours stays a zombie (kill -0 succeeds) until it is waited for.
    for p in "${tree[@]}"; do [[ $(ps -o stat= -p "$p" 2>/dev/null) == [!Z]* ]] && alive=1; done
    ((alive)) || break
    sleep 0.05
  done
  ((alive)) && kill -KILL "${tree[@]}" 2>/dev/null
  wait "$pid" 2>/dev/null || true
}

# ipam_call SOCKET JSON_BODY: one request over the ipam-proto framing (4-byte big-endian
# length + JSON with "v":1), prints the reply's JSON.
ipam_call() {
  python3 - "$1" "$2" <<'EOF'
import json, socket, struct, sys
path, body = sys.argv[1], json.loads(sys.argv[2])
req = json.dumps({"v": 1, **body}).encode()
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.settimeout(5)
s.connect(path)
s.sendall(struct.pack(">I", len(req)) + req)
def read(n):
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise SystemExit("ipamd closed the connection")
        buf += chunk
    return buf
(n,) = struct.unpack(">I", read(4))
print(read(n).decode())
EOF
}

# leases SOCKET: one line per lease: "<address> <network>/<container>/<ifname>".
leases() {
  ipam_call "$1" '{"op":"list"}' |
    jq -r 'if .reply != "leases" then error("unexpected reply: \(.)") else .leases[] | "\(.address) \(.key.network)/\(.key.container_id)/\(.key.ifname)" end'
}

# distinct_in RANGE ADDR...: every ADDR is set, an address of the CIDR RANGE, and unlike the
# others.
distinct_in() {
  python3 - "$@" <<'EOF'
import ipaddress, sys
net, addrs = ipaddress.ip_network(sys.argv[1]), sys.argv[2:]
ok = all(a and ipaddress.ip_address(a) in net for a in addrs) and len(set(addrs)) == len(addrs)
sys.exit(0 if ok else 1)
EOF
}

# ---- runner ----
# _run_one TEST: the test with a fresh scratch directory and cleanup stack (call in a subshell).
_run_one() {
  SCRATCH=$(mktemp -d "/var/tmp/aliasnet-rt.XXXXXX")
  export SCRATCH
  _cleanups=()
  trap '_run_cleanups; rm -rf "$SCRATCH"' EXIT
  "$1"
}
run_tests() {
  local only=${1:-} t passed=0 failed=0 skipped=0 before after rc
  local tests
  tests=$(declare -F | awk '{print $3}' | grep '^test_' || true)
  for t in $tests; do
    [[ -z $only || $t == "$only" ]] || continue
    printf '%s ... \n' "$t" >&2
    before=$(root_snapshot)
    rc=0
    # Not `( ... ) || rc=$?`: inside a ||-list bash ignores errexit, and the tests rely on it.
    set +e
    (_run_one "$t")
    rc=$?
    set -e
    after=$(root_snapshot)
    if ((rc == 77)); then
      printf '%s: skipped\n' "$t" >&2
      skipped=$((skipped + 1))
      continue
    fi
    if [[ $before != "$after" ]]; then
      printf '    FAIL: the root network namespace changed:\n%s\n' "$(diff <(echo "$before") <(echo "$after") || true)" >&2
      rc=1
    fi
    if ((rc == 0)); then
      printf '%s: ok\n' "$t" >&2
      passed=$((passed + 1))
    else
      printf '%s: FAILED\n' "$t" >&2
      failed=$((failed + 1))
    fi
  done
  printf '%s: %d passed, %d failed, %d skipped\n' "$(basename "$0" .sh)" "$passed" "$failed" "$skipped"
  ((failed == 0))
}

# skip REASON: mark the current test skipped (exit 77). In CI (CI set) a skip is a failure.
skip() {
  if [[ -n ${CI:-} ]]; then fail "would skip in CI: $*"; fi
  printf '    SKIP: %s\n' "$*" >&2
  exit 77
}
