#!/usr/bin/env bash
# podman 4.3 with the CNI backend driving the real `aliasnet` plugin (installed by install.sh).
#   bash tests/runtimes/podman.sh [test_name]
#
# Topology: podman and aliasnet-ipamd run inside a "node" netns, so the host ends of the pod
# veths, the /32 routes and ip_forward land there, never in the root netns. The node's uplink
# goes to a router netns that routes the pod range back to the node, with an "internet" host
# (203.0.113.10) behind it. podman's storage, run and tmp dirs, its containers.conf, the CNI
# dirs and the ipamd state are all under the test's scratch directory, and podman runs in a
# private mount namespace (start_mount_ns) for the paths it does not let us move; the
# machine's podman setup is not used or changed.
#
# Needs: podman runc conmon busybox-static containernetworking-plugins (apt; see
# tests/setup.sh), jq, python3, and the built binaries (ALIASNET_BIN_DIR).
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "$0")/lib.sh"

POD_RANGE=10.233.0.0/28
POD_RANGE6=fd00:233::/125

# podman_env [dual]: a node with aliasnet installed (by install.sh) and ipamd running; sets S,
# NODE, CG (the cgroup parent of the containers) and the podman wrapper `pm`. With "dual" the
# fabric also carries IPv6 and the node has an IPv6 pool (POD_RANGE6) next to the IPv4 one.
podman_env() {
  local stack=${1:-ipv4}
  need_bins aliasnet aliasnet-ipamd
  command -v podman >/dev/null || skip "podman not installed (apt-get install podman runc conmon busybox-static)"
  [[ -x /bin/busybox ]] || skip "busybox-static not installed"
  S=$SCRATCH
  NODE=anp-n-$RT_ID
  make_fabric "$NODE" "anp-r-$RT_ID" "anp-i-$RT_ID" "$POD_RANGE"
  [[ $stack == dual ]] && add_fabric_ipv6 "$NODE" "anp-r-$RT_ID" "anp-i-$RT_ID" "$POD_RANGE6"

  # aliasnet, installed the way the DaemonSet does it, into scratch directories.
  mkdir -p "$S"/{src,cni/bin,cni/net.d,etc,state/spool,run,log}
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
  cp "$S/etc/ipamd.toml" "$S/ipamd.toml"
  start_ipamd "$NODE" "$S" "$S/run/ipamd.sock"
  SOCK=$S/run/ipamd.sock

  # runtimes.md: cgroupfs (no systemd), file events, runc (crun refuses the hybrid cgroup
  # layout), ulimits within the hard limits. conmon passes CONTAINERS_CONF on to the
  # `podman container cleanup` it runs at exit, so teardown (DEL) uses this config too.
  CG=/aliasnet-rt-$RT_ID
  cat >"$S/containers.conf" <<EOF
[containers]
netns = "bridge"
default_ulimits = ["nofile=4096:4096", "nproc=4096:4096"]
[engine]
cgroup_manager = "cgroupfs"
events_logger = "file"
events_logfile_path = "$S/podman/events.log"
runtime = "runc"
tmp_dir = "$S/podman/tmp"
volume_path = "$S/podman/volumes"
conmon_env_vars = ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "CONTAINERS_CONF=$S/containers.conf"]
[network]
network_backend = "cni"
cni_plugin_dirs = ["$S/cni/bin", "/usr/lib/cni"]
network_config_dir = "$S/cni/net.d"
default_network = "aliasnet"
EOF
  export CONTAINERS_CONF=$S/containers.conf
  start_mount_ns
  defer "podman_teardown"
  start_datapath "$S"
  # Image without a registry (runtimes.md): a static busybox.
  local rootfs=$S/rootfs
  mkdir -p "$rootfs"/{bin,etc,proc,sys,dev,tmp,root}
  cp /bin/busybox "$rootfs/bin/"
  chroot "$rootfs" /bin/busybox --install -s /bin
  echo 'root:x:0:0:root:/root:/bin/sh' >"$rootfs/etc/passwd"
  echo 'root:x:0:' >"$rootfs/etc/group"
  tar -C "$rootfs" -c . | pm import --change 'CMD ["/bin/sh"]' - localhost/busybox:latest >/dev/null 2>"$S/import.log" ||
    fail "podman import failed: $(cat "$S/import.log")"
}

