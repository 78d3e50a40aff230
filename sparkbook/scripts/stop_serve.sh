#!/usr/bin/env bash
# Stop vllm serve in the Ray container and wait until it is gone (its port is then free): SIGTERM,
# up to 60 s, then SIGKILL. Nothing running is fine.
# Usage: stop_serve.sh CONTAINER PATTERN
#   e.g. stop_serve.sh sparkbook-ray '[v]llm serve'
set -euo pipefail
container=$1 pattern=$2
docker exec "$container" pkill -f "$pattern" || true
SECONDS=0
while [ "$SECONDS" -lt 60 ]; do
  docker exec "$container" pgrep -f "$pattern" >/dev/null || exit 0
  sleep 1
done
docker exec "$container" pkill -9 -f "$pattern" || true
