#!/usr/bin/env bash
# The node image: install/Containerfile built without a registry, checked against the
# manifests, and run the way install/aliasnet.yaml and install/uninstall.yaml run it.
#   bash tests/runtimes/image.sh [test_name]
#
# Offline build (docs/install.md, "Without registry access"): the runtime base is made from
# Debian packages with mmdebstrap (cached in IMAGE_CACHE, keyed by the recipe, remade after a
# week) and imported; the image is the Containerfile's `prebuilt` target with the binaries the
# suite tests (ALIASNET_BIN_DIR: tests/run.sh's build of the workspace).
#
# Running it: tests/runtimes/podspec.py turns each container of the DaemonSets into `podman run`
# arguments (command, args, env, user, capabilities, read-only root, volumes, probes), so a
# manifest change is tested as it is. hostPath volumes are directories under the scratch
# directory, except /run/netns: pods' netns paths are recorded by the plugin and opened by
# shaperd, so they must be the same paths for both, as on a node; the runtime mount namespace's
# private /run/netns stands in for the host's. bpffs is a private instance. podman's storage is
# in the scratch directory, podman runs in a private mount namespace (start_mount_ns) in the
# node netns, builds use --network=none and containers join the node netns (hostNetwork).
#
# Needs: podman runc conmon mmdebstrap python3-yaml jq cargo (tests/setup.sh), and the Debian
# mirrors for the first base (about a minute; later runs take the cached one).
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "$0")/lib.sh"

IMAGE_CACHE=${ALIASNET_IMAGE_CACHE:-/var/tmp/aliasnet-image}
VERSION=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' "$REPO/Cargo.toml")
# The binaries the suite tests (ALIASNET_BIN_DIR, default target/release): the build context
# holds them, so they must be under the repository.
PREBUILT=$(realpath -m "$BIN_DIR")
SHIPPED=(aliasnet aliasnet-ipamd aliasnet-shaperd aliasnetctl)
POD_RANGE=10.237.0.0/29
NODE_YAML=$REPO/install/aliasnet.yaml
UNINSTALL_YAML=$REPO/install/uninstall.yaml
# Debian 12 minbase (like debian:12-slim: no docs, man pages or locales) plus jq, the one
# package install.sh and ready.sh need beyond it. merged-usr without the usrmerge package,
# which would pull in perl.
BASE_ARGS=(--variant=minbase --include=jq --format=tar
  --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr
  '--dpkgopt=path-exclude=/usr/share/man/*' '--dpkgopt=path-exclude=/usr/share/info/*'
  '--dpkgopt=path-exclude=/usr/share/locale/*' '--dpkgopt=path-include=/usr/share/locale/locale.alias'
  '--dpkgopt=path-exclude=/usr/share/doc/*' '--dpkgopt=path-include=/usr/share/doc/*/copyright'
  bookworm)
BASE_IMAGE=localhost/aliasnet-base:bookworm
# An image this size is the base (about 80 MB) and the four binaries; a toolchain would not fit.
MAX_IMAGE_MB=130

# base_sources: the host's Debian sources (security updates included), if it has them.
base_sources() {
  local f
  for f in /etc/apt/sources.list.d/debian.sources /etc/apt/sources.list; do
    [[ -s $f ]] && echo "$f" && return 0
  done
  return 0
}

