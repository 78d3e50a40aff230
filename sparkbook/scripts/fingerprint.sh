#!/usr/bin/env bash
# What a run's fingerprint needs from this node (sparkbook.record.fingerprint; host_state.sh gives the GPU
# driver and the rails' firmware, model_manifest.sh the model's files), in sections "@@ NAME":
#   kernel            `uname -r`
#   image identity    IMAGE as `docker image inspect --format FORMAT` prints it, or "absent"
#   runtime versions  what VERSIONS_PY (the text of image_versions.py) prints with --light (no
#                     torch import where a package or NCCL_VERSION names NCCL): run in CONTAINER
#                     while it runs (docker exec), else in IMAGE without GPUs or network, never
#                     pulled, with python3 as the entrypoint
# Without IMAGE (a worker): the kernel alone.
# Usage: fingerprint.sh [IMAGE FORMAT CONTAINER LABEL OWNER_LABEL VERSIONS_PY]
#   e.g. fingerprint.sh sparkbook-lab/vllm-cpu:latest '{{json .Id}}' sparkbook-lab-ray sparkbook=lab \
#          sparkbook.owner=root "$(cat sparkbook/scripts/image_versions.py)"
set -euo pipefail
export LC_ALL=C

echo '@@ kernel'
uname -r
[ "$#" -ge 6 ] || exit 0
image=$1 format=$2 container=$3 label=$4 owner=$5 versions=$6

echo '@@ image identity'
docker image inspect --format "$format" -- "$image" 2>/dev/null || { echo absent; exit 0; }

echo '@@ runtime versions'
if [ "$(docker inspect --format '{{.State.Running}}' -- "$container" 2>/dev/null)" = true ]; then
  timeout 180 docker exec -e CUDA_VISIBLE_DEVICES= "$container" python3 -c "$versions" --light 2>&1 | tail -n 20 || true
else
  timeout 180 docker run --rm --pull never --network none --label "$label" --label "$owner" \
    --entrypoint python3 "$image" -c "$versions" --light 2>&1 | tail -n 20 || true
fi
