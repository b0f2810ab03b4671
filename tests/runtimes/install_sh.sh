#!/usr/bin/env bash
# install/install.sh and install/ready.sh, against a scratch root (every directory is
# overridden): fresh install, idempotence, the conflist written last, atomic replacement,
# uninstall order with a running pod left intact, dry run, bad input, the readiness probe.
#   bash tests/runtimes/install_sh.sh [test_name]
# Needs root (a node netns with a pod for the uninstall and probe tests), jq, inotify-tools,
# strace, shellcheck, and the built binaries (ALIASNET_BIN_DIR, default target/release).
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "$0")/lib.sh"

INSTALL=$REPO/install/install.sh
READY=$REPO/install/ready.sh

# scratch_root: $R is a fake node root, $SRC the config sources rewritten to point into it.
scratch_root() {
  R=$SCRATCH/root
  SRC=$SCRATCH/src
  mkdir -p "$R"/{opt/cni/bin,etc/cni/net.d,etc/aliasnet,var/lib/aliasnet/spool,var/log/aliasnet,run/aliasnet} "$SRC"
  jq --arg r "$R" '.plugins[0] += {datapath: "off", ipamSocket: ($r + "/run/aliasnet/ipamd.sock"),
      spoolDir: ($r + "/var/lib/aliasnet/spool"), logFile: ($r + "/var/log/aliasnet/cni.log"),
      logLevel: "debug"}' "$REPO/install/etc/10-aliasnet.conflist" >"$SRC/10-aliasnet.conflist"
  sed -e "s|\"/run/aliasnet/|\"$R/run/aliasnet/|; s|\"/var/lib/aliasnet/|\"$R/var/lib/aliasnet/|g" \
    -e 's|^cooldown = .*|cooldown = "0"|' \
    "$REPO/install/etc/ipamd.toml" >"$SRC/ipamd.toml"
  cp "$REPO/install/etc/shaper.toml" "$SRC/shaper.toml"
  # What node provisioning would write: this node's alias range.
  printf '[[pool]]\nname = "secondary"\nsource = "static"\ncidrs = ["10.231.0.0/29"]\n' \
    >"$R/etc/aliasnet/node-pools.toml"
}

inst() {
  "$INSTALL" --bin-dir "$BIN_DIR" --cni-bin-dir "$R/opt/cni/bin" --cni-conf-dir "$R/etc/cni/net.d" \
    --config-dir "$R/etc/aliasnet" --state-dir "$R/var/lib/aliasnet" --log-dir "$R/var/log/aliasnet" \
    --config-src "$SRC" "$@"
}

# tree_state DIR: every path with type, mode, size, inode and content hash.
tree_state() {
  find "$1" -printf '%y %m %s %i %p\n' | sort -k5
  find "$1" -type f -exec sha256sum {} + | sort -k2
}

test_fresh_install() {
  need_bins aliasnet aliasnet-ipamd
  scratch_root
  inst 2>"$SCRATCH/out" || fail "install failed: $(cat "$SCRATCH/out")"
  cmp -s "$BIN_DIR/aliasnet" "$R/opt/cni/bin/aliasnet" || fail "plugin not copied"
  assert_eq "$(stat -c %a "$R/opt/cni/bin/aliasnet")" 755 "plugin mode"
  cmp -s "$SRC/10-aliasnet.conflist" "$R/etc/cni/net.d/10-aliasnet.conflist" || fail "conflist not copied"
  assert_eq "$(stat -c %a "$R/etc/cni/net.d/10-aliasnet.conflist")" 644 "conflist mode"
  cmp -s "$SRC/shaper.toml" "$R/etc/aliasnet/shaper.toml" || fail "shaper.toml not copied"
  # ipamd.toml = the cluster-wide source + this node's pools, and the daemon accepts it.
  grep -q '^socket = ' "$R/etc/aliasnet/ipamd.toml" || fail "ipamd.toml lacks the source's keys"
  grep -q '10.231.0.0/29' "$R/etc/aliasnet/ipamd.toml" || fail "ipamd.toml lacks node-pools.toml"
  "$BIN_DIR/aliasnet-ipamd" check-config --config "$R/etc/aliasnet/ipamd.toml" >/dev/null ||
    fail "installed ipamd.toml is invalid"
  # No temporary file left behind.
  [[ -z $(find "$R" -name '.*.tmp.*') ]] || fail "temporary files left: $(find "$R" -name '.*.tmp.*')"
  # The conflist the runtimes will load requests the capabilities and a podman-safe version.
  assert_eq "$(jq -r .cniVersion "$R/etc/cni/net.d/10-aliasnet.conflist")" 1.0.0 "cniVersion"
  assert_eq "$(jq -c '.plugins[0].capabilities' "$R/etc/cni/net.d/10-aliasnet.conflist")" \
    '{"bandwidth":true,"io.kubernetes.cri.pod-annotations":true}' "capabilities"
}

