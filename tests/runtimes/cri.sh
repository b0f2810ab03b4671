#!/usr/bin/env bash
# containerd 1.6's CRI plugin (the kubelet's path) driving the real `aliasnet` plugin, with the
# bandwidth annotations of a pod spec, at uplink MTU 1500 and 9000.
#   bash tests/runtimes/cri.sh [test_name]
#
# What the kubelet does, done by tests/runtimes/cri_client.py over containerd's CRI socket:
# RunPodSandbox with annotations kubernetes.io/ingress-bandwidth and egress-bandwidth (containerd
# turns them into runtimeConfig.bandwidth with Go field names and also passes the annotations
# through the io.kubernetes.cri.pod-annotations capability), StopPodSandbox twice, then
# RemovePodSandbox (3 DEL chains, the later ones without netns or prevResult).
# TCP goodput through the shaper is measured with iperf3 into and out of the pods, from another
# pod and from the "internet" host, inside the pods' own network namespaces.
#
# containerd runs in a private mount namespace (start_mount_ns: the pod netns bind mounts under
# /var/run/netns, runc's state and the shims' sockets land in its tmpfs) and in a "node" netns.
# Its root, state, socket, the CNI dirs and aliasnet's state are under the scratch dir.
#
# Needs: containerd runc containernetworking-plugins (loopback) busybox-static iperf3
# python3-grpcio (apt; see tests/setup.sh), jq, bpftool, and the built binaries (ALIASNET_BIN_DIR).
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "$0")/lib.sh"

POD_RANGE=10.235.0.0/28
POD_RANGE6=fd00:235::/125
SANDBOX_IMAGE=registry.k8s.io/pause:3.6
# Debian's python3 (python3-grpcio), not whatever python3 comes first in PATH.
CRI_PY=/usr/bin/python3
IPERF_SECS=10
INGRESS=10000000 # kubernetes.io/ingress-bandwidth: 10M
EGRESS=20000000  # kubernetes.io/egress-bandwidth: 20M
INET_EGRESS=15000000 # aliasnet.io/internet-egress-bandwidth: 15M

