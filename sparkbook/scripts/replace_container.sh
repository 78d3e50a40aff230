#!/usr/bin/env bash
# Start a container in place of this deployment's container of the same name: remove container
# NAME when it carries both labels DEPLOYMENT (sparkbook=<deployment>) and OWNER
# (sparkbook.owner=<login>; a container without it is refused), then run the command given, the
# `docker run ... --name NAME ...` that starts the new one; its output and exit status are this
# script's. A container NAME of another deployment, another user, or not sparkbook's is left
# alone: "REPLACE-REFUSED ...", exit 3 (sparkbook never removes what it did not start).
# Usage: replace_container.sh NAME DEPLOYMENT OWNER docker run [OPTIONS] IMAGE [COMMAND...]
#   e.g. replace_container.sh sparkbook-lab-ray sparkbook=lab sparkbook.owner=root docker run -d --name sparkbook-lab-ray ...
set -euo pipefail
name=$1 deployment=$2 owner=$3
shift 3
label() {  # the value of label KEY of container NAME ("none" when it has none)
  docker container inspect --format "{{index .Config.Labels \"$1\"}}" -- "$name" 2>/dev/null | sed 's/^$/none/'
}
if docker container inspect -- "$name" >/dev/null 2>&1; then
  for want in "$deployment" "$owner"; do
    have=$(label "${want%%=*}")
    if [ "$have" != "${want#*=}" ]; then
      echo "REPLACE-REFUSED a container named $name exists whose label ${want%%=*} is $have, not ${want#*=}: it is not this deployment's or not this user's; remove or rename it"
      exit 3
    fi
  done
  docker rm -f -- "$name" >/dev/null 2>&1 || true
fi
exec "$@"