pm() {
  in_node podman --root "$S/podman/root" --runroot "$S/podman/runroot" --tmpdir "$S/podman/tmp" \
    --cgroup-manager cgroupfs --events-backend file "$@"
}

# Runs at the end of every podman test (also on failure): containers and their cgroups (the
# mount namespace, with podman's mounts, goes when its holder is killed).
podman_teardown() {
  pm rm -af -t 0 >/dev/null 2>&1 || true
  pm image rm -af >/dev/null 2>&1 || true
  remove_cgroups "$CG"
}

run_ctr() {
  local name=$1
  shift
  pm run -d --name "$name" --cgroup-parent "$CG" --cap-add NET_RAW "$@" localhost/busybox sleep 600
}
ctr_ip() { pm exec "$1" ip -4 -o addr show eth0 | awk '{print $4}' | cut -d/ -f1; }
ctr_ip6() { pm exec "$1" ip -6 -o addr show eth0 scope global | awk '{print $4}' | cut -d/ -f1; }
ctr_id() { pm inspect -f '{{.Id}}' "$1"; }

# wait_no_lease CID: podman tears down asynchronously (conmon runs `podman container cleanup`).
wait_no_lease() {
  local i
  for ((i = 0; i < 100; i++)); do
    leases "$SOCK" | has "/$1/" || return 0
    sleep 0.1
  done
  fail "lease of $1 still held: $(leases "$SOCK")"
}

# assert_clean: no lease, no host veth, no pod route, no podman netns, no libcni cache entry.
assert_clean() {
  local l
  l=$(leases "$SOCK")
  [[ -z $l ]] || fail "leaked leases: $l"
  l=$(node_links "$NODE")
  [[ -z $l ]] || fail "leaked host veths: $l"
  l=$(node_pod_routes "$NODE")
  [[ -z $l ]] || fail "leaked routes: $l"
  l=$(mns ls -A /run/netns)
  [[ -z $l ]] || fail "leaked network namespaces: $l"
  l=$(mns find /var/lib/cni/results -type f 2>/dev/null || true)
  [[ -z $l ]] || fail "leaked libcni cache entries: $l"
  assert_no_map_entries
}

test_podman_two_containers_ping_each_other_and_internet() {
  podman_env
  run_ctr c1 >/dev/null || fail "podman run c1: $(tail -n 20 "$S/log/cni.log")"
  run_ctr c2 >/dev/null || fail "podman run c2"
  local ip1 ip2 id1 id2
  ip1=$(ctr_ip c1)
  ip2=$(ctr_ip c2)
  id1=$(ctr_id c1)
  id2=$(ctr_id c2)
  log "c1 $ip1, c2 $ip2"
  # Alias IPs from the node's pool, recorded by the daemon under podman's container IDs.
  distinct_in "$POD_RANGE" "$ip1" "$ip2" ||
    fail "addresses $ip1 $ip2 not distinct addresses of $POD_RANGE"
  leases "$SOCK" | has -x "$ip1 aliasnet/$id1/eth0" || fail "no lease for c1: $(leases "$SOCK")"
  leases "$SOCK" | has -x "$ip2 aliasnet/$id2/eth0" || fail "no lease for c2: $(leases "$SOCK")"
  # Pod wiring: /32 on eth0, default via the link-local gateway.
  pm exec c1 ip -4 -o addr show eth0 | has "$ip1/32" || fail "c1 eth0 is not a /32"
  pm exec c1 ip route | has '^default via 169.254.1.1' || fail "c1 has no default via 169.254.1.1"
  pm exec c1 ping -c 2 -W 2 "$ip2" >/dev/null || fail "c1 cannot ping c2"
  pm exec c2 ping -c 2 -W 2 "$ip1" >/dev/null || fail "c2 cannot ping c1"
  pm exec c1 ping -c 2 -W 2 203.0.113.10 >/dev/null || fail "c1 cannot ping the internet host"
  in_ns "anp-i-$RT_ID" ping -c 1 -W 2 "$ip2" >/dev/null || fail "the internet host cannot reach c2 (no encapsulation, routed)"
  # Both attached to the datapath under podman's container IDs, their traffic classified.
  attached_pods | has -x "$id1 $ip1" || fail "c1 not attached to the datapath: $(attached_pods)"
  attached_pods | has -x "$id2 $ip2" || fail "c2 not attached to the datapath: $(attached_pods)"
  local inet
  inet=$(pods_json | jq --arg id "$id1" '.[] | select(.container_id == $id) | .egress.internet.packets')
  ((inet >= 2)) || fail "c1's 2 pings to the internet host counted as $inet internet packets"
  log "c1: $inet egress internet packets counted"
  # Forwarding was enabled in the node netns only (the root netns is compared by the runner).
  assert_eq "$(in_ns "$NODE" sysctl -n net.ipv4.ip_forward)" 1 "node ip_forward"
  assert_eq "$(node_links "$NODE" | wc -l)" 2 "host veths in the node"

  # podman stop: the cleanup process sends DEL; the address is released.
  pm stop -t 0 c1 >/dev/null
  wait_no_lease "$id1"
  ip -n "$NODE" route show "$ip1/32" | has . && fail "route to $ip1 left after stop"
  leases "$SOCK" | has "/$id2/" || fail "stopping c1 released c2's lease"
  pm exec c2 ping -c 1 -W 2 203.0.113.10 >/dev/null || fail "c2 lost connectivity when c1 stopped"
  # podman rm -f of a running container.
  pm rm -f -t 0 c2 >/dev/null
  wait_no_lease "$id2"
  pm rm c1 >/dev/null
  for _ in $(seq 50); do [[ -z $(node_links "$NODE") ]] && break; sleep 0.1; done
  assert_clean
}

