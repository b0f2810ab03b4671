#!/usr/bin/env bash
# install/*.yaml against the Kubernetes schemas (offline, strict), the security properties of
# the manifests, and "zero API-server load": the agents have no Kubernetes client and make no
# connection beyond the unix socket we configure.
#   bash tests/runtimes/manifests.sh [test_name]
# Needs: kubernetes-validate in $KV_VENV (default /var/tmp/aliasnet-kv; created by
# tests/setup.sh), strace, jq, cargo, and the built binaries for the connection test.
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "$0")/lib.sh"

KV_VENV=${KV_VENV:-/var/tmp/aliasnet-kv}
MANIFESTS=("$REPO"/install/*.yaml)
# Oldest supported (securityContext.appArmorProfile is GA in 1.30) and newest known.
K8S_VERSIONS=(1.30 1.37)

kv() {
  [[ -x $KV_VENV/bin/kubernetes-validate ]] ||
    skip "kubernetes-validate not installed: python3 -m venv $KV_VENV && $KV_VENV/bin/pip install kubernetes-validate"
  "$KV_VENV/bin/kubernetes-validate" "$@"
}

test_manifests_validate_strict() {
  local v
  for v in "${K8S_VERSIONS[@]}"; do
    kv --strict -k "$v" "${MANIFESTS[@]}" >"$SCRATCH/out" 2>&1 || fail "kubernetes-validate $v: $(cat "$SCRATCH/out")"
  done
  grep -c passed "$SCRATCH/out" | xargs -I{} printf '    %s resources valid\n' {} >&2
  # The validator really is strict: an unknown field must be rejected.
  sed 's/^      hostNetwork: true$/      hostNetwork: true\n      hostNetwrok: true/' "$REPO/install/aliasnet.yaml" >"$SCRATCH/typo.yaml"
  grep -q hostNetwrok "$SCRATCH/typo.yaml" || fail "could not make the negative control"
  if kv --strict "$SCRATCH/typo.yaml" >"$SCRATCH/out" 2>&1; then fail "strict validation accepted an unknown field"; fi
  grep -q "hostNetwrok" "$SCRATCH/out" || fail "the rejection does not name the field: $(cat "$SCRATCH/out")"
}

# Structural properties of the manifests (parsed with PyYAML from the validator's venv).
test_manifest_security_properties() {
  [[ -x $KV_VENV/bin/python ]] || skip "no venv at $KV_VENV"
  "$KV_VENV/bin/python" - "$REPO/install" <<'EOF' || fail "manifest properties"
import pathlib, sys, yaml
root = pathlib.Path(sys.argv[1])
errors = []
def err(m): errors.append(m)
docs = {}
for f in sorted(root.glob("*.yaml")):
    for d in yaml.safe_load_all(f.read_text()):
        if d:
            docs[(f.name, d["kind"], d["metadata"]["name"])] = d

for (f, kind, name), d in docs.items():
    if kind == "ServiceAccount" and d.get("automountServiceAccountToken") is not False:
        err(f"{f}: ServiceAccount {name} must set automountServiceAccountToken: false")
    if kind in ("ClusterRole", "Role", "ClusterRoleBinding", "RoleBinding"):
        err(f"{f}: {kind} {name}: the agents need no API access, so no RBAC")
    if kind != "DaemonSet":
        continue
    spec = d["spec"]["template"]["spec"]
    where = f"{f}: DaemonSet {name}"
    if spec.get("automountServiceAccountToken") is not False:
        err(f"{where}: pod must set automountServiceAccountToken: false")
    for v in spec.get("volumes", []):
        for src in (v.get("projected") or {}).get("sources", []):
            if "serviceAccountToken" in src:
                err(f"{where}: volume {v['name']} projects a service account token")
        # One secret only: the cluster budget's etcd client certificate, optional.
        sec = v.get("secret")
        if sec is not None and (v["name"], sec.get("secretName"), sec.get("optional")) != ("etcd-client", "aliasnet-etcd", True):
            err(f"{where}: volume {v['name']} mounts a secret other than the optional aliasnet-etcd")
    host = {v["name"]: v["hostPath"]["path"] for v in spec.get("volumes", []) if "hostPath" in v}
    if not spec.get("hostNetwork"):
        err(f"{where}: hostNetwork must be true")
    if not any(t.get("operator") == "Exists" and "key" not in t for t in spec.get("tolerations", [])):
        err(f"{where}: must tolerate every taint")
    if spec.get("priorityClassName") != "system-node-critical":
        err(f"{where}: priorityClassName must be system-node-critical")
    if d["spec"].get("updateStrategy", {}).get("type") != "RollingUpdate":
        err(f"{where}: updateStrategy must be RollingUpdate")
    allowed_caps = {"ipamd": {"NET_ADMIN"}, "shaperd": {"BPF", "PERFMON", "NET_ADMIN", "SYS_ADMIN"}}
    for c in spec.get("initContainers", []) + spec["containers"]:
        cw = f"{where} container {c['name']}"
        sc = c.get("securityContext", {})
        if sc.get("privileged"):
            err(f"{cw}: privileged")
        if sc.get("allowPrivilegeEscalation") is not False:
            err(f"{cw}: allowPrivilegeEscalation must be false")
        if sc.get("capabilities", {}).get("drop") != ["ALL"]:
            err(f"{cw}: must drop ALL capabilities")
        add = set(sc.get("capabilities", {}).get("add", []))
        if not add <= allowed_caps.get(c["name"], set()):
            err(f"{cw}: unexpected capabilities {sorted(add - allowed_caps.get(c['name'], set()))}")
        if "resources" not in c or "requests" not in c["resources"] or "memory" not in c["resources"].get("limits", {}):
            err(f"{cw}: needs resource requests and a memory limit")
        if any(e.get("name", "").startswith("KUBERNETES_") for e in c.get("env", [])):
            err(f"{cw}: sets KUBERNETES_* env")
        for m in c.get("volumeMounts", []):
            if m["mountPath"].startswith("/var/run/secrets"):
                err(f"{cw}: mounts {m['mountPath']}")
            if m["name"] == "etcd-client" and (c["name"] != "shaperd" or not m.get("readOnly")):
                err(f"{cw}: the etcd client certificate is shaperd's alone, read-only")
    if name == "aliasnet-node":
        need = {"/opt/cni/bin", "/etc/cni/net.d", "/etc/aliasnet", "/var/lib/aliasnet",
                "/run/aliasnet", "/sys/fs/bpf"}
        missing = need - set(host.values())
        if missing:
            err(f"{where}: missing hostPath mounts {sorted(missing)}")
        names = [c["name"] for c in spec["containers"]]
        if names != ["ipamd", "shaperd"]:
            err(f"{where}: containers {names}")
        ipamd = spec["containers"][0]
        probe = " ".join(ipamd.get("readinessProbe", {}).get("exec", {}).get("command", []))
        if "ready.sh" not in probe or "10-aliasnet.conflist" not in probe:
            err(f"{where}: ipamd readiness must run ready.sh against the installed conflist")
        init = " ".join(spec["initContainers"][0]["command"])
        if "install.sh" not in init:
            err(f"{where}: the init container must run install.sh")

# The ConfigMap ships exactly install/etc/ (what install.sh and the image use by default).
cm = docs[("aliasnet.yaml", "ConfigMap", "aliasnet-config")]["data"]
for key in ("10-aliasnet.conflist", "ipamd.toml", "shaper.toml"):
    if cm.get(key) != (root / "etc" / key).read_text():
        err(f"ConfigMap key {key} differs from install/etc/{key}")
for e in errors:
    print("    " + e, file=sys.stderr)
sys.exit(1 if errors else 0)
EOF
}

# No Kubernetes client in any agent's dependency graph, and no HTTP client in the plugin's or
# shaperd's. ipamd has exactly one: hyper's client for the azure-imds pool, whose only
# destination is the configured metadata URL (and which the strace test below watches).
test_agents_link_no_kubernetes_client() {
  command -v cargo >/dev/null || skip "cargo not found"
  local pkg deps bad crates
  for pkg in aliasnet-cni aliasnet-ipam aliasnet-shaper; do
    deps=$(cd "$REPO" && cargo tree --offline -q -p "$pkg" -e normal,build --prefix none --format '{p}' 2>&1) ||
      fail "cargo tree -p $pkg: $deps"
    crates=$(awk '{print $1}' <<<"$deps" | sort -u)
    bad=$(grep -Ex 'kube|kube-[a-z-]+|k8s-openapi|k8s-cri|kubernetes|tower-http' <<<"$crates" || true)
    [[ -z $bad ]] || fail "$pkg depends on a Kubernetes client: $bad"
    # ipamd's hyper client (IMDS) and shaperd's hyper server (/metrics) are the only HTTP code,
    # besides shaperd's etcd client (tonic over hyper; destinations: [cluster] etcd_endpoints).
    local grpc='|tonic'
    [[ $pkg == aliasnet-shaper ]] && grpc=''
    bad=$(grep -Ex "reqwest|ureq|isahc|attohttpc|curl$grpc" <<<"$crates" || true)
    [[ -z $bad ]] || fail "$pkg depends on an HTTP client beyond hyper's: $bad"
    if [[ $pkg == aliasnet-cni ]] && grep -qx 'hyper\|hyper-util' <<<"$crates"; then
      fail "the CNI plugin links hyper"
    fi
    log "$pkg: $(wc -l <<<"$crates") crates, no Kubernetes client, no HTTP client but hyper's"
  done
}

# manifest_caps CONTAINER: the capabilities install/aliasnet.yaml adds for CONTAINER, as a
# setpriv bounding set ("-all,+net_admin,...").
manifest_caps() {
  "$KV_VENV/bin/python" - "$REPO/install/aliasnet.yaml" "$1" <<'EOF'
import sys, yaml
for d in yaml.safe_load_all(open(sys.argv[1])):
    if d and d["kind"] == "DaemonSet":
        spec = d["spec"]["template"]["spec"]
        for c in spec.get("initContainers", []) + spec["containers"]:
            if c["name"] == sys.argv[2]:
                caps = c.get("securityContext", {}).get("capabilities", {}).get("add", [])
                print(",".join(["-all"] + ["+" + x.lower() for x in caps]))
                sys.exit(0)
sys.exit("no container " + sys.argv[2])
EOF
}

# Each agent does its job with exactly the capabilities the manifest grants it (and
# no_new_privs, as allowPrivilegeEscalation: false): install.sh with none, ipamd with NET_ADMIN
# (it deletes a released pod's host veth), shaperd with BPF, PERFMON, NET_ADMIN, SYS_ADMIN. And
# the grants are needed: without them ipamd cannot delete the veth and shaperd cannot load.
test_agents_work_with_only_the_manifest_capabilities() {
  need_bins aliasnet aliasnet-ipamd aliasnet-shaperd
  [[ -x $KV_VENV/bin/python ]] || skip "no venv at $KV_VENV"
  local c_install c_ipamd c_shaperd dir=$SCRATCH node=ancap-n-$RT_ID pod=ancap-p-$RT_ID
  c_install=$(manifest_caps install)
  c_ipamd=$(manifest_caps ipamd)
  c_shaperd=$(manifest_caps shaperd)
  log "install: $c_install; ipamd: $c_ipamd; shaperd: $c_shaperd"

  # install.sh into a scratch root, with no capability at all.
  local r=$dir/root
  mkdir -p "$r/etc/aliasnet"
  printf '[[pool]]\nname = "p"\nsource = "static"\ncidrs = ["10.235.0.0/29"]\n' >"$r/etc/aliasnet/node-pools.toml"
  setpriv --bounding-set "$c_install" --nnp "$REPO/install/install.sh" --bin-dir "$BIN_DIR" \
    --cni-bin-dir "$r/opt/cni/bin" --cni-conf-dir "$r/etc/cni/net.d" --config-dir "$r/etc/aliasnet" \
    2>"$dir/install.log" || fail "install.sh without capabilities: $(cat "$dir/install.log")"

  # ipamd with NET_ADMIN only: ADD, then DEL whose host veth the daemon deletes.
  new_netns "$node"
  new_netns "$pod"
  ip -n "$node" link add eth0 type veth peer name uplink-peer
  ip -n "$node" link set uplink-peer up
  ip -n "$node" link set eth0 up
  ip -n "$node" addr add 198.51.100.2/24 dev eth0
  ip -n "$node" route add default via 198.51.100.1
  local caps round conf veth pid
  for round in granted none; do
    caps=$c_ipamd
    [[ $round == none ]] && caps=-all
    mkdir -p "$dir/$round"
    ipamd_config "$dir/$round" 10.235.0.0/29
    in_ns "$node" setpriv --bounding-set "$caps" --nnp "$BIN_DIR/aliasnet-ipamd" --config "$dir/$round/ipamd.toml" \
      >>"$dir/$round/ipamd.log" 2>&1 &
    pid=$!
    defer "stop_pid $pid"
    for _ in $(seq 100); do [[ -S $dir/$round/ipamd.sock ]] && break; sleep 0.05; done
    [[ -S $dir/$round/ipamd.sock ]] || fail "ipamd ($round) did not start: $(tail -n5 "$dir/$round/ipamd.log")"
    conf=$(jq -nc --arg d "$dir/$round" '{cniVersion: "1.0.0", name: "caps", type: "aliasnet", datapath: "off",
      ipamSocket: ($d + "/ipamd.sock"), spoolDir: ($d + "/spool"), asyncTeardown: true}')
    CNI_COMMAND=ADD CNI_CONTAINERID=cid-$round CNI_NETNS=/run/netns/$pod CNI_IFNAME=eth0 CNI_PATH=/ \
      in_ns "$node" "$BIN_DIR/aliasnet" <<<"$conf" >"$dir/$round/add.json" || fail "ADD ($round) failed"
    veth=$(jq -r '.interfaces[] | select(.sandbox == null) | .name' "$dir/$round/add.json")
    CNI_COMMAND=DEL CNI_CONTAINERID=cid-$round CNI_NETNS=/run/netns/$pod CNI_IFNAME=eth0 CNI_PATH=/ \
      in_ns "$node" "$BIN_DIR/aliasnet" <<<"$conf" || fail "DEL ($round) failed"
    for _ in $(seq 40); do ip -n "$node" link show "$veth" >/dev/null 2>&1 || break; sleep 0.05; done
    if [[ $round == granted ]]; then
      if ip -n "$node" link show "$veth" >/dev/null 2>&1; then
        fail "ipamd with $caps did not delete $veth: $(tail -n5 "$dir/$round/ipamd.log")"
      fi
    else
      ip -n "$node" link show "$veth" >/dev/null 2>&1 ||
        fail "ipamd without capabilities deleted $veth: is NET_ADMIN really needed?"
      log "without NET_ADMIN the veth stays: $(grep -m1 -io 'operation not permitted' "$dir/$round/ipamd.log" || echo "(no EPERM logged)")"
      ip -n "$node" link del "$veth"
    fi
    stop_pid "$pid"
  done

  # shaperd with its grants loads and pins the datapath (private bpffs instance); without
  # BPF/SYS_ADMIN it cannot.
  mkdir "$dir/bpf"
  mount -t bpf bpf "$dir/bpf"
  defer "umount $dir/bpf"
  in_ns "$node" setpriv --bounding-set "$c_shaperd" --nnp "$BIN_DIR/aliasnet-shaperd" --once \
    --config "$REPO/install/etc/shaper.toml" --pin-root "$dir/bpf/aliasnet" >"$dir/shaperd.log" 2>&1 ||
    fail "shaperd with $c_shaperd failed: $(tail -n5 "$dir/shaperd.log")"
  [[ -e $dir/bpf/aliasnet/progs/an_host_ingress ]] || fail "shaperd did not pin the program the readiness probe checks"
  # SYS_ADMIN is for setns into pod netns (not exercised by --once) and implies BPF and
  # PERFMON, so each of the others is dropped together with it: every one must be needed.
  local drop
  for drop in bpf perfmon net_admin; do
    caps=$(sed -e "s/,+$drop//; s/,+sys_admin//" <<<"$c_shaperd")
    if in_ns "$node" setpriv --bounding-set "$caps" --nnp "$BIN_DIR/aliasnet-shaperd" --once \
      --config "$REPO/install/etc/shaper.toml" --pin-root "$dir/bpf/without-$drop" >"$dir/shaperd-$drop.log" 2>&1; then
      fail "shaperd installed the datapath with $caps: is ${drop^^} really needed?"
    fi
    log "shaperd with $caps: $(grep -m1 -o 'Permission denied\|Operation not permitted' "$dir/shaperd-$drop.log" || echo failed)"
  done
  caps=${c_shaperd/,+sys_admin/}
  in_ns "$node" setpriv --bounding-set "$caps" --nnp "$BIN_DIR/aliasnet-shaperd" --once \
    --config "$REPO/install/etc/shaper.toml" --pin-root "$dir/bpf/without-sys_admin" >"$dir/shaperd-nosa.log" 2>&1 ||
    fail "shaperd needs SYS_ADMIN beyond setns: $(tail -n3 "$dir/shaperd-nosa.log")"
}

# unexpected_destinations STRACE SOCKET: the sockaddrs that connect/sendto/sendmsg calls in
# STRACE were aimed at, other than netlink, SOCKET and glibc's NSS cache probe (nscd's local
# socket, which a shell or a python interpreter may try). (Netlink payloads also say AF_INET
# as rtm_family=...; only sa_family=... is an address.)
unexpected_destinations() {
  grep -E '^[0-9]+ +(connect|sendto|sendmsg)\(' "$1" |
    grep -oE 'sa_family=AF_[A-Z0-9]+(, sun_path="[^"]*")?' | sort -u |
    grep -vx -e 'sa_family=AF_NETLINK' -e "sa_family=AF_UNIX, sun_path=\"$2\"" \
      -e 'sa_family=AF_UNIX, sun_path="/var/run/nscd/socket"' -e 'sa_family=AF_UNIX, sun_path="/run/nscd/socket"' || true
}

# strace every connect/sendto/sendmsg of the daemons and of the plugin (a full ADD/DEL) in a
# node netns whose only way out is a TEST-NET uplink: the only destinations allowed are the
# configured ipamd socket and netlink (the kernel). An attempt to reach an API server, DNS or
# anything else shows up as an AF_INET/AF_INET6 (or another AF_UNIX) address.
test_agents_connect_only_to_configured_sockets() {
  need_bins aliasnet aliasnet-ipamd aliasnet-shaperd
  command -v strace >/dev/null || skip "strace not installed"
  local node=anc-n-$RT_ID pod=anc-p-$RT_ID dir=$SCRATCH conf pid
  new_netns "$node"
  new_netns "$pod"
  ip -n "$node" link add eth0 type veth peer name uplink-peer
  ip -n "$node" link set uplink-peer up
  ip -n "$node" link set eth0 up
  ip -n "$node" addr add 198.51.100.2/24 dev eth0
  ip -n "$node" route add default via 198.51.100.1
  ipamd_config "$dir" 10.232.0.0/29
  # What a pod in a cluster would see: the agents must not act on it.
  export KUBERNETES_SERVICE_HOST=198.51.100.77 KUBERNETES_SERVICE_PORT=443
  local trace=(strace -f -qq -e "trace=connect,sendto,sendmsg" -o)

  # Negative control: the filter does catch a TCP connection attempt.
  in_ns "$node" "${trace[@]}" "$dir/control.strace" \
    /usr/bin/python3 -c 'import socket; s = socket.socket(); s.settimeout(0.2)
try: s.connect(("198.51.100.77", 443))
except OSError: pass' || true
  [[ $(unexpected_destinations "$dir/control.strace" "$dir/ipamd.sock") == sa_family=AF_INET ]] ||
    fail "the negative control was not detected: $(cat "$dir/control.strace")"

  in_ns "$node" "${trace[@]}" "$dir/ipamd.strace" \
    "$BIN_DIR/aliasnet-ipamd" --config "$dir/ipamd.toml" >>"$dir/ipamd.log" 2>&1 &
  pid=$!
  defer "stop_pid $pid"
  for _ in $(seq 100); do [[ -S $dir/ipamd.sock ]] && break; sleep 0.05; done
  [[ -S $dir/ipamd.sock ]] || fail "ipamd did not start: $(tail -n5 "$dir/ipamd.log")"
  conf=$(jq -nc --arg d "$dir" '{cniVersion: "1.0.0", name: "conncheck", type: "aliasnet", datapath: "off",
    ipamSocket: ($d + "/ipamd.sock"), spoolDir: ($d + "/spool")}')
  local add
  add=$(CNI_COMMAND=ADD CNI_CONTAINERID=cid-c CNI_NETNS=/run/netns/$pod CNI_IFNAME=eth0 CNI_PATH=/ \
    in_ns "$node" "${trace[@]}" "$dir/add.strace" "$BIN_DIR/aliasnet" <<<"$conf") || fail "ADD failed: $add"
  CNI_COMMAND=DEL CNI_CONTAINERID=cid-c CNI_NETNS=/run/netns/$pod CNI_IFNAME=eth0 CNI_PATH=/ \
    in_ns "$node" "${trace[@]}" "$dir/del.strace" "$BIN_DIR/aliasnet" <<<"$conf" || fail "DEL failed"
  sleep 0.3
  stop_pid "$pid"

  # shaperd: install the datapath and apply the policy once, pinned in a private bpffs
  # instance (a fresh mount is its own instance; /sys/fs/bpf is not touched).
  mkdir "$dir/bpf"
  mount -t bpf bpf "$dir/bpf"
  defer "umount $dir/bpf"
  cp "$REPO/install/etc/shaper.toml" "$dir/shaper.toml"
  in_ns "$node" "${trace[@]}" "$dir/shaperd.strace" "$BIN_DIR/aliasnet-shaperd" --once \
    --config "$dir/shaper.toml" --pin-root "$dir/bpf/aliasnet" >"$dir/shaperd.log" 2>&1 ||
    fail "shaperd --once failed: $(tail -n5 "$dir/shaperd.log")"

  local f bad n
  for f in ipamd add del shaperd; do
    n=$(grep -cE '^[0-9]+ +(connect|sendto|sendmsg)\(' "$dir/$f.strace" || true)
    bad=$(unexpected_destinations "$dir/$f.strace" "$dir/ipamd.sock")
    [[ -z $bad ]] || fail "$f: unexpected destinations: $bad"
    log "$f: $n connect/send calls, all to netlink or $dir/ipamd.sock"
  done
  grep -qF "sun_path=\"$dir/ipamd.sock\"" "$dir/add.strace" || fail "the plugin never reached the socket (strace not capturing?)"
}

run_tests "$@"
