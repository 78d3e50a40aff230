#!/usr/bin/env bash
# Where vLLM's workers in a container are, when 05 calls a stall: every thread of every worker
# process, read twice a second apart (its state and its share of a core in that second), and each
# worker's Python stack from py-spy where PYSPY (a py-spy binary on this node) is given: copied into
# the container for the sample (`py-spy dump --nonblocking`: the process is not paused) and
# removed after it.
#   @@ threads        TID STATE SHARE NAME  (SHARE: of one core)
#   @@ py-spy PID     the dump of the worker whose PID (this node's) it names
#   @@ no-py-spy WHY  no dump, and why
# Usage: worker_stacks.sh CONTAINER [PYSPY]
#   e.g. worker_stacks.sh sparkbook-lab-ray /home/me/.sparkbook/lab/tools/py-spy-0.4.3-aarch64
set -euo pipefail
container=$1 pyspy=${2:-}
workers='VLLM::Worker|RayWorker'
ray_own='raylet|gcs_server|dashboard|log_monitor|monitor\.py|runtime_env|ray start|ray::IDLE|ray status'
pids=() others=()
while read -r pid args; do
  if [[ $args =~ $workers ]]; then
    pids+=("$pid")
  elif ! [[ $args =~ $ray_own ]]; then
    others+=("$pid")
  fi
done < <(docker top "$container" -eo pid,args 2>/dev/null | tail -n +2 || true)
if [ "${#pids[@]}" = 0 ]; then  # an older vLLM: its processes are not named
  pids=(${others[@]+"${others[@]}"})
fi

declare -A before
read_threads() {  # TID STATE TICKS NAME of every thread of the workers
  local pid task stat
  for pid in ${pids[@]+"${pids[@]}"}; do
    for task in /proc/"$pid"/task/*; do
      stat=$(cat "$task/stat" 2>/dev/null) || continue
      read -r -a f <<< "${stat##*) }"
      printf '%s %s %s %s\n' "${task##*/}" "${f[0]}" "$((f[11] + f[12]))" "$(cat "$task/comm" 2>/dev/null)"
    done
  done
}
while read -r tid state ticks name; do
  before[$tid]=$ticks
done < <(read_threads)
sleep 1
hz=$(getconf CLK_TCK)
echo '@@ threads'
while read -r tid state ticks name; do
  awk -v d="$((ticks - ${before[$tid]:-$ticks}))" -v hz="$hz" -v t="$tid" -v s="$state" -v n="$name" \
    'BEGIN { printf "%s %s %.2f %s\n", t, s, d / hz, n }'
done < <(read_threads)

if [ -z "$pyspy" ]; then
  echo '@@ no-py-spy no py-spy for this node'
  exit 0
fi
inside=/tmp/sparkbook-py-spy
if ! docker cp -- "$pyspy" "$container:$inside" 2>/dev/null; then
  echo '@@ no-py-spy it could not be copied into the container'
  exit 0
fi
for pid in ${pids[@]+"${pids[@]}"}; do
  nspid=$(awk '/^NSpid:/ { print $NF }' "/proc/$pid/status" 2>/dev/null) || continue
  if out=$(timeout 20 docker exec "$container" "$inside" dump --nonblocking --pid "$nspid" 2>&1); then
    echo "@@ py-spy $pid"
    printf '%s\n' "$out"
  else
    echo "@@ no-py-spy py-spy could not read worker $pid: $(printf '%s' "$out" | tail -n 1 | cut -c1-200)"
  fi
done
docker exec "$container" rm -f -- "$inside" >/dev/null 2>&1 || true