# The shipped conflist on a dual-stack node: each container gets an IPv4 and an IPv6 address
# (podman reads both from the result), reaches the other and the internet over IPv6, and stop
# and rm release both leases and both host routes.
test_podman_dual_stack_containers() {
  podman_env dual
  run_ctr c1 >/dev/null || fail "podman run c1: $(tail -n 20 "$S/log/cni.log")"
  run_ctr c2 >/dev/null || fail "podman run c2"
  local ip1 ip2 a1 a2 id1 id2
  ip1=$(ctr_ip c1)
  ip2=$(ctr_ip c2)
  a1=$(ctr_ip6 c1)
  a2=$(ctr_ip6 c2)
  id1=$(ctr_id c1)
  id2=$(ctr_id c2)
  log "c1 $ip1 $a1, c2 $ip2 $a2"
  distinct_in "$POD_RANGE6" "$a1" "$a2" ||
    fail "IPv6 addresses '$a1' '$a2' not distinct addresses of $POD_RANGE6"
  [[ -n $ip1 && -n $ip2 ]] || fail "no IPv4 address next to the IPv6 one"
  leases "$SOCK" | has -x "$a1 aliasnet/$id1/eth0" || fail "no IPv6 lease for c1: $(leases "$SOCK")"
  leases "$SOCK" | has -x "$ip1 aliasnet/$id1/eth0" || fail "no IPv4 lease for c1: $(leases "$SOCK")"
  pm inspect -f '{{.NetworkSettings.GlobalIPv6Address}}' c1 | has -x "$a1" ||
    fail "podman does not report c1's IPv6 address: $(pm inspect -f '{{json .NetworkSettings}}' c1)"
  pm exec c1 ip -6 -o addr show eth0 | has "$a1/128" || fail "c1 eth0 IPv6 is not a /128"
  pm exec c1 ip -6 route | has '^default via fe80::1' || fail "c1 has no IPv6 default via fe80::1"
  pm exec c1 ping -6 -c 2 -W 2 "$a2" >/dev/null || fail "c1 cannot ping c2 over IPv6"
  pm exec c2 ping -6 -c 2 -W 2 "$a1" >/dev/null || fail "c2 cannot ping c1 over IPv6"
  pm exec c1 ping -6 -c 2 -W 2 2001:db8::10 >/dev/null || fail "c1 cannot ping the internet host over IPv6"
  pm exec c1 ping -c 2 -W 2 203.0.113.10 >/dev/null || fail "c1 cannot ping the internet host over IPv4"
  in_ns "anp-i-$RT_ID" ping -6 -c 1 -W 2 "$a2" >/dev/null || fail "the internet host cannot reach c2 over IPv6"
  assert_eq "$(in_ns "$NODE" sysctl -n net.ipv6.conf.all.forwarding)" 1 "node IPv6 forwarding"
  # The datapath knows both addresses and counts the IPv6 internet traffic.
  attached_pods | has -x "$id1 $ip1,$a1" || fail "c1 not attached with both addresses: $(attached_pods)"
  local inet
  inet=$(pods_json | jq --arg id "$id1" '.[] | select(.container_id == $id) | .egress.internet.packets')
  ((inet >= 4)) || fail "c1's 4 pings to the internet host counted as $inet internet packets"

  pm stop -t 0 c1 >/dev/null
  wait_no_lease "$id1"
  ip -n "$NODE" -6 route show "$a1/128" | has . && fail "route to $a1 left after stop"
  pm exec c2 ping -6 -c 1 -W 2 2001:db8::10 >/dev/null || fail "c2 lost IPv6 connectivity when c1 stopped"
  pm rm -f -t 0 c2 >/dev/null
  wait_no_lease "$id2"
  pm rm c1 >/dev/null
  for _ in $(seq 50); do [[ -z $(node_links "$NODE") ]] && break; sleep 0.1; done
  assert_clean
}