test_reinstall_is_idempotent() {
  need_bins aliasnet aliasnet-ipamd
  scratch_root
  inst 2>/dev/null
  local before after
  before=$(tree_state "$R")
  inst 2>"$SCRATCH/out" || fail "re-install failed: $(cat "$SCRATCH/out")"
  after=$(tree_state "$R")
  [[ $before == "$after" ]] || fail "a re-install changed files: $(diff <(echo "$before") <(echo "$after"))"
  grep -q "unchanged $R/opt/cni/bin/aliasnet" "$SCRATCH/out" || fail "plugin not reported unchanged"
  grep -q "unchanged $R/etc/cni/net.d/10-aliasnet.conflist" "$SCRATCH/out" || fail "conflist not reported unchanged"
  # An operator's edit of an installed config survives a re-install; --force replaces it.
  echo '# local edit' >>"$R/etc/aliasnet/shaper.toml"
  inst 2>/dev/null
  grep -q '# local edit' "$R/etc/aliasnet/shaper.toml" || fail "re-install without --force overwrote shaper.toml"
  inst --force 2>/dev/null
  cmp -s "$SRC/shaper.toml" "$R/etc/aliasnet/shaper.toml" || fail "--force did not restore shaper.toml"
  # A new plugin build replaces the old one.
  cp "$BIN_DIR/aliasnet" "$SCRATCH/aliasnet-v2"
  printf 'v2' >>"$SCRATCH/aliasnet-v2"
  mkdir "$SCRATCH/bin2"
  cp "$SCRATCH/aliasnet-v2" "$SCRATCH/bin2/aliasnet"
  cp "$BIN_DIR/aliasnet-ipamd" "$SCRATCH/bin2/"
  BIN_DIR=$SCRATCH/bin2 inst 2>/dev/null
  cmp -s "$SCRATCH/aliasnet-v2" "$R/opt/cni/bin/aliasnet" || fail "upgrade did not replace the plugin"
}

# The order of completed writes, watched from outside with inotify: every file must appear by
# a rename (MOVED_TO), and the conflist must be the last one.
test_conflist_is_written_last() {
  need_bins aliasnet aliasnet-ipamd
  scratch_root
  # Remove node-pools.toml from the watch's view of "writes we expect": it pre-exists.
  inotifywait -q -m -r -e close_write,moved_to,create --format '%e %w%f' "$R" >"$SCRATCH/events" 2>"$SCRATCH/inotify.err" &
  local ipid=$!
  defer "kill $ipid"
  for _ in $(seq 50); do grep -q 'Watches established' "$SCRATCH/inotify.err" 2>/dev/null && break; sleep 0.05; done
  sleep 0.2
  inst 2>/dev/null
  sleep 0.3
  kill "$ipid"
  wait "$ipid" 2>/dev/null || true
  local finals
  finals=$(awk '$1 ~ /MOVED_TO/ {print $2}' "$SCRATCH/events")
  log "renames in order: $(echo "$finals" | xargs -n1 basename | tr '\n' ' ')"
  assert_eq "$(echo "$finals" | tail -n1)" "$R/etc/cni/net.d/10-aliasnet.conflist" "last rename"
  [[ $(echo "$finals" | head -n1) == "$R/opt/cni/bin/aliasnet" ]] || fail "the plugin is not the first file placed"
  # The final names are never created or written in place, only renamed onto.
  local f
  for f in "$R/opt/cni/bin/aliasnet" "$R/etc/cni/net.d/10-aliasnet.conflist" "$R/etc/aliasnet/ipamd.toml" "$R/etc/aliasnet/shaper.toml"; do
    grep -q "^MOVED_TO $f\$" "$SCRATCH/events" || fail "$f was not placed by a rename"
    if grep -Eq "^(CREATE|CLOSE_WRITE,CLOSE) $f\$" "$SCRATCH/events"; then fail "$f was written in place"; fi
  done
}