# ensure_base: prints the path of the base tarball, made if missing or older than a week.
ensure_base() {
  local src key tar lock
  src=$(base_sources)
  key=$({
    printf '%s\n' "${BASE_ARGS[@]}"
    mmdebstrap --version
    [[ -z $src ]] || cat "$src"
  } | sha256sum | cut -c1-16)
  tar=$IMAGE_CACHE/base-bookworm-$key.tar
  mkdir -p "$IMAGE_CACHE"
  exec {lock}>"$IMAGE_CACHE/.lock"
  flock "$lock"
  if [[ -z $(find "$tar" -mtime -7 2>/dev/null) ]]; then
    log "making the base image with mmdebstrap (cached as $tar)"
    rm -f "$IMAGE_CACHE"/base-*.tar "$IMAGE_CACHE"/.base-*.tar
    # A private mount namespace: mmdebstrap's /proc, /sys and /dev mounts of its chroot
    # never appear in the host's mount table.
    unshare --mount --propagation private -- mmdebstrap "${BASE_ARGS[@]}" "$IMAGE_CACHE/.base-$key.tar" \
      ${src:+"$src"} >"$SCRATCH/mmdebstrap.log" 2>&1 ||
      fail "mmdebstrap failed: $(tail -n 5 "$SCRATCH/mmdebstrap.log")"
    mv "$IMAGE_CACHE/.base-$key.tar" "$tar"
  fi
  exec {lock}>&-
  echo "$tar"
}

pm() { pm_timeout 600 "$@"; }
# pm_timeout SECONDS ARGS...: podman ARGS, killed after SECONDS.
pm_timeout() {
  local t=$1
  shift
  in_node timeout "$t" podman --root "$S/podman/root" --runroot "$S/podman/runroot" --tmpdir "$S/podman/tmp" \
    --cgroup-manager cgroupfs --events-backend file "$@"
}
podspec() { mns env HOST_ROOT="$H" CM_ROOT="$S/configmaps" HOST_IDENTITY=/run/netns python3 "$RT_DIR/podspec.py" "$@"; }

# bind_netns NAME: /run/netns/NAME inside the runtime mount namespace (podman and the plugin
# run there; its /run is private).
bind_netns() {
  # shellcheck disable=SC2016 # $1 is the inner shell's
  in_ns "$1" nsenter --mount="/proc/$HOLDER/ns/mnt" -- \
    sh -c 'touch "/run/netns/$1" && mount --bind /proc/self/ns/net "/run/netns/$1"' sh "$1"
}

