#!/usr/bin/env bash
# Start a container in place of any of the same name: remove container NAME (absent is fine), then
# run the command given, the `docker run ... --name NAME ...` that starts the new one; its output
# and exit status are this script's.
# Usage: replace_container.sh NAME docker run [OPTIONS] IMAGE [COMMAND...]
set -euo pipefail
name=$1
shift
docker rm -f "$name" >/dev/null 2>&1 || true
exec "$@"