# A reader checks the installed plugin's hash and execs it while install.sh replaces it over
# and over: it must only ever see one of the two complete versions, and exec must never fail
# (ETXTBSY would mean the running file was written in place).
test_atomic_binary_replacement() {
  need_bins aliasnet aliasnet-ipamd
  scratch_root
  mkdir -p "$SCRATCH/a" "$SCRATCH/b"
  # Large enough that a non-atomic copy would be visible half-written.
  cp "$BIN_DIR/aliasnet" "$SCRATCH/a/aliasnet"
  cp "$BIN_DIR/aliasnet" "$SCRATCH/b/aliasnet"
  head -c 8M /dev/urandom >>"$SCRATCH/b/aliasnet"
  cp "$BIN_DIR/aliasnet-ipamd" "$SCRATCH/a/"
  cp "$BIN_DIR/aliasnet-ipamd" "$SCRATCH/b/"
  local ha hb
  ha=$(sha256sum <"$SCRATCH/a/aliasnet" | cut -d' ' -f1)
  hb=$(sha256sum <"$SCRATCH/b/aliasnet" | cut -d' ' -f1)
  BIN_DIR=$SCRATCH/a inst 2>/dev/null
  (
    n=0
    while [[ ! -e $SCRATCH/stop ]]; do
      h=$(sha256sum <"$R/opt/cni/bin/aliasnet" | cut -d' ' -f1)
      if [[ $h != "$ha" && $h != "$hb" ]]; then
        echo "partial file seen (sha $h)" >"$SCRATCH/reader.err"
        exit 1
      fi
      if ! out=$(CNI_COMMAND=VERSION "$R/opt/cni/bin/aliasnet" </dev/null 2>&1); then
        echo "exec failed: $out" >"$SCRATCH/reader.err"
        exit 1
      fi
      n=$((n + 1))
    done
    echo "$n" >"$SCRATCH/reads"
  ) &
  local rpid=$! i
  for i in $(seq 20); do
    if ((i % 2)); then BIN_DIR=$SCRATCH/b inst 2>/dev/null; else BIN_DIR=$SCRATCH/a inst 2>/dev/null; fi
  done
  touch "$SCRATCH/stop"
  wait "$rpid" || fail "reader: $(cat "$SCRATCH/reader.err")"
  log "reader checked the plugin $(cat "$SCRATCH/reads") times across 20 replacements"
  (($(cat "$SCRATCH/reads") >= 20)) || fail "the reader ran too few times to mean anything"
  # And the syscalls: the final path is only ever the target of a rename, never opened for writing.
  BIN_DIR=$SCRATCH/b strace -f -qq -e trace=openat,open,creat,rename,renameat,renameat2 -o "$SCRATCH/strace" \
    "$INSTALL" --bin-dir "$SCRATCH/b" --cni-bin-dir "$R/opt/cni/bin" --cni-conf-dir "$R/etc/cni/net.d" \
    --config-dir "$R/etc/aliasnet" --config-src "$SRC" 2>/dev/null
  grep -E "rename(at2?)?\(.*\"$R/opt/cni/bin/aliasnet\"" "$SCRATCH/strace" >/dev/null ||
    fail "no rename onto the plugin path in the strace"
  if grep -E "open(at)?\(.*\"$R/opt/cni/bin/aliasnet\".*O_(WRONLY|RDWR)" "$SCRATCH/strace"; then
    fail "the plugin path was opened for writing"
  fi
}