# podman start again after stop: a fresh ADD, and the second teardown is clean too.
test_podman_restart_readds_and_releases() {
  podman_env
  run_ctr c1 >/dev/null || fail "podman run c1"
  local id1
  id1=$(ctr_id c1)
  pm stop -t 0 c1 >/dev/null
  wait_no_lease "$id1"
  pm start c1 >/dev/null || fail "podman start c1"
  leases "$SOCK" | has "/$id1/" || fail "no lease after start"
  pm exec c1 ping -c 1 -W 2 203.0.113.10 >/dev/null || fail "no connectivity after restart"
  pm rm -f -t 0 c1 >/dev/null
  wait_no_lease "$id1"
  for _ in $(seq 50); do [[ -z $(node_links "$NODE") ]] && break; sleep 0.1; done
  assert_clean
}

# A chain whose second plugin fails ADD: podman reports the error, runs DEL on the whole chain,
# and nothing of aliasnet's is left.
test_podman_failing_chain_leaves_nothing() {
  podman_env
  cat >"$S/cni/bin/failadd" <<'EOF'
#!/bin/sh
# A chained plugin that fails every ADD with "try again later" (code 11).
cat >/dev/null
case "$CNI_COMMAND" in
VERSION) echo '{"cniVersion":"1.0.0","supportedVersions":["0.3.0","0.3.1","0.4.0","1.0.0"]}' ;;
ADD)
  echo '{"cniVersion":"1.0.0","code":11,"msg":"induced ADD failure","details":"test"}'
  exit 1
  ;;
esac
exit 0
EOF
  chmod 755 "$S/cni/bin/failadd"
  jq '.name = "aliasnet-fail" | .plugins += [{"type": "failadd"}]' "$S/cni/net.d/10-aliasnet.conflist" \
    >"$S/cni/net.d/20-aliasnet-fail.conflist"
  local out
  if out=$(run_ctr cf --network aliasnet-fail 2>&1); then fail "podman run succeeded through a failing chain"; fi
  [[ $out == *"induced ADD failure"* ]] || fail "podman did not report the plugin's error: $out"
  log "podman: $(grep -m1 Error <<<"$out")"
  # The ADD did happen (aliasnet allocated and wired), then DEL undid it.
  grep -q 'ADD' "$S/log/cni.log" || fail "aliasnet never saw the ADD"
  pm rm -f cf >/dev/null 2>&1 || true
  for _ in $(seq 50); do [[ -z $(node_links "$NODE") && -z $(leases "$SOCK") ]] && break; sleep 0.1; done
  assert_clean
}

