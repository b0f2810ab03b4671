#!/usr/bin/env bash
# The test command (README Quickstart): installs prerequisites, builds every binary, runs all
# unit and integration tests. Integration tests create and remove their own network
# namespaces; nothing in the root namespace is changed.
#
# Builds use the `ci` profile (release optimisation without LTO: most of the build time of
# the test binaries otherwise goes to LTO). The fabric's nodes have 9000-byte MTUs; the
# datapath suites run a second time on 1500-byte nodes.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "run as root: the tests create network namespaces" >&2; exit 1; }
bash tests/setup.sh
profile=${ALIASNET_TEST_PROFILE:-ci}
# --locked: the binaries (and the node image tests/runtimes/image.sh builds from them) come from
# the committed Cargo.lock.
cargo build --profile "$profile" --locked --workspace --bins
export ALIASNET_BIN_DIR="$PWD/target/$profile"
threads=${TEST_THREADS:-4}
# Every cargo test run's "test result:" lines are kept; their totals are printed at the end,
# also when a run fails (the script still exits with the failure). Tests that need root or a
# tool fail without them, so "passed" counts only tests that ran.
results=$(mktemp)
totals() {
  local rc=$?
  awk '/^test result:/ { for (i = 2; i <= NF; i++) {
         if ($i ~ /^passed;/) p += $(i - 1); if ($i ~ /^failed;/) f += $(i - 1)
         if ($i ~ /^ignored;/) g += $(i - 1) } }
       END { printf "== cargo tests: %d ran, %d passed, %d failed, %d ignored\n", p + f, p, f, g }' "$results"
  rm -f "$results"
  exit "$rc"
}
trap totals EXIT
cargo_test() { cargo test --profile "$profile" "$@" | tee -a "$results"; }
cargo_test --workspace -- --test-threads="$threads"
echo "== datapath suites on 1500-byte nodes"
export ALIASNET_TEST_MTU=1500
cargo_test -p aliasnet-shaper --test shaping --test attach -- --test-threads="$threads"
cargo_test -p aliasnet-tests --test datapath --test datapath_lifecycle --test spoofing --test foundation --test cni_verbs -- --test-threads="$threads"
unset ALIASNET_TEST_MTU
# Real runtimes (podman, containerd, containerd's CRI plugin at both MTUs), install.sh, the
# manifests and the node image; podman and ctr again on 1500-byte nodes. Each run ends with
# "runtimes: N passed, N failed, N skipped".
bash tests/runtimes/run.sh
ALIASNET_TEST_MTU=1500 bash tests/runtimes/run.sh podman containerd
