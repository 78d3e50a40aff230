#!/usr/bin/env bash
# Copy model files from this node (the head, or a worker that holds the model) to workers over the
# fabric, every worker at once: one rsync per worker of the files named (relative to MODEL_DIR, the
# same folder on every node), its progress lines prefixed "[WORKER] " (each ended, even one cut
# short), then one line "DONE WORKER EXIT_CODE LAST_ERROR_LINE" each.
#
# rsync -I sends each file named even where size and time agree (the manifest found them
# different), with rsync's delta transfer. An interrupted copy resumes: the receiving rsync keeps
# what arrived in PARTIAL_DIR (a hidden folder beside the file, inside the model folder, which the
# manifest leaves out), never under the file's real name, and the next copy starts from it. Nothing
# is ever deleted on the worker: a name this node no longer holds is skipped (the manifests
# compared after the copy say so). A copy that moves no data for STALL_S seconds stops (rsync
# --timeout): one stuck worker fails by name, the others go on.
#
# Usage: model_sync.sh MODEL_DIR PARTIAL_DIR STALL_S WORKER TARGET RSH COUNT FILE... [WORKER TARGET RSH COUNT FILE...]...
#   WORKER  a name for the progress and DONE lines; TARGET: the worker as RSH reaches it (user@address)
#   RSH     the remote shell rsync runs to reach it, with its options ("ssh -o BatchMode=yes ...")
#   COUNT   how many FILE arguments follow for this worker
#   e.g. model_sync.sh /models/m .sparkbook-partial 120 spark-2 me@10.0.0.2 "ssh -o BatchMode=yes" 1 config.json
set -euo pipefail
src=${1%/}/ partial=$2 stall=$3
shift 3
errors=$(mktemp -d)
trap 'rm -rf -- "$errors"' EXIT

copy() {  # WORKER TARGET RSH FILE...
  local name=$1 target=$2 rsh=$3 code=0
  shift 3
  printf '%s\0' "$@" \
    | rsync -a -I --mkpath --from0 --files-from=- --ignore-missing-args --partial-dir="$partial" \
        --timeout="$stall" --info=progress2 --no-inc-recursive -e "$rsh" -- "$src" "$target:$src" \
        2>"$errors/$name" \
    | stdbuf -oL tr '\r' '\n' | awk -v p="[$name] " '{ print p $0; fflush() }' || code=$?
  echo "DONE $name $code $(tail -n 1 "$errors/$name")"
}

while [ $# -gt 0 ]; do
  name=$1 target=$2 rsh=$3 count=$4
  shift 4
  copy "$name" "$target" "$rsh" "${@:1:count}" &
  shift "$count"
done
wait