# Why the conflist says 1.0.0: podman 4.3 rejects a 1.1.0 result, and still cleans up.
test_podman_rejects_cni_110_results_and_cleans_up() {
  podman_env
  jq '.name = "aliasnet-v110" | .cniVersion = "1.1.0"' "$S/cni/net.d/10-aliasnet.conflist" \
    >"$S/cni/net.d/30-aliasnet-v110.conflist"
  local out
  if out=$(run_ctr cv --network aliasnet-v110 2>&1); then fail "podman 4.3 accepted a 1.1.0 result"; fi
  [[ $out == *'unsupported CNI result version "1.1.0"'* ]] || fail "unexpected podman error: $out"
  pm rm -f cv >/dev/null 2>&1 || true
  for _ in $(seq 50); do [[ -z $(node_links "$NODE") && -z $(leases "$SOCK") ]] && break; sleep 0.1; done
  assert_clean
}

# Operator mistakes surface through the runtime with a message that says what to fix, and
# leave nothing behind: a plugin type that is not installed, a cniVersion nobody speaks, the
# daemon down.
test_podman_bad_configs_give_operator_errors() {
  podman_env
  local out pid
  jq '.name = "aliasnet-typo" | .plugins[0].type = "aliasnett"' "$S/cni/net.d/10-aliasnet.conflist" \
    >"$S/cni/net.d/31-aliasnet-typo.conflist"
  if out=$(run_ctr ct --network aliasnet-typo 2>&1); then fail "podman ran a container with plugin type aliasnett"; fi
  # podman 4.3 validates the conflist first: "Error validating CNI config file <file>: [failed
  # to find plugin "aliasnett" in path [...]]", then "network not found".
  [[ $out == *'failed to find plugin \"aliasnett\"'* && $out == *"$S/cni/bin"* ]] ||
    fail "the error does not name the missing plugin and where it was looked for: $out"
  log "wrong type: $(grep -o 'failed to find plugin.*' <<<"$out" | head -n1)"
  pm rm -f ct >/dev/null 2>&1 || true

  jq '.name = "aliasnet-v9" | .cniVersion = "9.9.9"' "$S/cni/net.d/10-aliasnet.conflist" \
    >"$S/cni/net.d/32-aliasnet-v9.conflist"
  if out=$(run_ctr cv --network aliasnet-v9 2>&1); then fail "podman ran a container on a cniVersion 9.9.9 network"; fi
  [[ $out == *9.9.9* ]] || fail "the error does not name the version: $out"
  log "unsupported version: $(grep -m1 -o 'msg=.*9\.9\.9.*' <<<"$out" || echo "$out")"
  pm rm -f cv >/dev/null 2>&1 || true

  pid=$(cat "$S/ipamd.pid")
  stop_pid "$pid"
  if out=$(run_ctr cd 2>&1); then fail "podman ran a container with aliasnet-ipamd down"; fi
  [[ $out == *"aliasnet-ipamd is not reachable at $SOCK"* && $out == *"is aliasnet-ipamd running on this node"* ]] ||
    fail "the error does not say the daemon is down and where: $out"
  log "daemon down: ${out##*Error: }"
  pm rm -f cd >/dev/null 2>&1 || true
  # The DEL podman sent while the daemon was down was spooled; the daemon applies it on start.
  start_ipamd "$NODE" "$S" "$SOCK"
  for _ in $(seq 50); do [[ -z $(node_links "$NODE") && -z $(leases "$SOCK") ]] && break; sleep 0.1; done
  assert_clean
}

# ctr_netns NAME: the container's netns path (a bind mount in podman's mount namespace).
ctr_netns() { pm inspect -f '{{.NetworkSettings.SandboxKey}}' "$1"; }