# pod_up NODE POD CID CONF: ADD through the installed plugin; prints the result.
cni_call() {
  local cmd=$1 node=$2 pod=$3 cid=$4 conf=$5 plugin=${6:-$R/opt/cni/bin/aliasnet}
  local netns=
  [[ -n $pod ]] && netns=/run/netns/$pod
  CNI_COMMAND=$cmd CNI_CONTAINERID=$cid CNI_NETNS=$netns CNI_IFNAME=eth0 CNI_PATH=$R/opt/cni/bin \
    in_ns "$node" "$plugin" <<<"$conf"
}
plugin_conf() { jq -c '(.plugins[0]) + {cniVersion: .cniVersion, name: .name}' "$1"; }

test_uninstall_order_leaves_pods_intact() {
  need_bins aliasnet aliasnet-ipamd
  scratch_root
  inst 2>/dev/null
  local node=anu-n-$RT_ID pod=anu-p-$RT_ID conf ip veth
  new_netns "$node"
  new_netns "$pod"
  # A veth pair with both ends in the node stands in for the uplink (kernels built without the
  # dummy driver have no dummy link).
  ip -n "$node" link add eth0 type veth peer name uplink-peer
  ip -n "$node" link set uplink-peer up
  ip -n "$node" addr add 198.51.100.2/24 dev eth0
  ip -n "$node" link set eth0 up
  ip -n "$node" route add default via 198.51.100.1
  # The daemon as the DaemonSet runs it: from the installed config, in the node's netns.
  cp "$R/etc/aliasnet/ipamd.toml" "$SCRATCH/ipamd.toml"
  start_ipamd "$node" "$SCRATCH" "$R/run/aliasnet/ipamd.sock"
  conf=$(plugin_conf "$R/etc/cni/net.d/10-aliasnet.conflist")
  # Released by hand at the end with a copy of the plugin (the installed one is uninstalled).
  cp "$BIN_DIR/aliasnet" "$SCRATCH/aliasnet"
  defer "CNI_COMMAND=DEL CNI_CONTAINERID=cid-u CNI_NETNS= CNI_IFNAME=eth0 CNI_PATH=/ nsenter --net=/run/netns/$node $SCRATCH/aliasnet <<<'$conf'"
  cni_call ADD "$node" "$pod" cid-u "$conf" >"$SCRATCH/add.json" || fail "ADD failed: $(cat "$SCRATCH/add.json")"
  ip=$(jq -r '.ips[0].address' "$SCRATCH/add.json" | cut -d/ -f1)
  veth=$(jq -r '.interfaces[] | select(.sandbox == null) | .name' "$SCRATCH/add.json")
  log "pod $ip, host veth $veth"
  in_ns "$node" ping -c1 -W2 "$ip" >/dev/null || fail "pod unreachable before uninstall"

  inotifywait -q -m -r -e delete --format '%e %w%f' "$R" >"$SCRATCH/events" 2>"$SCRATCH/inotify.err" &
  local ipid=$!
  defer "kill $ipid"
  for _ in $(seq 50); do grep -q 'Watches established' "$SCRATCH/inotify.err" 2>/dev/null && break; sleep 0.05; done
  sleep 0.2
  inst --uninstall 2>"$SCRATCH/out" || fail "uninstall failed: $(cat "$SCRATCH/out")"
  sleep 0.3
  kill "$ipid"
  wait "$ipid" 2>/dev/null || true
  local order
  order=$(awk '$1 == "DELETE" {print $2}' "$SCRATCH/events" | xargs -n1 basename | tr '\n' ' ')
  log "removed in order: $order"
  assert_eq "$order" "10-aliasnet.conflist aliasnet ipamd.toml shaper.toml " "uninstall order"
  [[ ! -e $R/etc/cni/net.d/10-aliasnet.conflist && ! -e $R/opt/cni/bin/aliasnet ]] || fail "files left"
  # node-pools.toml (provisioning's) and the daemon state are kept without --purge.
  [[ -f $R/etc/aliasnet/node-pools.toml ]] || fail "uninstall removed node-pools.toml"
  [[ -d $R/var/lib/aliasnet ]] || fail "uninstall removed the state directory"
  # The running pod is untouched: veth, route, address, connectivity, lease.
  ip -n "$node" link show "$veth" >/dev/null 2>&1 || fail "host veth $veth was removed"
  ip -n "$node" route show "$ip/32" | has "$veth" || fail "route to $ip was removed"
  ip -n "$pod" -4 addr show eth0 | has "$ip" || fail "pod address was removed"
  in_ns "$node" ping -c1 -W2 "$ip" >/dev/null || fail "pod unreachable after uninstall"
  leases "$R/run/aliasnet/ipamd.sock" | has "^$ip " || fail "lease of $ip lost"
  # A second uninstall is a no-op; --purge then removes state, logs and configs.
  inst --uninstall 2>/dev/null || fail "repeated uninstall failed"
  inst --uninstall --purge 2>/dev/null || fail "purge failed"
  [[ ! -e $R/var/lib/aliasnet && ! -e $R/etc/aliasnet && ! -e $R/var/log/aliasnet ]] || fail "--purge left state"
  ip -n "$node" link show "$veth" >/dev/null 2>&1 || fail "--purge removed the host veth"
}

