#!/usr/bin/env bash
# What tells why serving failed on this node, in sections: the last 5000 lines of each CONTAINER's
# log ("@@ docker logs NAME", "No such container" for an absent one) and of vllm serve's log in the
# Ray container (SERVE_LOG), `ray status` in RAY_CONTAINER, every container, the largest processes.
# Usage: collect_logs.sh RAY_CONTAINER SERVE_LOG CONTAINER...
#   e.g. collect_logs.sh sparkbook-lab-ray /tmp/sparkbook-root/lab/logs/vllm-serve.log sparkbook-lab-ray sparkbook-lab-vllm
set -euo pipefail
ray=$1 serve_log=$2
shift 2
# each part is read for what it says; one that fails (absent, or cut short by head) leaves the rest
for container in "$@"; do
  echo "@@ docker logs $container"
  docker logs --timestamps "$container" 2>&1 | tail -n 5000 || true
done
echo '@@ vllm-serve.log'
tail -n 5000 -- "$serve_log" 2>/dev/null || true
echo '@@ ray status'
docker exec "$ray" ray status 2>&1 | head -n 60 || true
echo '@@ containers'
docker ps -a --format '{{.Names}}\t{{.Image}}\t{{.Status}}' 2>&1 || true
echo '@@ processes'
ps -eo pid,ppid,etime,rss,args --sort=-rss 2>&1 | head -n 40 || true