# Downloads by destination class through podman (issue 19), at the fabric's MTU, with
# aliasnet-shaperd running as the DaemonSet runs it. podman sends the plugin no annotations
# and no Kubernetes namespace (CNI_ARGS has K8S_POD_NAME only), so its containers get the
# policy's defaults and share the namespace "" aggregate: first the per-pod internet and
# named-class download limits (a podman --annotation asking for more changes nothing) with an
# internal download beside a limited one, then, after a policy reload that sets a namespace
# download limit, three containers sharing it. Downloads run at once for DL_SECS, from the
# internet host (203.0.113.10, and MIRROR_IP as the class "mirrors") or from an internal host
# beyond the uplink.
DL_SECS=4
INTERNAL_PACE=400M
# dl_policy [LINE]: the policy, LINE added to its [internet] table.
dl_policy() {
  printf '%s\n' 'internal_cidrs = ["10.0.0.0/8"]' '[internet]' 'pod_ingress_rate = "20M"' \
    'node_ingress_rate = "120M"' ${1:+"$1"} '[classes.mirrors]' 'cidrs = ["203.0.113.20/32"]' \
    'pod_ingress_rate = "10M"'
}
test_podman_downloads() {
  RT_POLICY=$(dl_policy)
  podman_env
  local inet_ns=anp-i-$RT_ID peer=anp-p-$RT_ID mtu=${ALIASNET_TEST_MTU:-9000} c
  add_mirror "$inet_ns"
  add_fabric_peer "anp-r-$RT_ID" "$peer" "$mtu"
  start_shaperd_daemon "$S"
  run_ctr cls >/dev/null || fail "podman run cls: $(tail -n 20 "$S/log/cni.log")"
  run_ctr lim --annotation aliasnet.io/internet-ingress-bandwidth=1P >/dev/null || fail "podman run lim"
  for c in t0 t1 t2; do run_ctr "$c" >/dev/null || fail "podman run $c"; done
  declare -A NS
  for c in cls lim t0 t1 t2; do NS[$c]=$(ctr_netns "$c"); done
  assert_eq "$(pm exec cls cat /sys/class/net/eth0/mtu)" "$mtu" "MTU of cls's eth0 (the uplink's)"
  pods_json >"$S/pods.json" || fail "aliasnetctl pods failed"
  local got
  got=$(jq -r 'sort_by(.pod)[] | "\(.pod) [\(.namespace)] \(.limits.internet_ingress) \(.limits.classes.mirrors.ingress)"' "$S/pods.json")
  assert_eq "$got" "$(printf '%s\n' 'cls [] 20000000 10000000' 'lim [] 20000000 10000000' \
    't0 [] 20000000 10000000' 't1 [] 20000000 10000000' 't2 [] 20000000 10000000')" \
    "containers, their (empty) namespace and download limits (aliasnetctl pods --json)"

  local inet=203.0.113.10
  log "MTU $mtu: downloads over ${DL_SECS}s, all at once [per-second Mbit/s]"
  downloads "$S/dl" "$DL_SECS" \
    "cls-internet|${NS[cls]}|$inet_ns|$inet|" \
    "cls-mirrors|${NS[cls]}|$inet_ns|$MIRROR_IP|" \
    "lim|${NS[lim]}|$inet_ns|$inet|" \
    "lim-internal|${NS[lim]}|$peer|$PEER_IP|$INTERNAL_PACE"
  check_downloads "$S/dl" \
    "limit|mtu $mtu class mirrors, pod 10M|10M|cls-mirrors" \
    "limit|mtu $mtu internet (mirrors in it), pod 20M|20M|cls-internet+cls-mirrors" \
    "limit|mtu $mtu --annotation 1P, policy 20M|20M|lim" \
    "paced|mtu $mtu internal beside lim's download|$INTERNAL_PACE|lim-internal"
  assert_class_counters "$DL_SECS"

  # A namespace limit: every container is in the namespace "".
  set_policy "$S" "$(dl_policy 'namespace_ingress_rate = "30M"')"
  wait_aggregate "" 5
  downloads "$S/ns" "$DL_SECS" \
    "t0|${NS[t0]}|$inet_ns|$inet|" \
    "t1|${NS[t1]}|$inet_ns|$inet|" \
    "t2|${NS[t2]}|$inet_ns|$inet|"
  check_downloads "$S/ns" \
    "limit|mtu $mtu namespace \"\", 30M|30M|t0+t1+t2" \
    "fair|mtu $mtu namespace \"\"'s containers|t0+t1+t2"
  pm rm -f -t 0 cls lim t0 t1 t2 >/dev/null
  for _ in $(seq 50); do [[ -z $(node_links "$NODE") && -z $(leases "$SOCK") ]] && break; sleep 0.1; done
  assert_clean
  stop_shaperd_daemon
}

run_tests "$@"
