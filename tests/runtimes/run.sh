#!/usr/bin/env bash
# Packaging and real-runtime tests: install.sh, the manifests, podman 4.3 (CNI backend),
# containerd 1.6 `ctr run --cni`, containerd 1.6's CRI plugin with bandwidth annotations (the
# kubelet's path) and the node image (built offline, run as the DaemonSet runs it), each
# against the built binaries (ALIASNET_BIN_DIR, default target/release). Root only;
# everything happens in namespaces and scratch directories the tests create, and each test
# checks that the root network namespace did not change.
#   bash tests/runtimes/run.sh            # all files
#   bash tests/runtimes/run.sh podman     # one file
set -euo pipefail
cd "$(dirname "$0")"
[[ $(id -u) == 0 ]] || {
  echo "run as root: the tests create network and mount namespaces" >&2
  exit 1
}
files=(install_sh manifests podman containerd cri image)
(($#)) && files=("$@")
passed=0 failed=0 skipped=0 rc=0
for f in "${files[@]}"; do
  echo "== tests/runtimes/$f.sh" >&2
  out=$(bash "./$f.sh" 2> >(cat >&2)) || rc=1
  echo "$out"
  read -r p fl sk < <(sed -nE 's/.*: ([0-9]+) passed, ([0-9]+) failed, ([0-9]+) skipped$/\1 \2 \3/p' <<<"$out")
  passed=$((passed + ${p:-0}))
  failed=$((failed + ${fl:-1}))
  skipped=$((skipped + ${sk:-0}))
done
echo "runtimes: $passed passed, $failed failed, $skipped skipped"
exit "$rc"
