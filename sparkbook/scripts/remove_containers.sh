#!/usr/bin/env bash
# Remove the containers (running or not) that carry both labels DEPLOYMENT (sparkbook=<deployment>)
# and OWNER (sparkbook.owner=<login>): all of them, or only those named NAME... Containers of
# another deployment, another user, or not sparkbook's, are never touched. Nothing to remove is
# fine; what is left is named by the check that follows (08_teardown).
# Usage: remove_containers.sh DEPLOYMENT OWNER [NAME...]
#   e.g. remove_containers.sh sparkbook=lab sparkbook.owner=root
#        remove_containers.sh sparkbook=lab sparkbook.owner=root sparkbook-lab-collectives
set -euo pipefail
deployment=$1 owner=$2
shift 2
docker ps -a --filter "label=$deployment" --filter "label=$owner" --format '{{.ID}} {{.Names}}' 2>/dev/null |
  while read -r id name; do
    if [ $# -eq 0 ] || printf '%s\n' "$@" | grep -qxF -- "$name"; then
      echo "$id"
    fi
  done | xargs -r docker rm -f >/dev/null || true
