#!/usr/bin/env bash
# containerd 1.6 with `ctr run --cni` driving the real `aliasnet` plugin.
#   bash tests/runtimes/containerd.sh [test_name]
#
# ctr has no flags for CNI paths: it loads the first conflist in /etc/cni/net.d and runs plugins
# from /opt/cni/bin:/usr/lib/cni. So containerd and ctr run in a private mount namespace
# (start_mount_ns) where those directories are scratch ones, and in a "node" netns (host veth
# ends, routes and ip_forward land there). install.sh places aliasnet with its default CNI
# paths inside that namespace. containerd's root, state and sockets are under the scratch dir.
#
# Needs: containerd (ctr), runc, busybox-static (apt; see tests/setup.sh), jq, python3, and the
# built binaries (ALIASNET_BIN_DIR).
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "$0")/lib.sh"

POD_RANGE=10.234.0.0/29

ctr_env() {
  need_bins aliasnet aliasnet-ipamd
  if ! command -v containerd >/dev/null || ! command -v ctr >/dev/null; then
    skip "containerd not installed (apt-get install containerd runc)"
  fi
  [[ -x /bin/busybox ]] || skip "busybox-static not installed"
  S=$SCRATCH
  NODE=anct-n-$RT_ID
  NS=aliasnet-rt-$RT_ID
  make_fabric "$NODE" "anct-r-$RT_ID" "anct-i-$RT_ID" "$POD_RANGE"
  start_mount_ns
  defer "ctr_teardown"

  # /etc/cni/net.d: a scratch directory bind-mounted over it, or (where it does not exist) an
  # overlay of /etc whose upper layer is scratch. Either way the host's /etc is untouched.
  mkdir -p "$S/netd"
  if [[ -d /etc/cni/net.d ]]; then
    mns mount --bind "$S/netd" /etc/cni/net.d
  else
    mkdir -p "$S/etc-upper" "$S/etc-work"
    mns mount -t overlay aliasnet-rt -o "lowerdir=/etc,upperdir=$S/etc-upper,workdir=$S/etc-work" /etc
    mns mkdir -p /etc/cni/net.d
    mns mount --bind "$S/netd" /etc/cni/net.d
  fi

  mkdir -p "$S"/{src,etc,state/spool,run,log}
  jq --arg s "$S" '.plugins[0] += {datapath: "required", bpfPinRoot: ($s + "/bpf/aliasnet"), ipamSocket: ($s + "/run/ipamd.sock"),
      spoolDir: ($s + "/state/spool"), logFile: ($s + "/log/cni.log"), logLevel: "debug"}' \
    "$REPO/install/etc/10-aliasnet.conflist" >"$S/src/10-aliasnet.conflist"
  sed -e "s|^socket = .*|socket = \"$S/run/ipamd.sock\"|" \
    -e "s|^state_dir = .*|state_dir = \"$S/state/ipam\"|" \
    -e "s|^spool_dir = .*|spool_dir = \"$S/state/spool\"|" \
    -e 's|^cooldown = .*|cooldown = "0"\ngc_grace = "0s"|' "$REPO/install/etc/ipamd.toml" >"$S/src/ipamd.toml"
  cp "$REPO/install/etc/shaper.toml" "$S/src/"
  printf '[[pool]]\nname = "pods"\nsource = "static"\ncidrs = ["%s"]\n' "$POD_RANGE" >"$S/etc/node-pools.toml"
  # Default --cni-bin-dir and --cni-conf-dir: /opt/cni/bin and /etc/cni/net.d of this namespace.
  mns "$REPO/install/install.sh" --bin-dir "$BIN_DIR" --config-src "$S/src" --config-dir "$S/etc" \
    --state-dir "$S/state" --log-dir "$S/log" 2>"$S/install.log" || fail "install.sh: $(cat "$S/install.log")"
  [[ -f $S/netd/10-aliasnet.conflist ]] || fail "install.sh did not write the conflist into /etc/cni/net.d"
  cp "$S/etc/ipamd.toml" "$S/ipamd.toml"
  start_ipamd "$NODE" "$S" "$S/run/ipamd.sock"
  SOCK=$S/run/ipamd.sock
  start_datapath "$S"

  mkdir -p "$S/containerd"
  cat >"$S/containerd.toml" <<EOF
version = 2
root = "$S/containerd/root"
state = "$S/containerd/state"
# ctr does the CNI calls itself; the CRI plugin is not needed.
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "$S/containerd/containerd.sock"
[ttrpc]
  address = "$S/containerd/containerd.sock.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "$S/containerd/opt"