# The DaemonSet rollout on one node: the old daemon stops, the new init container installs a
# newer build, the new daemon starts on the same state. A pod wired before keeps its address,
# veth, route and connectivity, and the new plugin releases it.
# pod_view NODE PINS SOCK: the one attached pod's ingress packets (all classes) and limits, as
# `aliasnetctl pods` reads them from the pinned maps.
pod_view() {
  in_ns "$1" "$BIN_DIR/aliasnetctl" pods --pin-root "$2" --socket "$3" --json |
    jq -c '.[0] | {ingress: ([.ingress[].packets] | add), limits: .limits}'
}

# An upgrade (new plugin installed, ipamd and shaperd restarted from the new build) while a
# shaped pod runs: no lost packet, the lease kept, the datapath counters continue (not reset),
# the pod's limits and its qdisc stay, and the new plugin CHECKs and DELs the pod.
test_upgrade_while_a_pod_runs() {
  need_bins aliasnet aliasnet-ipamd aliasnet-shaperd aliasnetctl
  scratch_root
  inst 2>/dev/null
  local node=anup-n-$RT_ID pod=anup-p-$RT_ID conf ip veth pid spid pins=$SCRATCH/bpf/aliasnet
  new_netns "$node"
  new_netns "$pod"
  ip -n "$node" link add eth0 type veth peer name uplink-peer
  ip -n "$node" link set uplink-peer up
  ip -n "$node" link set eth0 up
  ip -n "$node" addr add 198.51.100.2/24 dev eth0
  ip -n "$node" route add default via 198.51.100.1
  # The datapath in a private bpffs instance, shaperd running from the old build.
  mkdir "$SCRATCH/bpf"
  mount -t bpf bpf "$SCRATCH/bpf"
  defer "umount $SCRATCH/bpf"
  # start_shaperd BIN_DIR LOG: shaperd from BIN_DIR, until it says it is running.
  start_shaperd() {
    in_ns "$node" "$1/aliasnet-shaperd" --config "$R/etc/aliasnet/shaper.toml" --pin-root "$pins" \
      --metrics-address off >"$2" 2>&1 &
    spid=$!
    defer "stop_pid $spid"
    for _ in $(seq 200); do grep -q "running; SIGHUP" "$2" && return 0; sleep 0.05; done
    fail "shaperd ($1) did not start: $(tail -n5 "$2")"
  }
  start_shaperd "$BIN_DIR" "$SCRATCH/shaperd-old.log"
  cp "$R/etc/aliasnet/ipamd.toml" "$SCRATCH/ipamd.toml"
  start_ipamd "$node" "$SCRATCH" "$R/run/aliasnet/ipamd.sock"
  pid=$(cat "$SCRATCH/ipamd.pid")
  # kubelet's bandwidth capability, as containerd sends it (burst "unset" = 4294967295).
  conf=$(plugin_conf "$R/etc/cni/net.d/10-aliasnet.conflist" | jq -c --arg p "$pins" '. + {datapath: "required",
    bpfPinRoot: $p, runtimeConfig: {bandwidth: {ingressRate: 50000000, ingressBurst: 4294967295,
    egressRate: 50000000, egressBurst: 4294967295}}}')
  defer "CNI_COMMAND=DEL CNI_CONTAINERID=cid-up CNI_NETNS= CNI_IFNAME=eth0 CNI_PATH=/ nsenter --net=/run/netns/$node $BIN_DIR/aliasnet <<<'$conf'"
  cni_call ADD "$node" "$pod" cid-up "$conf" >"$SCRATCH/add.json" || fail "ADD failed: $(cat "$SCRATCH/add.json")"
  ip=$(jq -r '.ips[0].address' "$SCRATCH/add.json" | cut -d/ -f1)
  veth=$(jq -r '.interfaces[] | select(.sandbox == null) | .name' "$SCRATCH/add.json")
  local before after limits
  before=$(pod_view "$node" "$pins" "$R/run/aliasnet/ipamd.sock") || fail "aliasnetctl pods failed"
  limits=$(jq -c .limits <<<"$before")
  [[ $(jq .ingress <<<"$limits") == 50000000 ]] || fail "the pod's limits are not in the maps: $before"
  # Traffic keeps flowing through the whole upgrade (10 s of pings; the upgrade takes 1-2 s, more on a loaded machine).
  in_ns "$node" ping -i 0.05 -c 200 "$ip" >"$SCRATCH/ping.out" 2>&1 &
  local ping=$! t0=$SECONDS
  defer "kill $ping"
  sleep 0.5
  stop_pid "$pid"
  stop_pid "$spid"
  mkdir "$SCRATCH/v2"
  cp "$BIN_DIR/aliasnet" "$BIN_DIR/aliasnet-ipamd" "$BIN_DIR/aliasnet-shaperd" "$SCRATCH/v2/"
  printf 'v2' >>"$SCRATCH/v2/aliasnet"
  printf 'v2' >>"$SCRATCH/v2/aliasnet-shaperd"
  BIN_DIR=$SCRATCH/v2 inst --force 2>"$SCRATCH/out" || fail "upgrade install failed: $(cat "$SCRATCH/out")"
  cmp -s "$SCRATCH/v2/aliasnet" "$R/opt/cni/bin/aliasnet" || fail "the new plugin is not installed"
  start_ipamd "$node" "$SCRATCH" "$R/run/aliasnet/ipamd.sock"
  start_shaperd "$SCRATCH/v2" "$SCRATCH/shaperd-new.log"
  ((SECONDS - t0 < 9)) || fail "the upgrade took longer than the ping window"
  wait "$ping" || true
  grep -q ' 0% packet loss' "$SCRATCH/ping.out" || fail "traffic to the pod was interrupted: $(tail -n2 "$SCRATCH/ping.out")"
  log "during the upgrade: $(grep 'packet loss' "$SCRATCH/ping.out")"
  leases "$R/run/aliasnet/ipamd.sock" | has "^$ip aliasnet/cid-up/eth0$" || fail "the new daemon lost the lease of $ip"
  ip -n "$node" link show "$veth" >/dev/null 2>&1 || fail "host veth gone"
  # Counters continue: the 200 echo requests to the pod are all counted across the restart.
  after=$(pod_view "$node" "$pins" "$R/run/aliasnet/ipamd.sock") || fail "aliasnetctl pods failed after the upgrade"
  (($(jq .ingress <<<"$after") >= $(jq .ingress <<<"$before") + 200)) ||
    fail "counters were reset or lost packets: before $before, after $after"
  assert_eq "$(jq -c .limits <<<"$after")" "$limits" "the pod's limits after the upgrade"
  tc -n "$node" class show dev "$veth" | has 'rate 50Mbit' ||
    fail "the pod's shaping class is gone: $(tc -n "$node" class show dev "$veth")"
  log "ingress packets $(jq .ingress <<<"$before") -> $(jq .ingress <<<"$after"); limits $limits kept"
  # The new plugin sees the pod (CHECK needs 0.4.0+) and releases it.
  cni_call CHECK "$node" "$pod" cid-up "$(jq -c --slurpfile r "$SCRATCH/add.json" '. + {prevResult: $r[0]}' <<<"$conf")" ||
    fail "CHECK with the new plugin failed"
  cni_call DEL "$node" "$pod" cid-up "$conf" || fail "DEL with the new plugin failed"
  [[ -z $(leases "$R/run/aliasnet/ipamd.sock") ]] || fail "lease left after DEL"
  for _ in $(seq 50); do ip -n "$node" link show "$veth" >/dev/null 2>&1 || break; sleep 0.1; done
  if ip -n "$node" link show "$veth" >/dev/null 2>&1; then fail "host veth left after DEL"; fi
  [[ $(in_ns "$node" "$BIN_DIR/aliasnetctl" pods --pin-root "$pins" --socket "$R/run/aliasnet/ipamd.sock" --json) == "[]" ]] ||
    fail "datapath entries left after DEL"
}

