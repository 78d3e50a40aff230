#!/usr/bin/env bash
# The manifest of a model folder: one line "SIZE<TAB>-<TAB>PATH" per file (sorted by path), then
# "#PATH<TAB>SHA256" for the hashed files; or "absent" when the folder does not exist.
# Usage: model_manifest.sh MODEL_DIR all|config
#   all: hash every file; config: only config-like files (what makes two copies behave differently)
set -euo pipefail
dir=$1 scope=${2:-config}
if [ ! -d "$dir" ]; then
  echo absent
  exit 0
fi
cd -- "$dir"
find . -type f -printf '%s\t-\t%P\n' | sort -k3
if [ "$scope" = all ]; then
  find . -type f -print0
else
  find . -type f \( -name '*.json' -o -name '*.jinja' -o -name '*.txt' -o -name '*.model' \
    -o -name '*.py' -o -name '*.tiktoken' \) -print0
fi | xargs -0 -r sha256sum | sed 's#  \./#\t#' | awk -F'\t' '{print "#" $2 "\t" $1}'
