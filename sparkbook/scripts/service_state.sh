#!/usr/bin/env bash
# The service containers of one deployment on this node (those with labels DEPLOYMENT and SERVICE,
# any owner): a line per container, tab-separated: name, state, Docker's restart count, when it
# last started, the image ID it runs, the image ID its SERVICE label pins, its owner label, and how
# many times its supervisor started the engine (lines of scripts/service.sh in its log).
# Usage: service_state.sh DEPLOYMENT SERVICE OWNER
#   e.g. service_state.sh sparkbook=lab sparkbook.service sparkbook.owner
set -euo pipefail
deployment=$1 service=$2 owner=$3
format="{{.Name}}	{{.State.Status}}	{{.RestartCount}}	{{.State.StartedAt}}	{{.Image}}	{{index .Config.Labels \"$service\"}}	{{index .Config.Labels \"$owner\"}}"
docker ps -aq --filter "label=$deployment" --filter "label=$service" | while read -r id; do
  line=$(docker container inspect --format "$format" -- "$id")
  starts=$(docker logs -- "$id" 2>&1 | grep -c '^sparkbook-service: .*starting the engine$' || true)
  printf '%s\t%s\n' "${line#/}" "$starts"
done
