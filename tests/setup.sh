#!/usr/bin/env bash
# Installs what building, testing and demoing aliasnet needs on a fresh Debian 12 machine, and
# mounts bpffs. Idempotent; safe to run on every test run.
set -euo pipefail

pkgs=(
  clang-19 llvm-19 libbpf-dev bpftool         # eBPF programs (C, built by ebpf/build.rs)
  iproute2 util-linux procps                    # ip, nsenter, sysctl for the netns test fabric
  iputils-ping tcpdump iperf3 ethtool jq        # traffic checks and captures in tests
  containernetworking-plugins                   # reference ptp/host-local/bandwidth for benchmarks
  prometheus                                    # promtool + a real Prometheus for the metrics tests
  podman runc conmon containerd busybox-static catatonit uidmap slirp4netns fuse-overlayfs  # tests/runtimes: real runtimes
  shellcheck inotify-tools strace python3-venv iptables                                      # tests/runtimes: install.sh checks
  mmdebstrap python3-yaml                       # tests/runtimes/image.sh: the image's base without a registry, the manifests
  python3-grpcio                                # tests/runtimes/cri_client.py: a minimal CRI client (Debian 12 has no crictl)
  etcd-server etcd-client                       # cluster budgets: a real 3-member etcd in the tests, etcdctl to inspect it
  protobuf-compiler libprotobuf-dev             # etcd-client's build compiles etcd's .proto files (and Google's well-known types)
  faketime                                      # cluster budgets: a node whose wall clock steps
)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -o DPkg::Lock::Timeout=900 \
    --no-install-recommends "${missing[@]}" >/dev/null
fi

# tests/runtimes/manifests.sh: offline Kubernetes schema validation.
[ -x /var/tmp/aliasnet-kv/bin/kubernetes-validate ] || {
  python3 -m venv /var/tmp/aliasnet-kv && /var/tmp/aliasnet-kv/bin/pip install -q kubernetes-validate==1.37.0; }

# Pinned eBPF objects live under /sys/fs/bpf/aliasnet; a fresh machine has no bpffs mounted.
mountpoint -q /sys/fs/bpf || mount -t bpf -o mode=0700 bpf /sys/fs/bpf