# image_env: a node netns with an uplink to a router and an "internet" host, a pod netns, the
# runtime mount namespace, and the image built; sets S, H (the node's host root), NODE, POD,
# CG and IMAGE.
image_env() {
  local t
  for t in podman runc mmdebstrap python3 jq bpftool cargo git; do
    command -v "$t" >/dev/null || skip "$t not installed (tests/setup.sh installs it)"
  done
  python3 -c 'import yaml' 2>/dev/null || skip "python3-yaml not installed"
  [[ -d /usr/share/mmdebstrap/hooks/merged-usr ]] || skip "mmdebstrap without its merged-usr hook"
  [[ $PREBUILT == "$REPO"/target/* ]] || fail "ALIASNET_BIN_DIR ($PREBUILT) must be a cargo output directory under $REPO/target"
  need_bins "${SHIPPED[@]}"
  S=$SCRATCH
  H=$S/host
  NODE=anim-n-$RT_ID
  POD=anim-p-$RT_ID
  CG=/aliasnet-img-$RT_ID
  make_fabric "$NODE" "anim-r-$RT_ID" "anim-i-$RT_ID" "$POD_RANGE"
  new_netns "$POD"
  mkdir -p "$S/podman/tmp" "$H/sys/fs/bpf"
  # runtimes.md: cgroupfs, file events, runc, ulimits within the hard limits.
  cat >"$S/containers.conf" <<EOF
[containers]
default_ulimits = ["nofile=4096:4096", "nproc=4096:4096"]
[engine]
cgroup_manager = "cgroupfs"
events_logger = "file"
events_logfile_path = "$S/podman/events.log"
runtime = "runc"
tmp_dir = "$S/podman/tmp"
volume_path = "$S/podman/volumes"
conmon_env_vars = ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "CONTAINERS_CONF=$S/containers.conf"]
EOF
  export CONTAINERS_CONF=$S/containers.conf
  start_mount_ns
  defer "image_teardown"
  # Shared, so that a pod netns bound after shaperd started reaches its HostToContainer mount.
  mns mount --bind /run/netns /run/netns
  mns mount --make-shared /run/netns
  bind_netns "$NODE"
  bind_netns "$POD"
  mns mount -t bpf bpf "$H/sys/fs/bpf" || fail "cannot mount a bpffs instance at $H/sys/fs/bpf"

  # The one image the manifest's containers run (by tag: a digest pin names a pushed image).
  IMAGE=$(podspec images "$NODE_YAML" | sed 's/@.*//' | sort -u)
  [[ -n $IMAGE && $IMAGE != *$'\n'* ]] || fail "install/aliasnet.yaml's containers must all run one image: $IMAGE"
  local base t0=$SECONDS
  base=$(ensure_base)
  log "base: $base ($(du -m "$base" | cut -f1) MB, $((SECONDS - t0)) s)"
  t0=$SECONDS
  pm import "$base" "$BASE_IMAGE" >"$S/import.log" 2>&1 || fail "podman import: $(tail -n 3 "$S/import.log")"
  pm build --network=none --pull=never --cgroup-parent="$CG" -f "$REPO/install/Containerfile" \
    --target prebuilt --build-arg RUNTIME_IMAGE="$BASE_IMAGE" --build-arg BIN_DIR="${PREBUILT#"$REPO"/}" \
    -t "$IMAGE" "$REPO" >"$S/build.log" 2>&1 ||
    fail "podman build: $(tail -n 20 "$S/build.log")"
  log "image $IMAGE built from ${PREBUILT#"$REPO"/} in $((SECONDS - t0)) s"
}

image_teardown() {
  pm rm -af -t 0 >/dev/null 2>&1 || true
  pm image rm -af >/dev/null 2>&1 || true
  remove_cgroups "$CG"
}

# in_image CMD...: CMD run from the image's root filesystem (mounted in the runtime mount
# namespace), so that its paths and symlinks resolve as in a container.
in_image() { mns chroot "$IMAGE_ROOT" "$@"; }

test_image_matches_the_tree_and_the_manifests() {
  image_env
  IMAGE_ROOT=$(pm image mount "$IMAGE") || fail "podman image mount"
  local ref b v_tree v_img

  # One image, tagged with the workspace version, in every manifest (a digest may follow).
  podspec images "$NODE_YAML" "$UNINSTALL_YAML" >"$S/images" || fail "podspec.py images"
  [[ -s $S/images ]] || fail "no container images in the manifests"
  while read -r ref; do
    assert_eq "${ref%%@*}" "$IMAGE" "image of a container in install/*.yaml"
    ref=${ref%%@*}
    assert_eq "${ref##*:}" "$VERSION" "tag of $ref vs the workspace version (Cargo.toml)"
  done <"$S/images"
  assert_eq "$(pm image inspect -f '{{index .Labels "org.opencontainers.image.version"}}' "$IMAGE")" "$VERSION" \
    "the image's version label (ARG VERSION in install/Containerfile)"

  # The binaries are the tree's and say the workspace version; run by name, as
  # `kubectl exec ... -- aliasnetctl` does, they are on the image's PATH.
  for b in "${SHIPPED[@]}"; do
    assert_eq "$(in_image sha256sum "/opt/aliasnet/bin/$b" | cut -d' ' -f1)" "$(sha256sum "$PREBUILT/$b" | cut -d' ' -f1)" \
      "sha256 of /opt/aliasnet/bin/$b in the image vs ${PREBUILT#"$REPO"/}"
  done
  for b in aliasnet-ipamd aliasnet-shaperd aliasnetctl; do
    v_tree=$("$PREBUILT/$b" --version) || fail "$b --version"
    v_img=$(pm run --rm --network=none --cgroup-parent="$CG" --entrypoint "[\"$b\", \"--version\"]" "$IMAGE") ||
      fail "$b --version in the image"
    assert_eq "$v_img" "$v_tree" "$b --version in the image"
    assert_eq "$v_tree" "$b $VERSION" "$b --version"
  done
  log "binaries: ${SHIPPED[*]} identical to ${PREBUILT#"$REPO"/}, version $VERSION"

  # Every program and path the DaemonSets name (commands, args, probes) that no volume
  # provides is in the image.
  local f c p how n=0
  for f in "$NODE_YAML:aliasnet-node" "$UNINSTALL_YAML:aliasnet-uninstall"; do
    podspec paths "${f%%:*}" "${f##*:}" >"$S/paths" || fail "podspec.py paths ${f##*:}"
    while read -r c p how; do
      if [[ $how == x ]]; then
        in_image test -f "$p" -a -x "$p" || fail "$(basename "${f%%:*}") container $c runs $p, which is not a program in the image"
      else
        in_image test -e "$p" || fail "$(basename "${f%%:*}") container $c names $p, which the image does not have"
      fi
      n=$((n + 1))
    done <"$S/paths"
  done
  log "the $n paths the manifests' commands and probes name are in the image"

  # Small: no toolchain, no headers, no package lists.
  local found
  # shellcheck disable=SC2016 # expanded by the image's shell
  found=$(in_image sh -c 'for t in cargo rustc clang-19 clang gcc cc ld; do command -v $t; done; find /usr/include -name "*.h" 2>/dev/null | head -n 3; ls /var/lib/apt/lists/*_Packages 2>/dev/null' || true)
  [[ -z $found ]] || fail "the runtime image carries build tools or headers: $found"
  local size
  size=$(pm image inspect -f '{{.Size}}' "$IMAGE")
  log "image size: $((size / 1000000)) MB, of which the Debian base $(($(pm image inspect -f '{{.Size}}' "$BASE_IMAGE") / 1000000)) MB"
  ((size <= MAX_IMAGE_MB * 1000000)) || fail "image is $((size / 1000000)) MB, more than $MAX_IMAGE_MB MB"

  # The build stage gets every workspace member: cargo loads the workspace, with Cargo.lock
  # as it is (--locked), from exactly what the `sources` stage copies.
  pm build --network=none --pull=never --cgroup-parent="$CG" -f "$REPO/install/Containerfile" \
    --target sources -t localhost/aliasnet-sources:test "$REPO" >"$S/sources.log" 2>&1 ||
    fail "podman build --target sources: $(tail -n 5 "$S/sources.log")"
  local src
  src=$(pm image mount localhost/aliasnet-sources:test) || fail "podman image mount (sources)"
  mkdir "$S/src"
  mns cp -a "$src/src/." "$S/src/"
  [[ ! -e $S/src/target ]] || fail "target/ entered the build stage's sources"
  # (cargo tree resolves for this platform only, so --offline needs no more than the build did.)
  (cd "$S/src" && cargo tree --locked --offline --workspace --depth 0 --prefix none >"$S/members" 2>"$S/members.err") ||
    fail "cargo cannot load the workspace the build stage gets: $(cat "$S/members.err")"
  log "build stage: the workspace loads with --locked ($(grep -c . "$S/members") members)"
  # CI's tree is a fresh clone: a Cargo.lock that differs from the commit means the binaries
  # were built without --locked and the lock rewritten.
  if [[ -n ${CI:-} ]] && git -C "$REPO" rev-parse -q --verify HEAD >/dev/null 2>&1; then
    git -C "$REPO" diff --quiet HEAD -- Cargo.lock || fail "Cargo.lock differs from the commit: the binaries were not built from it"
  fi
}

# run_container FILE DAEMONSET CONTAINER [EXTRA_ARG...]: `podman run` the container as the
# manifest describes it, EXTRA_ARGs appended to its command (an init container runs to
# completion and must succeed; the others are started detached). Logs to $S/CONTAINER.log.
run_container() {
  local file=$1 ds=$2 c=$3 kind
  shift 3
  local -a args
  kind=$(podspec containers "$file" "$ds" | awk -v c="$c" '$2 == c { print $1 }')
  [[ -n $kind ]] || fail "no container $c in $ds"
  podspec run "$file" "$ds" "$c" "$c" "/run/netns/$NODE" "$CG" >"$S/$c.args" || fail "podspec.py run $c"
  mapfile -d '' -t args <"$S/$c.args"
  if [[ $kind == init ]]; then
    pm run "${args[@]}" "$@" >"$S/$c.log" 2>&1 || fail "init container $c failed: $(tail -n 5 "$S/$c.log")"
    pm rm "$c" >/dev/null
  else
    pm run -d "${args[@]}" "$@" >/dev/null 2>"$S/$c.err" || fail "podman run $c: $(cat "$S/$c.err")"
  fi
}

# probe CONTAINER KIND: run the container's readinessProbe/livenessProbe (exec) once; prints
# its output.
probe() {
  local c=$1 kind=$2 timeout
  local -a p
  podspec probe "$NODE_YAML" aliasnet-node "$c" "$kind" >"$S/$c.$kind" || fail "podspec.py probe $c $kind"
  mapfile -d '' -t p <"$S/$c.$kind"
  ((${#p[@]})) || return 0
  timeout=${p[0]}
  pm_timeout "$((timeout + 5))" exec "$c" "${p[@]:1}" 2>&1
}

# wait_ready CONTAINER: until its readiness probe passes (as the kubelet's would), 30 s at most.
wait_ready() {
  local c=$1 i out t0=$SECONDS
  for ((i = 0; i < 60; i++)); do
    if out=$(probe "$c" readinessProbe); then
      log "$c ready after $((SECONDS - t0)) s${out:+: $out}"
      return 0
    fi
    [[ $(pm inspect -f '{{.State.Running}}' "$c") == true ]] ||
      fail "$c exited: $(pm logs "$c" 2>&1 | tail -n 5)"
    sleep 0.5
  done
  fail "$c not ready after 30 s: $out; its log: $(pm logs "$c" 2>&1 | tail -n 5)"
}

# pod_cni COMMAND CONTAINER_ID [NETNS]: the installed plugin, called in the node the way a
# runtime calls it, with the network config in $S/pod.conf.
pod_cni() {
  CNI_COMMAND=$1 CNI_CONTAINERID=$2 CNI_NETNS=${3:-} CNI_IFNAME=eth0 CNI_PATH=$H/opt/cni/bin \
    CNI_ARGS="IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=img-pod" \
    in_node "$H/opt/cni/bin/aliasnet" <"$S/pod.conf"
}

# host_tree: every path under the node's host root with its type, and the private /run/netns.
host_tree() { (cd "$H" && find . -mindepth 1 -printf '%y %p\n' | sort); }

test_image_runs_the_daemonset_and_uninstalls() {
  image_env
  local t_start=$SECONDS t0=$SECONDS c sock=$H/run/aliasnet/ipamd.sock
  # The node as provisioning leaves it: its alias range, nothing of aliasnet's yet.
  podspec prepare "$NODE_YAML" aliasnet-node || fail "podspec.py prepare"
  printf '[[pool]]\nname = "secondary"\nsource = "static"\ncidrs = ["%s"]\n' "$POD_RANGE" >"$H/etc/aliasnet/node-pools.toml"

  # --- the DaemonSet: init container, then the daemons, until Ready ---
  run_container "$NODE_YAML" aliasnet-node install
  cmp -s "$H/opt/cni/bin/aliasnet" "$PREBUILT/aliasnet" || fail "the installed plugin is not the image's"
  cmp -s "$H/etc/cni/net.d/10-aliasnet.conflist" "$S/configmaps/aliasnet-config/10-aliasnet.conflist" ||
    fail "the installed conflist is not the ConfigMap's"
  assert_eq "$(stat -c %a "$H/opt/cni/bin/aliasnet")" 755 "mode of the installed plugin"
  [[ -z $(find "$H" -name '.*.tmp.*') ]] || fail "temporary files left: $(find "$H" -name '.*.tmp.*')"
  # A restarted pod runs the init container again: nothing changes.
  local before
  before=$(cd "$H" && find opt etc -printf '%p %i %m %s\n' | sort)
  run_container "$NODE_YAML" aliasnet-node install
  assert_eq "$(cd "$H" && find opt etc -printf '%p %i %m %s\n' | sort)" "$before" "the node's files after a second install"
  log "install: plugin, configs and conflist in place; a re-run changes nothing"

  run_container "$NODE_YAML" aliasnet-node ipamd
  run_container "$NODE_YAML" aliasnet-node shaperd
  wait_ready shaperd
  wait_ready ipamd
  local out
  out=$(probe ipamd livenessProbe) || fail "ipamd liveness probe: $out"
  ipam_call "$sock" '{"op":"stats"}' >/dev/null || fail "ipamd does not answer on $sock"
  mns test -e "$H/sys/fs/bpf/aliasnet/progs/an_host_ingress" || fail "shaperd pinned nothing under the node's bpffs"
  log "ipamd and shaperd up after $((SECONDS - t0)) s"

  # --- the operator's view, from inside the image ---
  out=$(pm exec shaperd aliasnetctl status 2>&1) || fail "aliasnetctl status in the shaperd container: $out"
  echo "$out" >"$S/status.txt"
  log "aliasnetctl status: exit 0"

  # --- a pod through the plugin the image installed, as the runtime would call it ---
  local conf cid=img-pod-1 ip add
  conf=$(jq -c --arg h "$H" '(.plugins[] | select(.type == "aliasnet")) + {cniVersion, name}
      | .ipamSocket = $h + (.ipamSocket // "/run/aliasnet/ipamd.sock")
      | .spoolDir = $h + (.spoolDir // "/var/lib/aliasnet/spool")
      | .logFile = $h + (.logFile // "/var/log/aliasnet/cni.log")
      | .bpfPinRoot = $h + (.bpfPinRoot // "/sys/fs/bpf/aliasnet")
      | .runtimeConfig = {bandwidth: {ingressRate: 50000000, ingressBurst: 4294967295,
          egressRate: 50000000, egressBurst: 4294967295}}' "$H/etc/cni/net.d/10-aliasnet.conflist")
  echo "$conf" >"$S/pod.conf"
  defer "pod_cni DEL $cid"
  add=$(pod_cni ADD "$cid" "/run/netns/$POD") || fail "ADD through the installed plugin: $add $(tail -n 3 "$H/var/log/aliasnet/cni.log" 2>/dev/null)"
  ip=$(jq -r '.ips[0].address' <<<"$add" | cut -d/ -f1)
  python3 -c "import ipaddress, sys; sys.exit(ipaddress.ip_address('$ip') not in ipaddress.ip_network('$POD_RANGE'))" ||
    fail "pod address $ip is not from the node's pool $POD_RANGE"
  leases "$sock" | has -x "$ip aliasnet/$cid/eth0" || fail "no lease for the pod: $(leases "$sock")"
  in_ns "$POD" ping -c 2 -W 2 203.0.113.10 >/dev/null || fail "the pod cannot reach the internet host"
  out=$(pm exec shaperd aliasnetctl pods --json) || fail "aliasnetctl pods: $out"
  jq -e --arg id "$cid" --arg ip "$ip" 'any(.[]; .container_id == $id and .ip == $ip and .egress.internet.packets >= 2)' \
    <<<"$out" >/dev/null || fail "aliasnetctl pods does not show the pod's traffic: $out"
  # What docs/troubleshoot.md and the alert rules tell operators to run.
  for c in status doctor ipam; do
    out=$(pm exec shaperd aliasnetctl "$c" 2>&1) || fail "aliasnetctl $c with a pod, in the shaperd container: $out"
  done
  log "pod $ip: lease, internet ping, counted by the datapath (aliasnetctl pods in the image)"
  pod_cni DEL "$cid" "/run/netns/$POD" || fail "DEL through the installed plugin"
  for _ in $(seq 50); do [[ -z $(node_links "$NODE") ]] && break; sleep 0.1; done
  [[ -z $(leases "$sock") ]] || fail "lease left after DEL: $(leases "$sock")"
  [[ -z $(node_links "$NODE") ]] || fail "host veth left after DEL: $(node_links "$NODE")"
  [[ -z $(node_pod_routes "$NODE") ]] || fail "route left after DEL: $(node_pod_routes "$NODE")"

  # --- removal: docs/uninstall.md's steps ---
  local grace code
  grace=$(podspec grace "$NODE_YAML" aliasnet-node)
  for c in shaperd ipamd; do
    t0=$SECONDS
    pm stop -t "$grace" "$c" >/dev/null || fail "podman stop $c"
    code=$(pm inspect -f '{{.State.ExitCode}}' "$c")
    assert_eq "$code" 0 "$c's exit code on SIGTERM (stopped in $((SECONDS - t0)) s)"
    pm rm "$c" >/dev/null
  done
  podspec prepare "$UNINSTALL_YAML" aliasnet-uninstall || fail "podspec.py prepare (uninstall)"
  run_container "$UNINSTALL_YAML" aliasnet-uninstall uninstall
  run_container "$UNINSTALL_YAML" aliasnet-uninstall "done"
  [[ $(pm inspect -f '{{.State.Running}}' "done") == true ]] || fail "the uninstall DaemonSet's done container is not running"
  pm rm -f -t 0 "done" >/dev/null
  # "Once a node has no aliasnet pods left, remove the pins."
  mns rm -rf "$H/sys/fs/bpf/aliasnet"
  local left expect
  left=$(host_tree)
  # What docs/uninstall.md says stays: node-pools.toml, the lease store, the plugin log, the
  # socket directory; the directories the DaemonSets' hostPath volumes created.
  expect=$(printf '%s\n' 'd ./etc' 'd ./etc/aliasnet' 'f ./etc/aliasnet/node-pools.toml' 'd ./etc/cni' 'd ./etc/cni/net.d' \
    'd ./opt' 'd ./opt/cni' 'd ./opt/cni/bin' 'd ./run' 'd ./run/aliasnet' 'd ./sys' 'd ./sys/fs' 'd ./sys/fs/bpf' \
    'd ./var' 'd ./var/lib' 'd ./var/lib/aliasnet' 'd ./var/log' 'd ./var/log/aliasnet' 'f ./var/log/aliasnet/cni.log')
  diff <(grep -v '^. ./var/lib/aliasnet/' <<<"$left" | sort) <(sort <<<"$expect") >"$S/left.diff" ||
    fail "after uninstall the node holds other files than docs/uninstall.md lists: $(cat "$S/left.diff")"
  # The node netns: no pod interface, route, qdisc or program of aliasnet's left.
  [[ -z $(node_links "$NODE") && -z $(node_pod_routes "$NODE") ]] || fail "interfaces or routes left in the node"
  out=$(in_ns "$NODE" bpftool -j net show | jq -c '[.[] | .. | objects | select(has("prog_id") or has("id"))]')
  assert_eq "$out" "[]" "eBPF programs attached in the node after the pins were removed"
  out=$(in_ns "$NODE" tc qdisc show dev eth0)
  grep -q 'htb\|clsact' <<<"$out" && fail "qdiscs left on the uplink: $out"
  [[ -z $(pm ps -aq) ]] || fail "containers left: $(pm ps -a)"
  log "uninstalled: only what docs/uninstall.md keeps is left"
  # docs/uninstall.md: "To purge as well, add - --purge to the uninstall init container's command."
  run_container "$UNINSTALL_YAML" aliasnet-uninstall uninstall --purge
  left=$(host_tree | grep -v '^d ' || true)
  [[ -z $left ]] || fail "files left after --purge: $left"
  log "purged: only the volumes' empty directories are left; $((SECONDS - t_start)) s in all"
}

run_tests "$@"
