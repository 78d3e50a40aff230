#!/usr/bin/env bash
# Delete files a worker holds in its model folder that the head lacks (distribution.delete_extras:
# true; by default they are kept and reported). Each NAME is relative to MODEL_DIR and is deleted
# only when it is a regular file whose real path is exactly MODEL_DIR's real path + "/NAME": never
# a folder, never through a symbolic link, never with "..", so nothing outside the model folder is
# ever touched. One line per NAME: "DELETED<TAB>NAME", or "KEPT<TAB>NAME<TAB>WHY".
# Checking a path and then deleting it by the same path would follow a folder swapped for a link in
# between; so each NAME is deleted from inside its folder: the folder is entered first, then the
# folder entered is checked (the kernel's getcwd, by the pwd program: bash's own `pwd -P` resolves
# the path it was given once more, which a second swap can make look right), and rm resolves
# nothing but the last component, where it unlinks a link rather than its target.
# Usage: model_prune.sh MODEL_DIR NAME...
#   e.g. model_prune.sh /models/Qwen3-8B other-model/model.safetensors
set -euo pipefail
dir=$1
shift
root=$(realpath -e -- "$dir")
outside="not a plain file of the model folder (a link, a folder, or a path out of it)"

# NAME's line; in a subshell, so that each NAME starts from the same place
prune() (
  name=$1 folder='' base=$1
  case $name in */*) folder=/${name%/*} base=${name##*/};; esac
  if ! cd -P -- "$root$folder" 2>/dev/null; then
    [ -e "$root$folder" ] && why=$outside || why=absent
    printf 'KEPT\t%s\t%s\n' "$name" "$why"
  elif [ "$(env pwd -P)" != "$root$folder" ]; then
    printf 'KEPT\t%s\t%s\n' "$name" "$outside"
  elif [ -n "$base" ] && [ ! -e "$base" ] && [ ! -L "$base" ]; then
    printf 'KEPT\t%s\t%s\n' "$name" "absent"
  elif [ -z "$base" ] || [ -L "$base" ] || [ ! -f "$base" ]; then
    printf 'KEPT\t%s\t%s\n' "$name" "$outside"
  elif rm -f -- "./$base"; then
    printf 'DELETED\t%s\n' "$name"
  else
    printf 'KEPT\t%s\t%s\n' "$name" "rm failed"
  fi
)

for name in "$@"; do
  prune "$name"
done
