#!/usr/bin/env bash
# Delete files a worker holds in its model folder that the head lacks (distribution.delete_extras:
# true; by default they are kept and reported). Each NAME is relative to MODEL_DIR and is deleted
# only when it is a regular file whose real path is exactly MODEL_DIR's real path + "/NAME": never
# a folder, never through a symbolic link, never with "..", so nothing outside the model folder is
# ever touched. One line per NAME: "DELETED<TAB>NAME", or "KEPT<TAB>NAME<TAB>WHY".
# Usage: model_prune.sh MODEL_DIR NAME...
#   e.g. model_prune.sh /models/Qwen3-8B other-model/model.safetensors
set -euo pipefail
dir=$1
shift
root=$(realpath -e -- "$dir")
for name in "$@"; do
  path=$root/$name
  real=$(realpath -e -- "$path" 2>/dev/null) || real=
  if [ -z "$real" ]; then
    printf 'KEPT\t%s\t%s\n' "$name" "absent"
  elif [ "$real" != "$path" ] || [ -L "$path" ] || [ ! -f "$path" ]; then
    printf 'KEPT\t%s\t%s\n' "$name" "not a plain file of the model folder (a link, a folder, or a path out of it)"
  elif rm -f -- "$path"; then
    printf 'DELETED\t%s\n' "$name"
  else
    printf 'KEPT\t%s\t%s\n' "$name" "rm failed"
  fi
done
