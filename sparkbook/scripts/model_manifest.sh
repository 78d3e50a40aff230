#!/usr/bin/env bash
# The manifest of a model folder: one line "SIZE<TAB>-<TAB>PATH" per file (sorted by path), then
# "#PATH<TAB>SHA256" for the hashed files; or "absent" when the folder does not exist.
# Left out: .cache/huggingface, huggingface_hub's bookkeeping of a download into the folder (and
# sparkbook's partial files of one), which differs from node to node and is never copied; and every
# folder named PARTIAL_DIR, where the model sync keeps the partial files of an interrupted copy
# until the next copy resumes them (never a file of the model, never an extra).
# Usage: model_manifest.sh MODEL_DIR all|config PARTIAL_DIR
#   all: hash every file; config: only config-like files (what makes two copies behave differently)
#   e.g. model_manifest.sh /models/Qwen3-8B config .sparkbook-partial
set -euo pipefail
dir=$1 scope=$2 partial=$3
if [ ! -d "$dir" ]; then
  echo absent
  exit 0
fi
cd -- "$dir"
files() {  # find's tests for the files to list, after the left-out folders
  find . \( -path ./.cache/huggingface -o -name "$partial" \) -prune -o -type f "$@"
}
files -printf '%s\t-\t%P\n' | sort -k3
if [ "$scope" = all ]; then
  files -print0
else
  files \( -name '*.json' -o -name '*.jinja' -o -name '*.txt' -o -name '*.model' \
    -o -name '*.py' -o -name '*.tiktoken' \) -print0
fi | xargs -0 -r sha256sum | sed 's#  \./#\t#' | awk -F'\t' '{print "#" $2 "\t" $1}'
