#!/usr/bin/env bash
# SSH between the nodes over the fabric (`sparkbook fabric`), for this node's SSH user:
#   read PORT   read-only. "@@ hostkeys": this node's sshd host keys, as ssh-keyscan reads them
#               from 127.0.0.1:PORT on the node itself (no network between: what is read is this
#               node's); "@@ pubkey": the user's public key (~/.ssh/id_ed25519.pub, else id_rsa.pub;
#               empty: none); "@@ known_hosts", "@@ authorized_keys": those files as they are.
#   add MARK KNOWN AUTHORIZED   appends the lines of KNOWN to ~/.ssh/known_hosts and of AUTHORIZED
#               to ~/.ssh/authorized_keys (each line ends with the comment MARK, and only lines not
#               there already), making a key pair first where the user has none (its comment MARK).
#   remove MARK removes exactly the lines ending with " MARK" from both files, and the key pair
#               whose public key's comment is MARK: what `add` made, nothing else.
set -euo pipefail
export LC_ALL=C
cmd=${1:-}
[ $# -gt 0 ] && shift
ssh_dir=$HOME/.ssh

case $cmd in
read)
  echo "@@ hostkeys"
  ssh-keyscan -p "$1" -T 5 127.0.0.1 2>/dev/null | grep -v '^#' || true
  echo "@@ pubkey"
  for k in id_ed25519 id_rsa; do
    if [ -f "$ssh_dir/$k.pub" ]; then cat -- "$ssh_dir/$k.pub"; break; fi
  done
  echo "@@ known_hosts"
  cat -- "$ssh_dir/known_hosts" 2>/dev/null || true
  echo "@@ authorized_keys"
  cat -- "$ssh_dir/authorized_keys" 2>/dev/null || true
  ;;
add)
  mark=$1 known=$2 authorized=$3
  umask 077
  mkdir -p -- "$ssh_dir"
  if [ ! -f "$ssh_dir/id_ed25519" ] && [ ! -f "$ssh_dir/id_rsa" ]; then
    ssh-keygen -q -t ed25519 -N "" -C "$mark" -f "$ssh_dir/id_ed25519"
    echo "made $ssh_dir/id_ed25519"
  fi
  for pair in "known_hosts:$known" "authorized_keys:$authorized"; do
    file=$ssh_dir/${pair%%:*}
    touch -- "$file"
    while IFS= read -r line; do
      [ -n "$line" ] || continue
      grep -qxF -- "$line" "$file" || { printf '%s\n' "$line" >>"$file"; echo "added to $file: ${line:0:60}..."; }
    done <<<"${pair#*:}"
  done
  ;;
remove)
  mark=$1
  for file in "$ssh_dir/known_hosts" "$ssh_dir/authorized_keys"; do
    [ -f "$file" ] || continue
    n=$(awk -v m=" $mark" 'substr($0, length($0) - length(m) + 1) == m' "$file" | grep -c '' || true)
    if [ "$n" -gt 0 ]; then
      awk -v m=" $mark" 'substr($0, length($0) - length(m) + 1) != m' "$file" >"$file.sparkbook.tmp"
      chmod --reference="$file" -- "$file.sparkbook.tmp"
      mv -- "$file.sparkbook.tmp" "$file"
      echo "removed $n line(s) from $file"
    fi
  done
  if [ -f "$ssh_dir/id_ed25519.pub" ] && [ "$(awk '{print $3}' "$ssh_dir/id_ed25519.pub")" = "$mark" ]; then
    rm -f -- "$ssh_dir/id_ed25519" "$ssh_dir/id_ed25519.pub"
    echo "removed the key pair $ssh_dir/id_ed25519 (made by sparkbook)"
  fi
  ;;
*)
  echo "usage: ssh_mesh.sh read PORT | add MARK KNOWN AUTHORIZED | remove MARK" >&2
  exit 2
  ;;
esac
