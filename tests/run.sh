#!/usr/bin/env bash
# The test command (README Quickstart): installs prerequisites, builds every binary, runs all
# unit and integration tests. Integration tests create and remove their own network
# namespaces; nothing in the root namespace is changed.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "run as root: the tests create network namespaces" >&2; exit 1; }
bash tests/setup.sh
cargo build --release --workspace --bins
export ALIASNET_BIN_DIR="$PWD/target/release"
cargo test --release --workspace -- --test-threads="${TEST_THREADS:-4}"
# Real runtimes (podman, containerd), install.sh and manifests; ends with "runtimes: N passed, N failed".
bash tests/runtimes/run.sh
