#!/usr/bin/env bash
# Stop vllm serve in the Ray container and its engine processes, and wait until they are gone (the
# API port and the Ray workers' GPUs are then free). A running vllm serve gets SIGTERM and shuts its
# engine down, within GRACE_S seconds (default 60); engines left without their vllm serve (it
# crashed or was killed) cannot be shut down that way and get SIGKILL, which also ends their Ray
# workers (Ray ends the actors of an owner that died). Nothing running is fine.
# Usage: stop_serve.sh CONTAINER SERVE_PATTERN ENGINE_PATTERN [GRACE_S]   (pkill's regular expressions)
#   e.g. stop_serve.sh sparkbook-lab-ray '[v]llm serve' '[V]LLM::' 60
set -euo pipefail
container=$1 serve=$2 engine=$3 grace=${4:-60}
# Live processes of the container matching a pattern: an engine whose vllm serve died is left to
# the container's PID 1 (`ray start`), which does not reap it, and its zombie holds nothing; pgrep without --runstates where it is older than procps-ng 3.3.16.
alive() {
  local rc=0
  docker exec "$container" pgrep -r D,R,S,T,t,W,I -f "$1" >/dev/null 2>&1 || rc=$?
  if [ "$rc" -eq 2 ]; then
    docker exec "$container" pgrep -f "$1" >/dev/null 2>&1 || rc=$?
  fi
  return "$rc"
}
if docker exec "$container" pkill -f "$serve"; then
  SECONDS=0
  while [ "$SECONDS" -lt "$grace" ]; do
    alive "$serve|$engine" || exit 0
    sleep 1
  done
fi
docker exec "$container" pkill -9 -f "$serve|$engine" || true
