#!/usr/bin/env bash
# This deployment's containers on this node, the ID of the configured image and the TCP listeners,
# in sections read by sparkbook.serving.state:
#   @@ containers  NAME<TAB>STATE<TAB>FINGERPRINT per container labelled LABEL (sparkbook=<deployment>)
#   @@ runs        /NAME IMAGE_ID per such container
#   @@ image       the ID of IMAGE here (nothing when it is absent)
#   @@ listeners   `ss -ltnp` without its header
# Usage: serving_state.sh LABEL FINGERPRINT_LABEL IMAGE
#   e.g. serving_state.sh sparkbook=lab sparkbook.fingerprint sparkbook-lab/vllm-cpu:latest
set -euo pipefail
label=$1 fingerprint=$2 image=$3
# Docker failing here reads as no container and no image, which the checks that follow name.
echo '@@ containers'
docker ps -a --filter "label=$label" \
  --format "{{.Names}}\t{{.State}}\t{{.Label \"$fingerprint\"}}" || true
echo '@@ runs'
docker ps -aq --filter "label=$label" | xargs -r docker inspect --format '{{.Name}} {{.Image}}' || true
echo '@@ image'
docker image inspect --format '{{.Id}}' -- "$image" 2>/dev/null || true
echo '@@ listeners'
ss -ltnpH 2>/dev/null || ss -ltnH
