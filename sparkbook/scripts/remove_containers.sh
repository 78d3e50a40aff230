#!/usr/bin/env bash
# Remove every container labelled LABEL (running or not) and the token file ENV_FILE. Nothing to
# remove is fine; what is left is named by the check that follows (08_teardown).
# Usage: remove_containers.sh LABEL ENV_FILE
#   e.g. remove_containers.sh sparkbook /tmp/sparkbook/secrets.env
set -euo pipefail
label=$1 env_file=$2
docker ps -aq --filter "label=$label" | xargs -r docker rm -f >/dev/null || true
rm -f -- "$env_file"
