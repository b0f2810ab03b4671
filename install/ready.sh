#!/usr/bin/env bash
# Readiness / liveness probe of the aliasnet node agent: asks the INSTALLED plugin, with the
# INSTALLED network config, whether an ADD would succeed now (CNI STATUS). So the probe fails
# when the conflist or the plugin binary is missing, the config is broken, the daemon's
# socket is not the one the conflist names, the daemon is down, or no address is free.
#
#   ready.sh [--conflist FILE] [--cni-bin-dir DIR] [--alive] [--no-datapath]
#
# --alive (liveness): succeed as long as the daemon answers, even when it has no free address;
# restarting the daemon would not create addresses.
# --no-datapath: leave the eBPF datapath out, for a container that cannot see it (the ipamd
# container has no bpffs and no CAP_BPF; the shaperd container's probe checks the pins).
#
# STATUS needs cniVersion 1.1.0, and the conflist says 1.0.0 for the runtimes that reject 1.1.0
# results (podman 4.3). STATUS returns no result, so running the plugin's own entry with the
# version raised is exactly what a 1.1.0 runtime would send.
set -euo pipefail

conflist=/etc/cni/net.d/10-aliasnet.conflist
cni_bin_dir=/opt/cni/bin
alive=0
no_datapath=0
while (($#)); do
  case $1 in
  --conflist=* | --cni-bin-dir=*)
    # The DaemonSet's probes use the --opt=value form.
    set -- "${1%%=*}" "${1#*=}" "${@:2}"
    continue
    ;;
  --conflist)
    conflist=${2:?--conflist needs a value}
    shift
    ;;
  --cni-bin-dir)
    cni_bin_dir=${2:?--cni-bin-dir needs a value}
    shift
    ;;
  --alive) alive=1 ;;
  --no-datapath) no_datapath=1 ;;
  *)
    echo "ready.sh: unknown argument $1" >&2
    exit 2
    ;;
  esac
  shift
done

fail() {
  echo "not ready: $*"
  exit 1
}

[[ -f $conflist ]] || fail "network config $conflist is missing (the install init container did not run?)"
plugin=$cni_bin_dir/aliasnet
[[ -x $plugin ]] || fail "$plugin is missing"
# Without logFile: a probe every few seconds would flood the plugin's log; STATUS errors go to
# stderr instead, which is this probe's output.
conf=$(jq -ce --argjson nodp "$no_datapath" '(.plugins[] | select(.type == "aliasnet") | del(.logFile, .logLevel))
    + {cniVersion: "1.1.0", name: .name} + (if $nodp == 1 then {datapath: "off"} else {} end)' "$conflist" 2>&1) ||
  fail "network config $conflist is unreadable or has no aliasnet plugin: $conf"

rc=0
out=$(CNI_COMMAND=STATUS CNI_PATH=$cni_bin_dir "$plugin" <<<"$conf" 2>&1) || rc=$?
if ((rc == 0)); then
  echo "ready"
  exit 0
fi
# The plugin reports "aliasnet-ipamd cannot allocate" when the daemon answered but has no
# free address (see cni-plugin/src/status.rs).
if ((alive)) && grep -q 'cannot allocate' <<<"$out"; then
  echo "alive (not ready): $out"
  exit 0
fi
fail "$out"
