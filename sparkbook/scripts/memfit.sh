#!/usr/bin/env bash
# What sparkbook's memory fit (01 and 05) needs from this node, in sections:
#   @@ memfit meminfo  MemTotal, MemFree, MemAvailable and Cached lines of /proc/meminfo
#   @@ memfit gpus     "TOTAL_MIB, FREE_MIB" per GPU (nvidia-smi); "[N/A], [N/A]" on GB10, whose
#                      memory is the system's; or "nvidia-smi absent|failed"
# and with MODEL_DIR (the head): the model's size and its config.json:
#   @@ memfit weights  "absent", or index_total_size=BYTES (model.safetensors.index.json's
#                      metadata.total_size) and safetensors_bytes=BYTES (the *.safetensors files)
#   @@ memfit config   config.json as it is, or "absent"
# Usage: memfit.sh [MODEL_DIR]
#   e.g. memfit.sh /models/Qwen3.5-122B-A10B-FP8
set -euo pipefail
export LC_ALL=C
model_dir=${1:-}

echo "@@ memfit meminfo"
grep -E '^(MemTotal|MemFree|MemAvailable|Cached):' /proc/meminfo || true
echo "@@ memfit gpus"
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=memory.total,memory.free --format=csv,noheader,nounits 2>/dev/null ||
    echo "nvidia-smi failed"
else
  echo "nvidia-smi absent"
fi
if [ -z "$model_dir" ]; then
  exit 0
fi
echo "@@ memfit weights"
if [ ! -d "$model_dir" ]; then
  echo absent
else
  index="$model_dir/model.safetensors.index.json"
  if [ -f "$index" ]; then
    size=$(grep -o -m 1 -E '"total_size"[[:space:]]*:[[:space:]]*[0-9]+' -- "$index" | tr -dc '0-9') || true
    if [ -n "$size" ]; then echo "index_total_size=$size"; fi
  fi
  # hidden folders left out: huggingface_hub's .cache and the model sync's partial files. -L: a
  # model folder that is a link, and the Hugging Face cache's snapshot files (links to its blobs),
  # count their targets; a subfolder find cannot read is skipped, not fatal.
  { find -L "$model_dir/" -mindepth 1 -name '.*' -prune -o -type f -name '*.safetensors' -printf '%s\n' 2>/dev/null ||
    true; } | awk '{s += $1} END {printf "safetensors_bytes=%.0f\n", s}'
fi
echo "@@ memfit config"
head -c 1048576 -- "$model_dir/config.json" 2>/dev/null || echo absent
