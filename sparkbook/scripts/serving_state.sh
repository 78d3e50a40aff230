#!/usr/bin/env bash
# This deployment's containers on this node, the configured image's identity and the TCP listeners,
# in sections read by sparkbook.serving.state:
#   @@ containers  NAME<TAB>STATE<TAB>FINGERPRINT per container labelled LABEL (sparkbook=<deployment>)
#   @@ runs        /NAME IMAGE_ID per such container
#   @@ image       `docker image inspect` of IMAGE with FORMAT (sparkbook/facts/identity.py's
#                  INSPECT_FORMAT): its ID, registry digests, diff IDs and runtime config here, one
#                  JSON object (nothing when it is absent)
#   @@ listeners   `ss -ltnp` without its header
# Usage: serving_state.sh LABEL FINGERPRINT_LABEL IMAGE FORMAT
#   e.g. serving_state.sh sparkbook=lab sparkbook.record.fingerprint sparkbook-lab/vllm-cpu:latest '{{json .}}'
set -euo pipefail
label=$1 fingerprint=$2 image=$3 format=$4
# Docker failing here reads as no container and no image, which the checks that follow name.
echo '@@ containers'
docker ps -a --filter "label=$label" \
  --format "{{.Names}}\t{{.State}}\t{{.Label \"$fingerprint\"}}" || true
echo '@@ runs'
docker ps -aq --filter "label=$label" | xargs -r docker inspect --format '{{.Name}} {{.Image}}' || true
echo '@@ image'
docker image inspect --format "$format" -- "$image" 2>/dev/null || true
echo '@@ listeners'
ss -ltnpH 2>/dev/null || ss -ltnH
