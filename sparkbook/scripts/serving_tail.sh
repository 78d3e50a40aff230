#!/usr/bin/env bash
# A serving container's state and its last log line, for the wait of 05: a first line
# "STATUS EXIT_CODE OOM_KILLED" ("absent" when there is no such container; with the Ray executor
# "serve-exited" when the container runs but vllm serve in it does not), then the last line of
# vllm serve's log (LOG, Ray) or of the container's (mp).
# Usage: serving_tail.sh CONTAINER mp
#        serving_tail.sh CONTAINER ray PATTERN LOG   e.g. sparkbook-ray ray '[v]llm serve' /tmp/sparkbook/logs/vllm-serve.log
set -euo pipefail
container=$1 executor=$2
state=$(docker inspect --format '{{.State.Status}} {{.State.ExitCode}} {{.State.OOMKilled}}' \
  "$container" 2>/dev/null) || state=absent
if [ "$executor" = ray ]; then
  pattern=$3 log=$4
  case $state in
    running*) docker exec "$container" pgrep -f "$pattern" >/dev/null || state=serve-exited ;;
  esac
  echo "$state"
  tail -n 1 -- "$log" 2>/dev/null || true
else
  echo "$state"
  docker logs --tail 1 "$container" 2>&1 || true
fi
