#!/usr/bin/env bash
# Installs aliasnet on one node, or removes it. Used by the DaemonSet's init container and
# usable by hand (docs/install.md).
#
# Install order, so that a container runtime never sees a network whose plugin is missing:
#   1. validate every input (nothing on the node changes if one is bad);
#   2. the `aliasnet` plugin into the CNI bin dir (and the daemons into --daemon-dir, if given);
#   3. /etc/aliasnet/ipamd.toml and shaper.toml, only where absent unless --force;
#   4. the network config (conflist), last.
# Every file is written to a temporary name in its destination directory, fsync'd, then
# renamed over the target: a reader (or an exec by the kubelet) sees the old file or the new
# one, never a partial one. An unchanged file is left alone, so a re-run changes nothing.
#
# --uninstall reverses it: the conflist first (new pods stop being sent to aliasnet), then the
# plugin, then the configs. It never touches interfaces or routes: running pods keep their
# networking. /var/lib/aliasnet (the daemon's leases) is kept unless --purge.
set -euo pipefail

prog=install.sh
script_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

usage() {
  cat <<EOF
Usage: $prog [options]

  --bin-dir DIR        where the built binaries are (aliasnet, aliasnet-ipamd, aliasnet-shaperd)
                       [default: $script_dir/bin]
  --cni-bin-dir DIR    CNI plugin directory [default: /opt/cni/bin]
  --cni-conf-dir DIR   CNI network config directory [default: /etc/cni/net.d]
  --config-dir DIR     aliasnet config directory [default: /etc/aliasnet]
  --config-src DIR     sources of ipamd.toml, shaper.toml and the conflist
                       [default: $script_dir/etc]
  --conflist FILE      network config source [default: CONFIG_SRC/10-aliasnet.conflist]
  --conflist-name NAME file name in the CNI conf dir [default: 10-aliasnet.conflist]
  --daemon-dir DIR     also install aliasnet-ipamd and aliasnet-shaperd there (by-hand
                       installs; the DaemonSet runs them from its image) [default: none]
  --state-dir DIR      daemon state, removed only by --purge [default: /var/lib/aliasnet]
  --log-dir DIR        plugin logs, removed only by --purge [default: /var/log/aliasnet]
  --force              overwrite existing CONFIG_DIR/ipamd.toml and shaper.toml
  --uninstall          remove the conflist, then the plugin, then the configs
  --purge              with --uninstall: also remove the state, log and config directories
  --dry-run            print what would change, change nothing
  -h, --help           this help

ipamd.toml: when the source defines no [[pool]], CONFIG_DIR/node-pools.toml (the node's own
address ranges, written by node provisioning) is appended to it.
EOF
}

log() { printf '%s: %s\n' "$prog" "$*" >&2; }
die() {
  log "error: $*"
  exit 1
}

bin_dir=$script_dir/bin
cni_bin_dir=/opt/cni/bin
cni_conf_dir=/etc/cni/net.d
config_dir=/etc/aliasnet
config_src=$script_dir/etc
conflist_src=
conflist_name=10-aliasnet.conflist
daemon_dir=
state_dir=/var/lib/aliasnet
log_dir=/var/log/aliasnet
force=0 uninstall=0 purge=0 dry_run=0

while (($#)); do
  opt=$1
  val=
  case $opt in
  --*=*)
    val=${opt#*=}
    opt=${opt%%=*}
    ;;
  esac
  case $opt in
  --bin-dir | --cni-bin-dir | --cni-conf-dir | --config-dir | --config-src | --conflist | \
    --conflist-name | --daemon-dir | --state-dir | --log-dir)
    if [[ $1 != *=* ]]; then
      (($# >= 2)) || die "$opt needs a value"
      val=$2
      shift
    fi
    [[ -n $val ]] || die "$opt needs a non-empty value"
    case $opt in
    --bin-dir) bin_dir=$val ;;
    --cni-bin-dir) cni_bin_dir=$val ;;
    --cni-conf-dir) cni_conf_dir=$val ;;
    --config-dir) config_dir=$val ;;
    --config-src) config_src=$val ;;
    --conflist) conflist_src=$val ;;
    --conflist-name) conflist_name=$val ;;
    --daemon-dir) daemon_dir=$val ;;
    --state-dir) state_dir=$val ;;
    --log-dir) log_dir=$val ;;
    esac
    ;;
  --force) force=1 ;;
  --uninstall) uninstall=1 ;;
  --purge) purge=1 ;;
  --dry-run) dry_run=1 ;;
  -h | --help)
    usage
    exit 0
    ;;
  *)
    usage >&2
    die "unknown argument: $1"
    ;;
  esac
  shift
