#!/usr/bin/env bash
# What tells why serving failed on this node, in sections: the last 5000 lines of each CONTAINER's
# log ("@@ docker logs NAME", "No such container" for an absent one) and of vllm serve's log in the
# Ray container (SERVE_LOG), `ray status` in RAY_CONTAINER, this DEPLOYMENT's containers (label
# sparkbook=DEPLOYMENT; another deployment's or program's are not listed), the 40 largest processes: this login's with their
# arguments, any other by its program alone (another login's command line may carry its secrets).
# The output lands in the run folder, and so in shared reports and bug reports.
# Usage: collect_logs.sh DEPLOYMENT RAY_CONTAINER SERVE_LOG CONTAINER...
#   e.g. collect_logs.sh lab sparkbook-lab-ray /tmp/sparkbook-root/lab/logs/vllm-serve.log sparkbook-lab-ray sparkbook-lab-vllm
set -euo pipefail
deployment=$1 ray=$2 serve_log=$3
shift 3
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
docker ps -a --filter "label=sparkbook=$deployment" --format '{{.Names}}\t{{.Image}}\t{{.Status}}' 2>&1 || true
echo '@@ processes'
# as bug_report.sh shows them: the header and this login's (its uid) whole, another's up to its program
ps -eo pid,ppid,etime,rss,uid,args --sort=-rss 2>&1 | head -n 40 \
  | awk -v me="$(id -u)" 'NR == 1 || $5 == me { print; next } { print $1, $2, $3, $4, $5, $6 }' || true