test_dry_run_changes_nothing() {
  need_bins aliasnet aliasnet-ipamd
  scratch_root
  local before
  before=$(tree_state "$R")
  inst --dry-run 2>"$SCRATCH/out" || fail "dry-run install failed: $(cat "$SCRATCH/out")"
  [[ $before == "$(tree_state "$R")" ]] || fail "dry-run install changed files"
  grep -q "would install $R/opt/cni/bin/aliasnet" "$SCRATCH/out" || fail "dry run did not say what it would do"
  inst 2>/dev/null
  before=$(tree_state "$R")
  inst --uninstall --purge --dry-run 2>"$SCRATCH/out" || fail "dry-run uninstall failed"
  [[ $before == "$(tree_state "$R")" ]] || fail "dry-run uninstall changed files"
  grep -q "would remove $R/etc/cni/net.d/10-aliasnet.conflist" "$SCRATCH/out" || fail "dry run did not list the conflist"
}

# expect_refused WHAT MESSAGE_REGEX ARGS...: install.sh must fail, say MESSAGE, change nothing.
expect_refused() {
  local what=$1 msg=$2 before
  shift 2
  before=$(tree_state "$R")
  if inst "$@" 2>"$SCRATCH/out"; then fail "$what: install.sh succeeded"; fi
  grep -Eq "$msg" "$SCRATCH/out" || fail "$what: message '$(cat "$SCRATCH/out")' does not match /$msg/"
  [[ $before == "$(tree_state "$R")" ]] || fail "$what: files changed"
  log "$what: $(tail -n1 "$SCRATCH/out")"
}

