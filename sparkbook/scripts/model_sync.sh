#!/usr/bin/env bash
# Copy model files from this node (the head) to workers over the fabric, every worker at once: one
# rsync per worker of the files named (relative to MODEL_DIR, the same folder on every node), its
# progress lines prefixed "[WORKER] ", then one line "DONE WORKER EXIT_CODE LAST_ERROR_LINE" each.
#
# rsync -I sends each file named even where size and time agree (the manifest found them
# different), with rsync's delta transfer; partial files wait in PARTIAL_DIR (inside the model
# folder), so a resumed copy continues them and no truncated file ever sits under its real name;
# names absent here are deleted on the worker.
#
# Usage: model_sync.sh MODEL_DIR RSH PARTIAL_DIR WORKER TARGET COUNT FILE... [WORKER TARGET COUNT FILE...]...
#   RSH     the remote shell rsync runs, with its options ("ssh -o BatchMode=yes ...")
#   WORKER  a name for the progress and DONE lines; TARGET: the worker as RSH reaches it (user@address)
#   COUNT   how many FILE arguments follow for this worker
set -euo pipefail
src=${1%/}/ rsh=$2 partial=$3
shift 3
errors=$(mktemp -d)
trap 'rm -rf -- "$errors"' EXIT

copy() {  # WORKER TARGET FILE...
  local name=$1 target=$2 code=0
  shift 2
  printf '%s\0' "$@" \
    | rsync -a -I --mkpath --from0 --files-from=- --delete-missing-args --partial-dir="$partial" \
        --info=progress2 --no-inc-recursive -e "$rsh" -- "$src" "$target:$src" 2>"$errors/$name" \
    | stdbuf -oL tr '\r' '\n' | sed -u "s/^/[$name] /" || code=$?
  echo "DONE $name $code $(tail -n 1 "$errors/$name")"
}

while [ $# -gt 0 ]; do
  name=$1 target=$2 count=$3
  shift 3
  copy "$name" "$target" "${@:1:count}" &
  shift "$count"
done
wait