EOF
  in_node containerd --config "$S/containerd.toml" --log-level info >"$S/containerd.log" 2>&1 &
  CONTAINERD_PID=$!
  defer "stop_pid $CONTAINERD_PID"
  local i
  for ((i = 0; i < 100; i++)); do
    c version >/dev/null 2>&1 && break
    kill -0 "$CONTAINERD_PID" 2>/dev/null || fail "containerd exited: $(tail -n5 "$S/containerd.log")"
    sleep 0.1
  done
  c version >/dev/null || fail "containerd did not answer"
  make_image "$S/busybox.tar"
  c images import "$S/busybox.tar" >/dev/null || fail "ctr images import failed"
}

c() { in_node ctr --address "$S/containerd/containerd.sock" -n "$NS" "$@"; }

# make_image TAR: a docker-archive of a static busybox rootfs, tagged localhost/busybox:latest
# (no registry needed).
make_image() {
  local rootfs=$S/rootfs
  mkdir -p "$rootfs"/{bin,etc,proc,sys,dev,tmp,root}
  cp /bin/busybox "$rootfs/bin/"
  chroot "$rootfs" /bin/busybox --install -s /bin
  echo 'root:x:0:0:root:/root:/bin/sh' >"$rootfs/etc/passwd"
  echo 'root:x:0:' >"$rootfs/etc/group"
  docker_archive "$rootfs" "$1" localhost/busybox:latest '["/bin/sh"]'
}

ctr_teardown() {
  local id
  for id in $(c tasks ls -q 2>/dev/null); do c tasks kill -s KILL "$id" >/dev/null 2>&1 || true; done
  sleep 0.2
  for id in $(c tasks ls -q 2>/dev/null); do c tasks rm -f "$id" >/dev/null 2>&1 || true; done
  for id in $(c containers ls -q 2>/dev/null); do c containers rm "$id" >/dev/null 2>&1 || true; done
  c images rm localhost/busybox:latest >/dev/null 2>&1 || true
  stop_pid "$CONTAINERD_PID"
  remove_cgroups "$NS"
}

ctr_ip() { c tasks exec --exec-id "ip-$RANDOM" "$1" ip -4 -o addr show eth0 | awk '{print $4}' | cut -d/ -f1; }

# gc VALID_JSON: CNI GC as libcni would send it (cniVersion 1.1.0, cni.dev/valid-attachments),
# run by hand because no runtime here sends it (runtimes.md).
gc() {
  local conf
  conf=$(jq -c --argjson v "$1" '(.plugins[0]) + {cniVersion: "1.1.0", name: .name, "cni.dev/valid-attachments": $v}' \
    "$S/netd/10-aliasnet.conflist")
  CNI_COMMAND=GC CNI_PATH=/opt/cni/bin in_node /opt/cni/bin/aliasnet <<<"$conf"
}

assert_clean() {
  local l
  l=$(leases "$SOCK")
  [[ -z $l ]] || fail "leaked leases: $l"
  for _ in $(seq 50); do [[ -z $(node_links "$NODE") ]] && break; sleep 0.1; done
  l=$(node_links "$NODE")
  [[ -z $l ]] || fail "leaked host veths: $l"
  l=$(node_pod_routes "$NODE")
  [[ -z $l ]] || fail "leaked routes: $l"
  assert_no_map_entries
}