# cri_env MTU [dual]: a node whose uplink (and the whole fabric) has MTU, aliasnet installed by
# install.sh, ipamd and the datapath up, containerd with the CRI plugin serving on $CRI_SOCK with
# the sandbox image imported. Sets S, NODE, INET, SOCK, CG. With "dual" the fabric also carries
# IPv6 and the node has an IPv6 pool (POD_RANGE6) next to the IPv4 one.
cri_env() {
  local mtu=$1 stack=${2:-ipv4}
  need_bins aliasnet aliasnet-ipamd
  [[ $(id -u) == 0 ]] || fail "needs root (network and mount namespaces)"
  local c
  for c in containerd ctr runc; do
    command -v "$c" >/dev/null || skip "$c not installed (apt-get install containerd runc)"
  done
  [[ -x /usr/lib/cni/loopback ]] || skip "the loopback CNI plugin is missing (apt-get install containernetworking-plugins)"
  [[ -x /bin/busybox ]] || skip "busybox-static not installed"
  command -v iperf3 >/dev/null || skip "iperf3 not installed"
  "$CRI_PY" -c 'import grpc' 2>/dev/null || skip "python3-grpcio not installed (apt-get install python3-grpcio)"
  # The pod-spec path only works if the shipped conflist asks the runtime for both.
  jq -e '.plugins[0].capabilities | .bandwidth == true and ."io.kubernetes.cri.pod-annotations" == true' \
    "$REPO/install/etc/10-aliasnet.conflist" >/dev/null ||
    fail "install/etc/10-aliasnet.conflist does not declare the bandwidth and io.kubernetes.cri.pod-annotations capabilities"

  S=$SCRATCH
  NODE=ancri-n-$RT_ID
  INET=ancri-i-$RT_ID
  CG=aliasnet-cri-$RT_ID
  make_fabric "$NODE" "ancri-r-$RT_ID" "$INET" "$POD_RANGE" "$mtu"
  [[ $stack == dual ]] && add_fabric_ipv6 "$NODE" "ancri-r-$RT_ID" "$INET" "$POD_RANGE6"
  start_mount_ns
  CONTAINERD_PID=
  CRI_SOCK=$S/containerd/containerd.sock
  defer "cri_teardown"

  mkdir -p "$S"/{src,cni/bin,cni/net.d,etc,state/spool,run,log,pods}
  jq --arg s "$S" '.plugins[0] += {datapath: "required", bpfPinRoot: ($s + "/bpf/aliasnet"), ipamSocket: ($s + "/run/ipamd.sock"),
      spoolDir: ($s + "/state/spool"), logFile: ($s + "/log/cni.log"), logLevel: "debug"}' \
    "$REPO/install/etc/10-aliasnet.conflist" >"$S/src/10-aliasnet.conflist"
  sed -e "s|^socket = .*|socket = \"$S/run/ipamd.sock\"|" \
    -e "s|^state_dir = .*|state_dir = \"$S/state/ipam\"|" \
    -e "s|^spool_dir = .*|spool_dir = \"$S/state/spool\"|" \
    -e 's|^cooldown = .*|cooldown = "0"|' "$REPO/install/etc/ipamd.toml" >"$S/src/ipamd.toml"
  install_policy "$S/src"
  printf '[[pool]]\nname = "pods"\nsource = "static"\ncidrs = ["%s"]\n' "$POD_RANGE" >"$S/etc/node-pools.toml"
  [[ $stack == dual ]] &&
    printf '\n[[pool]]\nname = "pods6"\nsource = "static"\ncidrs = ["%s"]\n' "$POD_RANGE6" >>"$S/etc/node-pools.toml"
  "$REPO/install/install.sh" --bin-dir "$BIN_DIR" --config-src "$S/src" --cni-bin-dir "$S/cni/bin" \
    --cni-conf-dir "$S/cni/net.d" --config-dir "$S/etc" --state-dir "$S/state" --log-dir "$S/log" 2>"$S/install.log" ||
    fail "install.sh: $(cat "$S/install.log")"
  # The CRI plugin sets up the pod's lo with the loopback plugin from the same bin_dir (every
  # kubelet node has it there).
  ln -s /usr/lib/cni/loopback "$S/cni/bin/loopback"
  cp "$S/etc/ipamd.toml" "$S/ipamd.toml"
  start_ipamd "$NODE" "$S" "$S/run/ipamd.sock"
  SOCK=$S/run/ipamd.sock
  start_datapath "$S"

  # runtimes.md: restrict_oom_score_adj because root lacks CAP_SYS_RESOURCE here; one conflist.
  mkdir -p "$S/containerd"
  cat >"$S/containerd.toml" <<EOF
version = 2
root = "$S/containerd/root"
state = "$S/containerd/state"
[grpc]
  address = "$CRI_SOCK"
[ttrpc]
  address = "$CRI_SOCK.ttrpc"
[plugins]
  [plugins."io.containerd.grpc.v1.cri"]
    sandbox_image = "$SANDBOX_IMAGE"
    restrict_oom_score_adj = true
    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = "$S/cni/bin"
      conf_dir = "$S/cni/net.d"
      max_conf_num = 1
  [plugins."io.containerd.internal.v1.opt"]
    path = "$S/containerd/opt"
EOF
  in_node containerd --config "$S/containerd.toml" --log-level info >"$S/containerd.log" 2>&1 &
  CONTAINERD_PID=$!
  local i
  for ((i = 0; i < 100; i++)); do
    cri --timeout 2 version >/dev/null 2>&1 && break
    kill -0 "$CONTAINERD_PID" 2>/dev/null || fail "containerd exited: $(tail -n5 "$S/containerd.log")"
    sleep 0.1
  done
  cri version >/dev/null || fail "containerd's CRI service did not answer: $(tail -n5 "$S/containerd.log")"

  # The sandbox ("pause") image without a registry: static busybox sleeping forever, tagged as
  # the configured sandbox_image so the CRI plugin never tries to pull.
  local rootfs=$S/pause-rootfs
  mkdir -p "$rootfs"/{bin,etc,proc,sys,dev,tmp}
  cp /bin/busybox "$rootfs/bin/"
  ln -s busybox "$rootfs/bin/sleep"
  docker_archive "$rootfs" "$S/pause.tar" "$SANDBOX_IMAGE" '["/bin/sleep","2147483647"]'
  ctr --address "$CRI_SOCK" -n k8s.io images import "$S/pause.tar" >"$S/import.log" 2>&1 ||
    fail "ctr images import: $(cat "$S/import.log")"
  # The CRI plugin learns about the image from containerd's events.
  for ((i = 0; i < 50; i++)); do
    cri imagestatus "$SANDBOX_IMAGE" | jq -e .present >/dev/null && return 0
    sleep 0.1
  done
  fail "the CRI plugin does not see $SANDBOX_IMAGE"
}