test_bad_input_is_refused_before_any_change() {
  need_bins aliasnet aliasnet-ipamd
  scratch_root
  cp "$SRC/10-aliasnet.conflist" "$SCRATCH/good.conflist"
  echo '{"cniVersion": "1.0.0", "name": ' >"$SRC/10-aliasnet.conflist"
  expect_refused "invalid JSON" "is not valid JSON" --force
  jq '.cniVersion = "2.0.0"' "$SCRATCH/good.conflist" >"$SRC/10-aliasnet.conflist"
  expect_refused "unsupported version" 'cniVersion "2.0.0"' --force
  jq '.plugins[0].ipamSocket = "/run/elsewhere.sock"' "$SCRATCH/good.conflist" >"$SRC/10-aliasnet.conflist"
  expect_refused "socket mismatch" "ipamSocket \(/run/elsewhere.sock\) differs" --force
  jq '.plugins[0].type = "alias-net"' "$SCRATCH/good.conflist" >"$SRC/10-aliasnet.conflist"
  expect_refused "no aliasnet plugin" 'exactly one plugin with "type": "aliasnet"' --force
  cp "$SCRATCH/good.conflist" "$SRC/10-aliasnet.conflist"
  mv "$R/etc/aliasnet/node-pools.toml" "$SCRATCH/"
  expect_refused "no pools" "node-pools.toml does not exist" --force
  printf '[[pool]]\nname = "x"\nsource = "static"\ncidrs = ["10.231.0.1/24"]\n' >"$R/etc/aliasnet/node-pools.toml"
  expect_refused "invalid pool" "ipamd config is invalid: .*cidrs" --force
  mv "$SCRATCH/node-pools.toml" "$R/etc/aliasnet/node-pools.toml"
  if [[ -x $BIN_DIR/aliasnet-shaperd ]]; then
    cp "$SRC/shaper.toml" "$SCRATCH/shaper.toml"
    echo 'internal_cidrs = ["10.0.0.1/8"]' >"$SRC/shaper.toml"
    expect_refused "invalid shaper policy" "shaper policy .* is invalid: .*host bits set" --force
    cp "$SCRATCH/shaper.toml" "$SRC/shaper.toml"
  fi
  expect_refused "missing binaries" "not found or not executable" --bin-dir "$SCRATCH/nowhere"
  expect_refused "unknown flag" "unknown argument: --frobnicate" --frobnicate
  # A chained plugin that is not installed: binaries may be placed, but never the conflist.
  jq '.plugins += [{"type": "not-installed"}]' "$SCRATCH/good.conflist" >"$SRC/10-aliasnet.conflist"
  if inst 2>"$SCRATCH/out"; then fail "install with a missing chained plugin succeeded"; fi
  grep -q "plugin type 'not-installed'" "$SCRATCH/out" || fail "missing plugin not named: $(cat "$SCRATCH/out")"
  [[ ! -e $R/etc/cni/net.d/10-aliasnet.conflist ]] || fail "conflist written although a plugin is missing"
}

