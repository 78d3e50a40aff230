#!/usr/bin/env bash
# `sparkbook fabric` on one node: the netplan file of the CX-7 rails planned, applied under a guard
# that runs on this node and rolls the change back by itself, and restored.
#
#   plan TARGET TEXT IFACE...   read-only. Sections: "@@ current" (TARGET's text; "@@ target" says
#        present, absent or unreadable), "@@ others" (the other netplan files naming an IFACE; ?FILE
#        one that cannot be read), "@@ nm" (IFACE=NetworkManager's profile on it), "@@ generate"
#        (netplan's own parser and generator run on a copy of the node's files with TEXT as
#        TARGET, in a scratch root; its output, then rc=N), "@@ links" (ip -j addr show), "@@ root"
#        (root, sudo, or the sudoers line that would allow apply).
#   apply TARGET TEXT DEADLINE TXN IFACE...   (root) backs up /etc/netplan and the IFACEs'
#        addresses and MTU into /var/lib/sparkbook/fabric/TXN, then starts the guard, detached,
#        and returns: the guard writes TARGET, runs `netplan apply`, and unless `confirm TXN`
#        comes within DEADLINE seconds (sparkbook sends it over a fresh SSH connection once the
#        rails are as planned), or when `abort TXN WHY` comes, restores the backup and re-applies.
#   status TXN    (root) "@@ state" (applying, applied, confirmed, rolling-back, rolled-back,
#                 restored), "@@ why"
#                 (the rollback's reason), "@@ log" (the guard's), "@@ links"
#   confirm TXN | abort TXN WHY   (root) as said above; both wait for the guard's answer
#   restore [TXN] (root) the newest confirmed change (or TXN) undone: TARGET as it was (or gone),
#                 netplan applied, the IFACEs' addresses and MTU as they were; "@@ identical" says
#                 whether every netplan file's SHA-256 is the one recorded before the change.
# Root: as root, or the same program through `sudo -n bash`, which never prompts; a refusal prints
# "@@ refused" and the sudoers line. Values are arguments, never part of the program.
set -euo pipefail
export LC_ALL=C
store=/var/lib/sparkbook/fabric
cmd=${1:-}
[ $# -gt 0 ] && shift

log() { echo "$(date -u +%FT%TZ) $*"; }

as_root() {  # runs the rest of this subcommand as root, or says why it cannot
  [ "$(id -u)" -eq 0 ] && return 0
  local bash_path
  bash_path=$(command -v bash)
  if sudo -n -l "$bash_path" >/dev/null 2>&1; then
    sudo -n -- "$bash_path" -c "$BASH_EXECUTION_STRING" fabric.sh "$cmd" "$@"
    exit $?
  fi
  echo "@@ refused"
  echo "$(id -un) ALL=(root) NOPASSWD: $bash_path"
  exit 3
}

txn_dir() {  # the change's folder; its name is sparkbook's own stamp, never a path
  [[ $1 =~ ^[0-9A-Za-z][0-9A-Za-z_.-]*$ ]] || { echo "fabric.sh: bad change name" >&2; exit 2; }
  echo "$store/$1"
}

read_file() {  # a file's text, through sudo -n where it is root's alone (netplan's are mode 600)
  if [ -r "$1" ]; then cat -- "$1"; else sudo -n cat -- "$1" 2>/dev/null; fi
}

addresses() { ip -o -4 addr show dev "$1" scope global | awk '{print $4}'; }
mtu() { ip -o link show dev "$1" | sed -n 's/.* mtu \([0-9]*\) .*/\1/p'; }

state_of() {
  local dir=$1
  for s in restored rolled-back rolling-back confirmed applied; do
    [ -e "$dir/$s" ] && { echo "$s"; return; }
  done
  echo applying
}

put_back() {  # the change in $1 undone: its target as it was, netplan applied, the rails as they were
  local dir=$1 target name i a
  target=$(cat "$dir/target")
  name=${target##*/}
  if [ -e "$dir/netplan/$name" ]; then cp -a -- "$dir/netplan/$name" "$target"; else rm -f -- "$target"; fi
  netplan apply >>"$dir/restore.log" 2>&1 || log "netplan apply failed while restoring (see restore.log)"
  while IFS= read -r i; do
    ip link show dev "$i" >/dev/null 2>&1 || continue
    for a in $(addresses "$i"); do grep -qxF -- "$a" "$dir/addr.$i" || ip addr del "$a" dev "$i"; done
    while IFS= read -r a; do
      [ -n "$a" ] && ! addresses "$i" | grep -qxF -- "$a" && ip addr add "$a" dev "$i"
    done <"$dir/addr.$i"
    ip link set dev "$i" mtu "$(cat "$dir/mtu.$i")"
  done <"$dir/ifaces"
}

case $cmd in
plan)
  target=$1 text=$2
  shift 2
  echo "@@ target"
  if [ ! -e "$target" ]; then echo absent; elif read_file "$target" >/dev/null; then echo present; else echo unreadable; fi
  echo "@@ current"
  [ -e "$target" ] && { read_file "$target" || true; }
  scratch=$(mktemp -d)
  trap 'rm -rf -- "$scratch"' EXIT
  echo "@@ others"
  for f in /lib/netplan/*.yaml /etc/netplan/*.yaml /run/netplan/*.yaml; do
    if [ ! -f "$f" ] || [ "$f" = "$target" ]; then continue; fi
    mkdir -p "$scratch${f%/*}"
    if ! read_file "$f" >"$scratch$f"; then echo "?$f"; continue; fi
    chmod 600 "$scratch$f"
    for i in "$@"; do grep -qw -- "$i" "$scratch$f" && { echo "$f"; break; }; done
  done
  echo "@@ nm"
  if command -v nmcli >/dev/null; then
    for i in "$@"; do echo "$i=$(nmcli --escape no -g GENERAL.CONNECTION device show "$i" 2>/dev/null || true)"; done
  fi
  echo "@@ generate"
  mkdir -p "$scratch${target%/*}"
  printf '%s' "$text" >"$scratch$target"
  chmod 600 "$scratch$target"
  if command -v netplan >/dev/null; then
    rc=0
    netplan generate --root-dir "$scratch" 2>&1 || rc=$?
    echo "rc=$rc"
  else
    echo "netplan unavailable"
  fi
  echo "@@ links"
  ip -j addr show
  echo "@@ root"
  if [ "$(id -u)" -eq 0 ]; then echo root
  elif sudo -n -l "$(command -v bash)" >/dev/null 2>&1; then echo sudo
  else echo "$(id -un) ALL=(root) NOPASSWD: $(command -v bash)"; fi
  ;;
apply)
  as_root "$@"
  target=$1 text=$2 deadline=$3
  dir=$(txn_dir "$4")
  shift 4
  case $target in /etc/netplan/*.yaml) ;; *) echo "fabric.sh: refusing to write $target" >&2; exit 2 ;; esac
  [[ $deadline =~ ^[0-9]+$ ]] || { echo "fabric.sh: bad deadline" >&2; exit 2; }
  umask 077
  mkdir -p "$store"
  mkdir -- "$dir"
  mkdir "$dir/netplan"
  cp -a /etc/netplan/. "$dir/netplan/"
  (cd /etc/netplan && for f in *.yaml; do [ -e "$f" ] && sha256sum -- "$f"; done) >"$dir/before.sha256"
  printf '%s\n' "$target" >"$dir/target"
  printf '%s' "$text" >"$dir/new.yaml"
  printf '%s\n' "$@" >"$dir/ifaces"
  for i in "$@"; do
    addresses "$i" >"$dir/addr.$i"
    mtu "$i" >"$dir/mtu.$i"
  done
  echo $(($(date +%s) + deadline)) >"$dir/deadline"
  setsid bash -c "$BASH_EXECUTION_STRING" fabric.sh guard "$dir" "$$" </dev/null >>"$dir/guard.log" 2>&1 &
  echo "@@ started"
  echo "$dir"
  ;;
guard)
  dir=$1 starter=$2
  # This shell's answer ("started") must leave before a change that cuts the management address
  # can swallow it: wait for the starting shell to end, and a second for sshd to send it on.
  while kill -0 "$starter" 2>/dev/null; do sleep 0.1; done
  sleep 1
  target=$(cat "$dir/target")
  install -m 600 -- "$dir/new.yaml" "$target"
  log "wrote $target; netplan apply"
  why=""
  if netplan apply >"$dir/apply.log" 2>&1; then
    touch "$dir/applied"
    log "applied; waiting for sparkbook's confirmation until $(date -u -d "@$(cat "$dir/deadline")" +%T)"
    while [ "$(date +%s)" -lt "$(cat "$dir/deadline")" ]; do
      if [ -e "$dir/confirmed" ]; then log "confirmed"; exit 0; fi
      if [ -e "$dir/abort" ]; then why=$(cat "$dir/abort"); break; fi
      sleep 0.5
    done
    [ -n "$why" ] || why="no confirmation from sparkbook within the deadline (the node did not answer a fresh SSH connection, or sparkbook stopped)"
  else
    why="netplan apply failed (exit $?): $(tail -n 3 "$dir/apply.log" | tr '\n' ' ')"
  fi
  printf '%s\n' "$why" >"$dir/rolling-back"
  put_back "$dir"
  printf '%s\n' "$why" >"$dir/rolled-back"
  log "rolled back: $why"
  ;;
status)
  as_root "$@"
  dir=$(txn_dir "$1")
  [ -d "$dir" ] || { echo "fabric.sh: no change $1 on this node" >&2; exit 2; }
  echo "@@ state"
  state_of "$dir"
  echo "@@ why"
  cat "$dir/rolled-back" 2>/dev/null || true
  echo "@@ log"
  tail -n 20 "$dir/guard.log" 2>/dev/null || true
  echo "@@ links"
  ip -j addr show
  ;;
confirm | abort)
  as_root "$@"
  dir=$(txn_dir "$1")
  [ "$(state_of "$dir")" = applied ] || { echo "@@ state"; state_of "$dir"; exit 4; }
  if [ "$cmd" = confirm ]; then touch "$dir/confirmed"; else printf '%s\n' "$2" >"$dir/abort"; fi
  for _ in $(seq 600); do
    case $(state_of "$dir") in applied) sleep 0.1 ;; *) break ;; esac
  done
  echo "@@ state"
  state_of "$dir"
  ;;
restore)
  as_root "$@"
  if [ $# -gt 0 ]; then
    dir=$(txn_dir "$1")
  else
    dir=""
    for d in "$store"/*/; do [ -e "$d/confirmed" ] && [ ! -e "$d/restored" ] && dir=${d%/}; done
  fi
  if [ -z "$dir" ] || [ ! -e "$dir/confirmed" ] || [ -e "$dir/restored" ]; then
    echo "@@ nothing"
    echo "no change of sparkbook's to restore on this node"
    exit 0
  fi
  put_back "$dir"
  log "restored on request" >>"$dir/guard.log"
  touch "$dir/restored"
  echo "@@ change"
  echo "${dir##*/}"
  echo "@@ identical"
  now=$(cd /etc/netplan && for f in *.yaml; do [ -e "$f" ] && sha256sum -- "$f"; done)
  if [ "$now" = "$(cat "$dir/before.sha256")" ]; then echo yes; else echo no; diff <(echo "$now") "$dir/before.sha256" || true; fi
  echo "@@ links"
  ip -j addr show
  ;;
*)
  echo "usage: fabric.sh plan|apply|status|confirm|abort|restore ..." >&2
  exit 2
  ;;
esac