done

[[ -n $conflist_src ]] || conflist_src=$config_src/$conflist_name
((purge == 0 || uninstall == 1)) || die "--purge only goes with --uninstall"
case $conflist_name in
*/*) die "--conflist-name must be a file name, got '$conflist_name'" ;;
*.conflist) ;;
*) die "--conflist-name must end in .conflist (runtimes load only .conf, .conflist and .json), got '$conflist_name'" ;;
esac

# Temporary files of this run, removed on any exit; the renamed ones are gone by then.
tmp_files=()
staging=
cleanup() {
  local f
  for f in "${tmp_files[@]}"; do [[ -e $f ]] && rm -f -- "$f"; done
  [[ -n $staging && -d $staging ]] && rm -rf -- "$staging"
  return 0
}
trap cleanup EXIT

# fsync a file or directory. coreutils `sync FILE` calls fsync(2) on it.
fsync() { sync -- "$@"; }

# atomic_install SRC DEST MODE: copy SRC to DEST via a temporary name in DEST's directory.
atomic_install() {
  local src=$1 dest=$2 mode=$3 dir tmp
  dir=$(dirname -- "$dest")
  if [[ -f $dest && ! -L $dest ]] && cmp -s -- "$src" "$dest" &&
    [[ $(stat -c %a -- "$dest") == "$mode" ]]; then
    log "unchanged $dest"
    return 0
  fi
  if ((dry_run)); then
    log "would install $dest (mode $mode) from $src"
    return 0
  fi
  mkdir -p -- "$dir"
  # The name cannot end in .conf/.conflist/.json, so a runtime never loads it as a network,
  # and no CNI plugin is called like that.
  tmp=$(mktemp -- "$dir/.$(basename -- "$dest").tmp.XXXXXX")
  tmp_files+=("$tmp")
  cat -- "$src" >"$tmp"
  chmod -- "$mode" "$tmp"
  fsync "$tmp"
  mv -f -T -- "$tmp" "$dest"
  # The rename itself is durable only once the directory is synced.
  fsync "$dir"
  log "installed $dest"
}

# remove_file PATH: unlink and make the unlink durable.
remove_file() {
  local f=$1
  if [[ ! -e $f && ! -L $f ]]; then
    log "absent $f"
    return 0
  fi
  if ((dry_run)); then
    log "would remove $f"
    return 0
  fi
  rm -f -- "$f"
  fsync "$(dirname -- "$f")"
  log "removed $f"
}

remove_tree() {
  local d=$1
  [[ -e $d ]] || return 0
  if ((dry_run)); then
    log "would remove $d (recursively)"
    return 0
  fi
  if mountpoint -q -- "$d"; then
    # A volume (the uninstall DaemonSet mounts the host's directories): only its contents
    # can go.
    find "$d" -mindepth 1 -delete
    log "emptied $d"
    return 0
  fi
  rm -rf -- "$d"
  log "removed $d"
}

conflist_dest=$cni_conf_dir/$conflist_name

dry_note() { if ((dry_run)); then printf ' (dry run: nothing changed)'; fi; }

do_uninstall() {
  # 1. The network config: from now on no new pod is sent to aliasnet. Pods being torn down
  #    still get DEL from the runtime's cached config; the plugin stays for them until step 2.
  remove_file "$conflist_dest"
  # 2. The plugin (and daemons installed by hand).
  remove_file "$cni_bin_dir/aliasnet"
  if [[ -n $daemon_dir ]]; then
    remove_file "$daemon_dir/aliasnet-ipamd"
    remove_file "$daemon_dir/aliasnet-shaperd"
  fi
  # 3. Configs. node-pools.toml belongs to node provisioning: only --purge removes it.
  remove_file "$config_dir/ipamd.toml"
  remove_file "$config_dir/shaper.toml"
  if ((purge)); then
    remove_tree "$config_dir"
    remove_tree "$state_dir"
    remove_tree "$log_dir"
  elif [[ -d $config_dir ]] && ((!dry_run)) && ! mountpoint -q -- "$config_dir"; then
    rmdir --ignore-fail-on-non-empty -- "$config_dir"
  fi
  # Interfaces, routes, eBPF pins (/sys/fs/bpf/aliasnet) and a running daemon are left alone:
  # running pods keep working. docs/uninstall.md says how to remove the pins once the node
  # has no aliasnet pods.
  log "uninstalled$(dry_note)"
}

# check_conflist FILE: the network config the runtime will load. Prints the aliasnet
# plugin's ipamSocket, spoolDir and hostVethPrefix (defaults applied), one a line.
check_conflist() {
  local f=$1 v
  [[ -f $f ]] || die "network config source $f does not exist (--conflist / --config-src)"
  jq -e . "$f" >/dev/null 2>&1 || die "network config $f is not valid JSON: $(jq . "$f" 2>&1 >/dev/null | head -n1)"
  jq -e '.plugins | type == "array" and length > 0' "$f" >/dev/null ||
    die "network config $f has no \"plugins\" list: a .conflist needs {\"cniVersion\", \"name\", \"plugins\": [...]}"
  jq -e '.name | type == "string" and length > 0' "$f" >/dev/null ||
    die "network config $f has no \"name\""
  v=$(jq -r '.cniVersion // ""' "$f")
  case $v in
  0.3.0 | 0.3.1 | 0.4.0 | 1.0.0) ;;
  1.1.0) log "warning: $f has cniVersion 1.1.0: podman 4.3 and other libcni 1.1 runtimes reject 1.1.0 results; 1.0.0 works everywhere" ;;
  "") die "network config $f has no \"cniVersion\"" ;;
  *) die "network config $f has cniVersion \"$v\"; aliasnet supports 0.3.0, 0.3.1, 0.4.0, 1.0.0 and 1.1.0" ;;
  esac
  [[ $(jq '[.plugins[] | select(.type == "aliasnet")] | length' "$f") == 1 ]] ||
    die "network config $f must contain exactly one plugin with \"type\": \"aliasnet\""
  jq -r '.plugins[] | select(.type == "aliasnet") |
    (.ipamSocket // "/run/aliasnet/ipamd.sock"), (.spoolDir // "/var/lib/aliasnet/spool"),
    (.hostVethPrefix // "ali")' "$f"
}

# ipamd_setting CHECK_CONFIG_OUTPUT KEY: a value from `aliasnet-ipamd check-config`'s summary.
ipamd_setting() { awk -v k="$2" '$1 == k { print $2; exit }' <<<"$1"; }

do_install() {
  command -v jq >/dev/null || die "jq is needed to validate the network config (apt-get install jq)"
  [[ -x $bin_dir/aliasnet ]] || die "$bin_dir/aliasnet not found or not executable (--bin-dir)"
  if [[ -n $daemon_dir ]]; then
    local b
    for b in aliasnet-ipamd aliasnet-shaperd; do
      [[ -x $bin_dir/$b ]] || die "$bin_dir/$b not found or not executable (needed by --daemon-dir)"
    done
  fi
  staging=$(mktemp -d)

  # --- 1. validate everything before changing anything ---
  local plugin_keys socket spool prefix
  plugin_keys=$(check_conflist "$conflist_src")
  {
    read -r socket
    read -r spool
    read -r prefix
  } <<<"$plugin_keys"

  # ipamd.toml: the installed one is kept unless --force; a new one is the source plus the
  # node's pools when the source has none.
  local ipamd_new='' ipamd_final=$config_dir/ipamd.toml
  if [[ ! -e $config_dir/ipamd.toml ]] || ((force)); then
    [[ -f $config_src/ipamd.toml ]] || die "$config_src/ipamd.toml does not exist (--config-src)"
    ipamd_new=$staging/ipamd.toml
    cat -- "$config_src/ipamd.toml" >"$ipamd_new"
    if ! grep -Eq '^[[:space:]]*\[\[[[:space:]]*pool[[:space:]]*\]\]' "$ipamd_new"; then
      [[ -f $config_dir/node-pools.toml ]] ||
        die "$config_src/ipamd.toml defines no [[pool]] and $config_dir/node-pools.toml does not exist: write this node's address ranges there (docs/configure.md)"
      printf '\n# ---- appended by install.sh from %s ----\n' "$config_dir/node-pools.toml" >>"$ipamd_new"
      cat -- "$config_dir/node-pools.toml" >>"$ipamd_new"
    fi
    ipamd_final=$ipamd_new
  fi
  if [[ -x $bin_dir/aliasnet-ipamd ]]; then
    local summary
    summary=$(RUST_BACKTRACE=0 "$bin_dir/aliasnet-ipamd" check-config --config "$ipamd_final" 2>&1) ||
      die "ipamd config is invalid: $summary"
    local d_socket d_spool
    d_socket=$(ipamd_setting "$summary" socket)
    d_spool=$(ipamd_setting "$summary" spool_dir)
    [[ $d_socket == "$socket" ]] ||
      die "the network config's ipamSocket ($socket) differs from ipamd.toml's socket ($d_socket): the plugin would not reach the daemon"
    [[ $d_spool == "$spool" ]] ||
      die "the network config's spoolDir ($spool) differs from ipamd.toml's spool_dir ($d_spool): releases spooled while the daemon is down would never be applied"
  else
    log "warning: $bin_dir/aliasnet-ipamd not found: ipamd.toml not validated"
  fi
  local d_prefix
  d_prefix=$(sed -nE 's/^[[:space:]]*host_veth_prefix[[:space:]]*=[[:space:]]*"([^"]*)".*/\1/p' "$ipamd_final" | head -n1)
  [[ -z $d_prefix || $d_prefix == "$prefix" ]] ||
    die "the network config's hostVethPrefix ($prefix) differs from ipamd.toml's host_veth_prefix ($d_prefix)"

  local shaper_new=''
  if [[ ! -e $config_dir/shaper.toml ]] || ((force)); then
    if [[ -f $config_src/shaper.toml ]]; then
      shaper_new=$config_src/shaper.toml
    else
      log "no $config_src/shaper.toml: not installing a shaper policy"
    fi
  fi
  if [[ -n $shaper_new && -x $bin_dir/aliasnet-shaperd ]]; then
    local out
    out=$(RUST_BACKTRACE=0 "$bin_dir/aliasnet-shaperd" --check --config "$shaper_new" 2>&1) ||
      die "shaper policy $shaper_new is invalid: $out"
  elif [[ -n $shaper_new ]]; then
    log "warning: $bin_dir/aliasnet-shaperd not found: shaper.toml not validated"
  fi

  # --- 2. binaries ---
  atomic_install "$bin_dir/aliasnet" "$cni_bin_dir/aliasnet" 755
  if [[ -n $daemon_dir ]]; then
    atomic_install "$bin_dir/aliasnet-ipamd" "$daemon_dir/aliasnet-ipamd" 755
    atomic_install "$bin_dir/aliasnet-shaperd" "$daemon_dir/aliasnet-shaperd" 755
  fi

  # --- 3. daemon configs ---
  if [[ -n $ipamd_new ]]; then
    atomic_install "$ipamd_new" "$config_dir/ipamd.toml" 644
  else
    log "keeping existing $config_dir/ipamd.toml (--force replaces it)"
  fi
  if [[ -n $shaper_new ]]; then
    atomic_install "$shaper_new" "$config_dir/shaper.toml" 644
  elif [[ -e $config_dir/shaper.toml ]]; then
    log "keeping existing $config_dir/shaper.toml (--force replaces it)"
  fi

  # --- 4. the network config, last; only once every plugin it names is in place ---
  local t
  while IFS= read -r t; do
    [[ $t =~ ^[A-Za-z0-9._-]+$ ]] || die "network config names plugin type '$t', which is not a file name"
    if ((dry_run)) && [[ $t == aliasnet ]]; then continue; fi
    [[ -x $cni_bin_dir/$t ]] ||
      die "network config names plugin type '$t', but $cni_bin_dir/$t is not an executable: not writing $conflist_dest"
  done < <(jq -r '.plugins[].type' "$conflist_src")
  atomic_install "$conflist_src" "$conflist_dest" 644
  log "installed$(dry_note)"
}

if ((uninstall)); then
  do_uninstall
else
  do_install
fi