test_ctr_run_cni_addresses_ping_and_rm_releases() {
  ctr_env
  c run -d --cni localhost/busybox:latest c1 sleep 600 >/dev/null || fail "ctr run c1: $(tail -n 20 "$S/log/cni.log")"
  c run -d --cni localhost/busybox:latest c2 sleep 600 >/dev/null || fail "ctr run c2"
  local ip1 ip2
  ip1=$(ctr_ip c1)
  ip2=$(ctr_ip c2)
  log "c1 $ip1, c2 $ip2"
  [[ -n $ip1 && -n $ip2 && $ip1 != "$ip2" ]] || fail "containers did not get distinct addresses: '$ip1' '$ip2'"
  # ctr's CNI_CONTAINERID is <namespace>-<id>.
  leases "$SOCK" | has -x "$ip1 aliasnet/$NS-c1/eth0" || fail "no lease for c1: $(leases "$SOCK")"
  leases "$SOCK" | has -x "$ip2 aliasnet/$NS-c2/eth0" || fail "no lease for c2"
  c tasks exec --exec-id p1 c1 ping -c 2 -W 2 "$ip2" >/dev/null || fail "c1 cannot ping c2"
  c tasks exec --exec-id p2 c2 ping -c 2 -W 2 203.0.113.10 >/dev/null || fail "c2 cannot ping the internet host"
  assert_eq "$(in_ns "$NODE" sysctl -n net.ipv4.ip_forward)" 1 "node ip_forward"
  attached_pods | has -x "$NS-c1 $ip1" || fail "c1 not attached to the datapath: $(attached_pods)"
  attached_pods | has -x "$NS-c2 $ip2" || fail "c2 not attached to the datapath: $(attached_pods)"

  # --rm in the foreground: ADD, then on exit DEL with CNI_NETNS empty (the task and its netns
  # are gone by then). DEL must succeed and release the address.
  # ctr runs under strace (execve with environments) to see what it really sent the plugin.
  local out del
  out=$(in_node strace -f -qq -v -s 512 -e trace=execve -o "$S/ctr.strace" \
    ctr --address "$S/containerd/containerd.sock" -n "$NS" run --rm --cni localhost/busybox:latest c3 \
    ip -4 -o addr show eth0 2>&1) || fail "ctr run --rm: $out"
  [[ $out == *inet* ]] || fail "c3 had no address: $out"
  [[ $out != *"level=error"* ]] || fail "ctr reported an error (DEL failed?): $out"
  del=$(grep 'execve("/opt/cni/bin/aliasnet"' "$S/ctr.strace" | grep '"CNI_COMMAND=DEL"' || true)
  [[ -n $del ]] || fail "ctr run --rm sent no DEL to aliasnet"
  [[ $del == *'"CNI_NETNS="'* ]] || fail "the DEL had a netns (expected CNI_NETNS empty): $del"
  grep -q "\"$NS-c3\"\|CNI_CONTAINERID=$NS-c3\"" <<<"$del" || fail "the DEL was not for c3: $del"
  if leases "$SOCK" | has "/$NS-c3/"; then fail "ctr run --rm left c3's lease: $(leases "$SOCK")"; fi
  assert_eq "$(leases "$SOCK" | wc -l)" 2 "leases after c3"
  assert_eq "$(attached_pods | wc -l)" 2 "datapath attachments after c3 (its DEL without a netns detached it)"
  log "c3 (--rm): $(awk '{print $4}' <<<"$out"), released on exit"
  c tasks kill -s KILL c1 >/dev/null
  c tasks kill -s KILL c2 >/dev/null
  sleep 0.3
  c tasks rm c1 >/dev/null 2>&1
  c tasks rm c2 >/dev/null 2>&1
  c containers rm c1 c2 >/dev/null
  # ctr never sends DEL for -d containers (runtimes.md): the leases are still there...
  assert_eq "$(leases "$SOCK" | wc -l)" 2 "leases of the removed -d containers (ctr sends no DEL)"
  # ... until GC with no valid attachments left.
  gc '[]' || fail "GC failed"
  assert_clean
}

# ctr run -d never sends DEL; GC with the still-valid attachments reclaims exactly the dead one.
test_ctr_detached_leak_reclaimed_by_gc() {
  ctr_env
  c run -d --cni localhost/busybox:latest keep sleep 600 >/dev/null || fail "ctr run keep"
  c run -d --cni localhost/busybox:latest gone sleep 600 >/dev/null || fail "ctr run gone"
  local ipk ipg
  ipk=$(ctr_ip keep)
  ipg=$(ctr_ip gone)
  c tasks kill -s KILL gone >/dev/null
  sleep 0.3
  c tasks rm gone >/dev/null 2>&1
  c containers rm gone >/dev/null
  leases "$SOCK" | has -x "$ipg aliasnet/$NS-gone/eth0" || fail "expected the leaked lease of 'gone'"
  # GC without the valid list is refused (it would release everything).
  local conf out
  conf=$(jq -c '(.plugins[0]) + {cniVersion: "1.1.0", name: .name}' "$S/netd/10-aliasnet.conflist")
  if out=$(CNI_COMMAND=GC CNI_PATH=/opt/cni/bin in_node /opt/cni/bin/aliasnet <<<"$conf"); then
    fail "GC without cni.dev/valid-attachments succeeded"
  fi
  log "GC without a valid list: $out"
  leases "$SOCK" | has "/$NS-gone/" || fail "a refused GC released something"
  gc "[{\"containerID\": \"$NS-keep\", \"ifname\": \"eth0\"}]" || fail "GC failed"
  if leases "$SOCK" | has "/$NS-gone/"; then fail "GC did not reclaim $ipg"; fi
  leases "$SOCK" | has -x "$ipk aliasnet/$NS-keep/eth0" || fail "GC released a valid attachment"
  assert_eq "$(attached_pods)" "$NS-keep $ipk" "datapath attachments after GC"
  c tasks exec --exec-id p1 keep ping -c 1 -W 2 203.0.113.10 >/dev/null || fail "the kept container lost connectivity"
  # The pool still serves new containers.
  c run -d --cni localhost/busybox:latest next sleep 600 >/dev/null || fail "ctr run next"
  log "reclaimed $ipg; next container got $(ctr_ip next)"
  for id in keep next; do
    c tasks kill -s KILL "$id" >/dev/null
  done
  sleep 0.3
  c tasks rm keep next >/dev/null 2>&1
  c containers rm keep next >/dev/null
  gc '[]' || fail "final GC failed"
  assert_clean
}

run_tests "$@"
