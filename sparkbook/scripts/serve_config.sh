#!/usr/bin/env bash
# What vLLM logged it was started with, read back by 05: the last line of each kind in vllm serve's
# log (LOG, in the Ray head's logs folder: it holds one start) or in the serving container's log
# (mp), in two sections: "@@ args" (its non-default arguments) and "@@ engine" (its engine's
# configuration). A section is empty when the log has no such line.
# Usage: serve_config.sh ray-head CONTAINER LOG
#        serve_config.sh mp CONTAINER
#   e.g. serve_config.sh ray-head sparkbook-lab-ray /tmp/sparkbook-root/lab/logs/vllm-serve.log
set -euo pipefail
mode=$1 container=$2 log=${3:-}
read_log() {
  if [ "$mode" = ray-head ]; then
    cat -- "$log"
  else
    docker logs "$container" 2>&1
  fi
}
lines=$(read_log | grep -a -e 'non-default args: ' -e ' with config: ' || true)
echo '@@ args'
grep -a 'non-default args: ' <<< "$lines" | tail -n 1 || true
echo '@@ engine'
grep -a ' with config: ' <<< "$lines" | tail -n 1 || true