cri() { "$CRI_PY" "$RT_DIR/cri_client.py" --socket "${CRI_SOCK:?}" "$@"; }

# Runs at the end of every test (also on failure): sandboxes, containerd, what it started in
# the mount namespace (shims, sandbox processes), cgroups.
cri_teardown() {
  local id p
  for id in $(cri --timeout 5 pods 2>/dev/null | jq -r '.[].id'); do
    cri --timeout 10 stopp "$id" >/dev/null 2>&1 || true
    cri --timeout 10 rmp "$id" >/dev/null 2>&1 || true
  done
  [[ -n $CONTAINERD_PID ]] && stop_pid "$CONTAINERD_PID"
  # Shims re-parent themselves away from containerd; they are found by our mount namespace.
  local mnt
  mnt=$(readlink "/proc/$HOLDER/ns/mnt")
  for p in /proc/[0-9]*; do
    p=${p#/proc/}
    [[ $p != "$HOLDER" && $(readlink "/proc/$p/ns/mnt" 2>/dev/null) == "$mnt" ]] && kill -KILL "$p" 2>/dev/null
  done
  remove_cgroups "$CG"
}

# run_pod NAME [ANNOTATION=VALUE...]: RunPodSandbox as the kubelet sends it, for a pod of
# Kubernetes namespace demo; sets POD_ID[NAME], POD_IP[NAME], POD_IP6[NAME] (the second family's
# address, empty for an IPv4-only pod), POD_NS[NAME] (the netns path, from the verbose
# PodSandboxStatus).
declare -A POD_ID POD_IP POD_IP6 POD_NS
run_pod() { run_pod_in demo "$@"; }
# run_pod_in NAMESPACE NAME [ANNOTATION=VALUE...]: run_pod for a pod of NAMESPACE (the sandbox
# config's metadata, which the CRI plugin passes on as K8S_POD_NAMESPACE).
run_pod_in() {
  local k8s_ns=$1 name=$2 a id st
  shift 2
  local -a args=(--name "$name" --namespace "$k8s_ns" --uid "uid-$name-$RT_ID" --log-directory "$S/pods/$name"
    --cgroup-parent "/$CG" --label "io.kubernetes.pod.name=$name")
  for a in "$@"; do args+=(--annotation "$a"); done
  id=$(cri runp "${args[@]}" 2>"$S/runp.err") || fail "RunPodSandbox $name: $(cat "$S/runp.err"); plugin log: $(tail -n 5 "$S/log/cni.log")"
  st=$(cri inspectp "$id") || fail "PodSandboxStatus $name"
  POD_ID[$name]=$id
  POD_IP[$name]=$(jq -r .ip <<<"$st")
  POD_IP6[$name]=$(jq -r '.additional_ips[0] // ""' <<<"$st")
  POD_NS[$name]=$(jq -r '.info.info.runtimeSpec.linux.namespaces[] | select(.type == "network") | .path' <<<"$st")
  assert_eq "$(jq -r .state <<<"$st")" SANDBOX_READY "state of $name"
  [[ ${POD_NS[$name]} == /var/run/netns/cni-* ]] || fail "$name: unexpected netns path '${POD_NS[$name]}'"
  leases "$SOCK" | has -x "${POD_IP[$name]} aliasnet/$id/eth0" || fail "no lease for $name (${POD_IP[$name]}): $(leases "$SOCK")"
  log "$name: ${POD_IP[$name]} ${POD_IP6[$name]} ${POD_NS[$name]}"
}

# pod_mtu NAME: the MTU of the pod's eth0 (netlink: /sys shows the netns that mounted it).
pod_mtu() { in_net "${POD_NS[$1]}" ip -o link show eth0 | sed -n 's/.* mtu \([0-9]*\) .*/\1/p'; }

# iperf_cell N LABEL FROM TO DST LIMIT MODE: transfer number N, IPERF_SECS of TCP from FROM to
# an iperf3 server in TO on DST; FROM and TO are in_net targets. MODE "limit": goodput must be
# 90–105 % of LIMIT (bit/s) over the whole run, first second included, no 1-s interval without
# bytes, retransmitted segments < 1 % of those sent. MODE "unlimited": goodput must be at least
# 5x LIMIT (traffic the limit must not apply to; the sender paces at 20x LIMIT rather than
# taking both cores for 10 s). Prints one table row; returns 1 on a failed assertion (the
# caller collects them).
iperf_cell() {
  local label=$2 from=$3 to=$4 dst=$5 limit=$6 mode=$7 port=$((5300 + $1)) out=$S/iperf-$1 spid i before after
  local -a pace=()
  [[ $mode == unlimited ]] && pace=(-b $((20 * limit)))
  in_net "$to" timeout $((IPERF_SECS + 15)) iperf3 -s -1 -J -B "$dst" -p "$port" >"$out.server.json" 2>&1 &
  spid=$!
  for ((i = 0; i < 100; i++)); do
    [[ -n $(in_net "$to" ss -Hltn "sport = :$port") ]] && break
    sleep 0.05
  done
  before=$(tcp_counters "$from")
  # A transfer that stalls (its control connection too) ends 8 s after its time.
  in_net "$from" timeout $((IPERF_SECS + 8)) iperf3 -c "$dst" -p "$port" -t "$IPERF_SECS" -J "${pace[@]}" \
    --get-server-output --connect-timeout 3000 >"$out.json" 2>"$out.err" || true
  after=$(tcp_counters "$from")
  wait "$spid" 2>/dev/null || true
  "$CRI_PY" - "$out.json" "$label" "$limit" "$mode" "$before" "$after" <<'EOF'
import json, sys
path, label, limit, mode, before, after = sys.argv[1:]
limit = int(limit)
try:
    j = json.load(open(path))
except ValueError as e:
    print(f"{label}: no iperf3 report ({e}): {open(path).read()[:300]}")
    sys.exit(1)
if "error" in j:
    sent = " ".join(f"{iv['sum']['bytes'] * 8 / iv['sum']['seconds'] / 1e6:.1f}" for iv in j.get("intervals", []))
    print(f"{label}: iperf3: {j['error']} (sender per-second Mbit/s: [{sent}])  FAIL")
    sys.exit(1)
recv = j["end"]["sum_received"]
goodput = recv["bytes"] * 8 / recv["seconds"]
srv = j.get("server_output_json") or {}
ivals = [iv["sum"] for iv in srv.get("intervals", [])]
# The last interval may be a sliver after the sender stopped.
zero = sum(1 for iv in ivals if iv["seconds"] >= 0.5 and iv["bytes"] == 0)
per_s = " ".join(f"{iv['bytes'] * 8 / iv['seconds'] / 1e6:.1f}" for iv in ivals if iv["seconds"] >= 0.5)
(o0, r0), (o1, r1) = (map(int, before.split())), (map(int, after.split()))
segs, retr = o1 - o0, r1 - r0
rpct = 100.0 * retr / segs if segs else 100.0
pct = 100.0 * goodput / limit
if mode == "limit":
    ok = 90 <= pct <= 105 and zero == 0 and rpct < 1 and len(ivals) >= 9
    want = f"limit {limit / 1e6:g}M"
else:
    ok = goodput >= 5 * limit and zero == 0
    want = f">= 5x {limit / 1e6:g}M"
print(f"{label:<44} {want:<14} goodput {goodput / 1e6:8.2f} Mbit/s {pct:7.1f} %  zero-s {zero}"
      f"  retrans {retr}/{segs} {rpct:.2f} %  {'ok' if ok else 'FAIL'}  [{per_s}]")
sys.exit(0 if ok else 1)
EOF
}

# assert_clean: no sandbox, lease, host veth, pod route, datapath attachment or pod netns left.
assert_clean() {
  local l
  l=$(cri pods | jq -r '.[] | "\(.name) \(.id)"') || fail "ListPodSandbox failed"
  [[ -z $l ]] || fail "sandboxes left: $l"
  l=$(leases "$SOCK")
  [[ -z $l ]] || fail "leaked leases: $l"
  for _ in $(seq 50); do [[ -z $(node_links "$NODE") ]] && break; sleep 0.1; done
  l=$(node_links "$NODE")
  [[ -z $l ]] || fail "leaked host veths: $l"
  l=$(node_pod_routes "$NODE")
  [[ -z $l ]] || fail "leaked routes: $l"
  assert_no_map_entries
  l=$(mns ls /var/run/netns)
  [[ -z $l ]] || fail "pod netns left: $l"
}

# The user's report, at uplink MTU: pods created through the CRI with bandwidth annotations;
# TCP into and out of them from another pod and from the internet host runs at the annotated
# rate from the first second, and the internet-only egress limit leaves internal traffic alone.
cri_bandwidth() {
  local mtu=$1
  cri_env "$mtu"
  run_pod a kubernetes.io/ingress-bandwidth=10M kubernetes.io/egress-bandwidth=20M
  run_pod b kubernetes.io/ingress-bandwidth=10M kubernetes.io/egress-bandwidth=20M
  run_pod c aliasnet.io/internet-egress-bandwidth=15M
  run_pod d
  local p
  for p in a b c d; do
    assert_eq "$(pod_mtu "$p")" "$mtu" "MTU of $p's eth0 (the uplink's)"
  done
  # The limits the operator sees are the annotated ones (containerd sends them both as
  # runtimeConfig.bandwidth, with Go field names and burst 4294967295 for "unset", and as
  # pod annotations), on the pods the CRI named.
  pods_json >"$S/pods.json" || fail "aliasnetctl pods failed"
  local got
  got=$(jq -r 'sort_by(.pod)[] | "\(.pod) \(.namespace) \(.limits.ingress) \(.limits.egress)"' "$S/pods.json") ||
    fail "aliasnetctl pods --json: unexpected output"
  assert_eq "$got" "$(printf 'a demo %s %s\nb demo %s %s\nc demo null null\nd demo null null' \
    "$INGRESS" "$EGRESS" "$INGRESS" "$EGRESS")" "pods and their limits (aliasnetctl pods --json)"
  assert_eq "$(jq -r '.[] | select(.pod == "c") | .limits.internet_egress' "$S/pods.json")" "$INET_EGRESS" \
    "c's internet egress limit"

  local a=${POD_IP[a]} d=${POD_IP[d]} inet=203.0.113.10 failed=() n=0
  log "MTU $mtu: cell, limit, goodput over ${IPERF_SECS}s, zero-byte seconds, retransmits [per-second Mbit/s]"
  local -a cells=(
    "ingress pod b->a|${POD_NS[b]}|${POD_NS[a]}|$a|$INGRESS|limit"
    "ingress internet->a|$INET|${POD_NS[a]}|$a|$INGRESS|limit"
    "egress a->pod d|${POD_NS[a]}|${POD_NS[d]}|$d|$EGRESS|limit"
    "egress a->internet|${POD_NS[a]}|$INET|$inet|$EGRESS|limit"
    "internet-egress c->internet|${POD_NS[c]}|$INET|$inet|$INET_EGRESS|limit"
    "internet-egress c->pod d (internal)|${POD_NS[c]}|${POD_NS[d]}|$d|$INET_EGRESS|unlimited"
  )
  local cell label from to dst limit mode row
  for cell in "${cells[@]}"; do
    IFS='|' read -r label from to dst limit mode <<<"$cell"
    n=$((n + 1))
    if row=$(iperf_cell "$n" "mtu $mtu $label" "$from" "$to" "$dst" "$limit" "$mode"); then
      log "$row"
    else
      log "$row"
      failed+=("$label")
    fi
  done

  # Teardown as the kubelet does it: Stop (DEL with netns and prevResult), Stop again and
  # Remove (DEL without either). The first Stop already releases the address.
  for p in a b c d; do
    cri stopp "${POD_ID[$p]}" || fail "StopPodSandbox $p"
    if leases "$SOCK" | has "/${POD_ID[$p]}/"; then fail "the first StopPodSandbox of $p kept its lease"; fi
    cri stopp "${POD_ID[$p]}" || fail "second StopPodSandbox $p"
    cri rmp "${POD_ID[$p]}" || fail "RemovePodSandbox $p"
  done
  assert_clean
  ((${#failed[@]} == 0)) || fail "MTU $mtu: ${#failed[@]} cell(s) out of bounds: $(printf '%s; ' "${failed[@]}")"
}

# The shipped conflist on a dual-stack node through the CRI: the sandbox status has the IPv4
# address and the IPv6 one (additional_ips), the pods reach each other and the internet over
# IPv6, their IPv6 traffic is counted and shaped, and the kubelet's Stop, Stop, Remove release
# both families.
test_cri_dual_stack_pods() {
  cri_env 9000 dual
  run_pod a kubernetes.io/ingress-bandwidth=10M
  run_pod b
  local p a6=${POD_IP6[a]} b6=${POD_IP6[b]}
  distinct_in "$POD_RANGE6" "$a6" "$b6" ||
    fail "IPv6 addresses '$a6' '$b6' (additional_ips) not distinct addresses of $POD_RANGE6"
  leases "$SOCK" | has -x "$a6 aliasnet/${POD_ID[a]}/eth0" || fail "no IPv6 lease for a: $(leases "$SOCK")"
  in_net "${POD_NS[a]}" ping -6 -c 2 -W 2 "$b6" >/dev/null || fail "a cannot ping b over IPv6"
  in_net "${POD_NS[b]}" ping -6 -c 2 -W 2 2001:db8::10 >/dev/null || fail "b cannot ping the internet host over IPv6"
  in_net "$INET" ping -6 -c 2 -W 2 "$a6" >/dev/null || fail "the internet host cannot reach a over IPv6"
  in_net "${POD_NS[a]}" ping -c 2 -W 2 203.0.113.10 >/dev/null || fail "a cannot ping the internet host over IPv4"
  local inet
  inet=$(pods_json | jq --arg id "${POD_ID[b]}" '.[] | select(.container_id == $id) | .egress.internet.packets')
  ((inet >= 2)) || fail "b's 2 IPv6 pings to the internet host counted as $inet internet packets"
  # The annotated ingress limit shapes IPv6 TCP as it does IPv4.
  local row
  row=$(iperf_cell 1 "ipv6 ingress internet->a" "$INET" "${POD_NS[a]}" "$a6" "$INGRESS" limit) ||
    fail "IPv6 ingress limit: $row"
  log "$row"
  for p in a b; do
    cri stopp "${POD_ID[$p]}" || fail "StopPodSandbox $p"
    if leases "$SOCK" | has "/${POD_ID[$p]}/"; then fail "the first StopPodSandbox of $p kept a lease"; fi
    cri stopp "${POD_ID[$p]}" || fail "second StopPodSandbox $p"
    cri rmp "${POD_ID[$p]}" || fail "RemovePodSandbox $p"
  done
  assert_clean
}

# Downloads by destination class through the kubelet's path (issue 19), at uplink MTU: the
# policy's per-pod internet and named-class download limits, the pod annotation that may lower
# them and never raise them, a namespace's download limit shared by its pods, and internal
# traffic beside a limited download, with aliasnet-shaperd running as the DaemonSet runs it
# (it builds the namespaces' and the node's aggregates as pods come). Every download runs at
# once, for DL_SECS, from the internet host (203.0.113.10, and MIRROR_IP as the class
# "mirrors") or from an internal host beyond the uplink.
DL_SECS=4
INTERNAL_PACE=400M
DL_POLICY='internal_cidrs = ["10.0.0.0/8"]
[internet]
pod_ingress_rate = "20M"
namespace_ingress_rate = "60M"
node_ingress_rate = "120M"
[classes.mirrors]
cidrs = ["203.0.113.20/32"]
pod_ingress_rate = "10M"
[namespaces.team.internet]
pod_ingress_rate = "unlimited"
namespace_ingress_rate = "30M"'
cri_downloads() {
  local mtu=$1
  RT_POLICY=$DL_POLICY
  cri_env "$mtu"
  add_mirror "$INET"
  local peer=ancri-p-$RT_ID
  add_fabric_peer "ancri-r-$RT_ID" "$peer" "$mtu"
  start_shaperd_daemon "$S"
  run_pod_in dl cls
  run_pod_in dl greedy aliasnet.io/internet-ingress-bandwidth=1P
  run_pod_in dl modest aliasnet.io/internet-ingress-bandwidth=5M
  local p
  for p in t0 t1 t2; do run_pod_in team "$p"; done
  assert_eq "$(pod_mtu cls)" "$mtu" "MTU of cls's eth0 (the uplink's)"
  # What the plugin made of the sandbox configs and annotations, policy the ceiling.
  pods_json >"$S/pods.json" || fail "aliasnetctl pods failed"
  local got
  got=$(jq -r 'sort_by(.pod)[] | "\(.pod) \(.namespace) \(.limits.internet_ingress) \(.limits.classes.mirrors.ingress)"' "$S/pods.json")
  assert_eq "$got" "$(printf '%s\n' 'cls dl 20000000 10000000' 'greedy dl 20000000 10000000' \
    'modest dl 5000000 5000000' 't0 team null 10000000' 't1 team null 10000000' 't2 team null 10000000')" \
    "pods, namespaces and internet / mirrors download limits (aliasnetctl pods --json)"
  wait_aggregate dl 3
  wait_aggregate team 3

  local inet=203.0.113.10
  log "MTU $mtu: downloads over ${DL_SECS}s, all at once [per-second Mbit/s]"
  downloads "$S/dl" "$DL_SECS" \
    "cls-internet|${POD_NS[cls]}|$INET|$inet|" \
    "cls-mirrors|${POD_NS[cls]}|$INET|$MIRROR_IP|" \
    "greedy|${POD_NS[greedy]}|$INET|$inet|" \
    "greedy-internal|${POD_NS[greedy]}|$peer|$PEER_IP|$INTERNAL_PACE" \
    "modest|${POD_NS[modest]}|$INET|$inet|" \
    "t0|${POD_NS[t0]}|$INET|$inet|" \
    "t1|${POD_NS[t1]}|$INET|$inet|" \
    "t2|${POD_NS[t2]}|$INET|$inet|"
  check_downloads "$S/dl" \
    "limit|mtu $mtu class mirrors, pod 10M|10M|cls-mirrors" \
    "limit|mtu $mtu internet (mirrors in it), pod 20M|20M|cls-internet+cls-mirrors" \
    "limit|mtu $mtu annotation 1P, policy 20M|20M|greedy" \
    "limit|mtu $mtu annotation 5M, policy 20M|5M|modest" \
    "limit|mtu $mtu namespace team, 30M|30M|t0+t1+t2" \
    "fair|mtu $mtu namespace team's pods|t0+t1+t2" \
    "paced|mtu $mtu internal beside greedy's download|$INTERNAL_PACE|greedy-internal"
  assert_class_counters "$DL_SECS"
  for p in cls greedy modest t0 t1 t2; do
    cri stopp "${POD_ID[$p]}" || fail "StopPodSandbox $p"
    cri rmp "${POD_ID[$p]}" || fail "RemovePodSandbox $p"
  done
  assert_clean
  stop_shaperd_daemon
}

test_cri_bandwidth_mtu1500() { cri_bandwidth 1500; }
test_cri_bandwidth_mtu9000() { cri_bandwidth 9000; }
test_cri_downloads_mtu1500() { cri_downloads 1500; }
test_cri_downloads_mtu9000() { cri_downloads 9000; }

run_tests "$@"