test_ready_probe() {
  need_bins aliasnet aliasnet-ipamd
  scratch_root
  # A one-address pool, so the test can exhaust it.
  printf '[[pool]]\nname = "one"\nsource = "static"\nips = ["10.231.0.9"]\n' >"$R/etc/aliasnet/node-pools.toml"
  local probe=("$READY" --conflist "$R/etc/cni/net.d/10-aliasnet.conflist" --cni-bin-dir "$R/opt/cni/bin")
  local out node=anr-n-$RT_ID pod=anr-p-$RT_ID conf
  out=$("${probe[@]}") && fail "ready before install: $out"
  log "before install: $out"
  inst 2>/dev/null
  new_netns "$node"
  new_netns "$pod"
  # A veth pair with both ends in the node stands in for the uplink (kernels built without the
  # dummy driver have no dummy link).
  ip -n "$node" link add eth0 type veth peer name uplink-peer
  ip -n "$node" link set uplink-peer up
  ip -n "$node" link set eth0 up
  ip -n "$node" addr add 198.51.100.2/24 dev eth0
  ip -n "$node" route add default via 198.51.100.1
  out=$("${probe[@]}") && fail "ready without a daemon: $out"
  [[ $out == *unreachable* ]] || fail "probe output does not say the daemon is unreachable: $out"
  out=$("${probe[@]}" --alive) && fail "alive without a daemon: $out"
  cp "$R/etc/aliasnet/ipamd.toml" "$SCRATCH/ipamd.toml"
  start_ipamd "$node" "$SCRATCH" "$R/run/aliasnet/ipamd.sock"
  out=$("${probe[@]}") || fail "not ready with the daemon up: $out"
  conf=$(plugin_conf "$R/etc/cni/net.d/10-aliasnet.conflist")
  defer "CNI_COMMAND=DEL CNI_CONTAINERID=cid-r CNI_NETNS= CNI_IFNAME=eth0 CNI_PATH=/ nsenter --net=/run/netns/$node $BIN_DIR/aliasnet <<<'$conf'"
  cni_call ADD "$node" "$pod" cid-r "$conf" >/dev/null || fail "ADD failed"
  out=$("${probe[@]}") && fail "ready with an exhausted pool: $out"
  log "exhausted: $out"
  out=$("${probe[@]}" --alive) || fail "not alive with an exhausted pool: $out"
  cni_call DEL "$node" "" cid-r "$conf" || fail "DEL failed"
  out=$("${probe[@]}") || fail "not ready after the address came back: $out"
  rm "$R/etc/cni/net.d/10-aliasnet.conflist"
  out=$("${probe[@]}") && fail "ready without a conflist: $out"
  [[ $out == *missing* ]] || fail "probe does not name the missing conflist: $out"
}

test_scripts_are_shellcheck_clean() {
  command -v shellcheck >/dev/null || skip "shellcheck not installed (apt-get install shellcheck)"
  shellcheck -x "$REPO"/install/*.sh "$RT_DIR"/*.sh || fail "shellcheck findings"
}

run_tests "$@"
