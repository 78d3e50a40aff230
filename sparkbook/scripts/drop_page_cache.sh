#!/usr/bin/env bash
# Drop this node's page cache just before vLLM starts (05, serving.drop_page_cache: true): `sync`,
# then 1 into /proc/sys/vm/drop_caches (the page cache only; dentries and inodes stay), as root or
# through `sudo -n tee /proc/sys/vm/drop_caches`, which never prompts (it refuses where a password
# would be asked). sudoers matches a command's arguments exactly: the command is always that one,
# and a refusal prints the sudoers line that allows it.
# Prints, in sections: "@@ before" and "@@ after" (the MemTotal, MemFree, MemAvailable and Cached
# lines of meminfo), "@@ status" ("dropped" or "refused: WHY") and, when sudo refused, "@@ sudoers".
# Usage: drop_page_cache.sh [PROC]
#   PROC  an absolute path standing for /proc (the tests' folder of their own); sparkbook gives none
set -euo pipefail
export LC_ALL=C
proc=${1:-/proc}
case $proc in
  /*) ;;
  *)
    echo "@@ status"
    echo "refused: PROC must be an absolute path"
    exit 2
    ;;
esac
target="$proc/sys/vm/drop_caches"

mem() {
  grep -E '^(MemTotal|MemFree|MemAvailable|Cached):' "$proc/meminfo" || true
}

echo "@@ before"
mem
sync
sudoers=""
if [ "$(id -u)" -eq 0 ]; then
  if err=$({ echo 1 >"$target"; } 2>&1); then status=dropped; else status="refused: $err"; fi
elif err=$(echo 1 | sudo -n tee "$target" 2>&1 >/dev/null); then
  status=dropped
else
  status="refused: ${err:-sudo -n tee $target failed}"
  sudoers="$(id -un) ALL=(root) NOPASSWD: /usr/bin/tee /proc/sys/vm/drop_caches"
fi
echo "@@ after"
mem
echo "@@ status"
echo "$status" | head -n 1
if [ -n "$sudoers" ]; then
  echo "@@ sudoers"
  echo "$sudoers"
fi
