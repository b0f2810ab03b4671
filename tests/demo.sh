#!/usr/bin/env bash
# The demo (README Quickstart): two simulated nodes on a simulated VNet, pods wired by the real
# `aliasnet` binary, traffic across nodes and to an "internet" host. Everything runs in network
# namespaces that the demo creates and removes.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "run as root: the demo creates network namespaces" >&2; exit 1; }
bash tests/setup.sh
cargo build --release --workspace --bins
ALIASNET_BIN_DIR="$PWD/target/release" exec target/release/aliasnet-demo "$@"
