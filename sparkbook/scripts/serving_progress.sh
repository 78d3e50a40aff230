#!/usr/bin/env bash
# What 05's wait reads from one node, every few seconds: the serving container's state, the CPU
# time used so far by vLLM's processes in it, and the last lines of vLLM's log.
#   line 1     STATUS EXIT_CODE OOM_KILLED ("absent" without such a container; "serve-exited" on
#              the Ray head when the Ray container runs but vllm serve in it does not)
#   @@ cpu     CPU seconds (user + system) of vLLM's workers in the container: the processes that
#              load the weights, compile and run the model (VLLM::Worker*, Ray's RayWorker actors).
#              The API server and the engine poll while they wait, so their CPU is no progress.
#              Without such processes (an older vLLM): all but Ray's own daemons and idle workers
#   @@ compile CPU seconds of compiling: compilers and compile workers in the container (g++, cc1plus,
#              ptxas, nvcc, cicc, ninja, inductor's compile_worker...) with their finished children,
#              and the finished children of vLLM's workers (a Triton build runs ptxas as one). A
#              worker whose own CPU climbs while this does not, and its log says nothing, is spinning
#              (as a rank in a collective that never completes polls), not compiling
#   @@ stuck   how many of those processes are stopped (T, t: a signal or a debugger) or in
#              uninterruptible sleep (D: a hung disk, mount or driver call): they cannot be waiting
#              on another node
#   @@ tail    the last LINES lines of vllm serve's log (LOG, Ray head) or of the container's
# Usage: serving_progress.sh CONTAINER mp LINES
#        serving_progress.sh CONTAINER ray-worker LINES
#        serving_progress.sh CONTAINER ray-head LINES PATTERN LOG
#   e.g. serving_progress.sh sparkbook-lab-ray ray-head 40 '[v]llm serve' /tmp/sparkbook-root/lab/logs/vllm-serve.log
set -euo pipefail
container=$1 mode=$2 lines=$3
state=$(docker inspect --format '{{.State.Status}} {{.State.ExitCode}} {{.State.OOMKilled}}' \
  -- "$container" 2>/dev/null) || state=absent
if [ "$mode" = ray-head ]; then
  pattern=$4
  case $state in
    running*) docker exec "$container" pgrep -f "$pattern" >/dev/null || state=serve-exited ;;
  esac
fi
echo "$state"

workers='VLLM::Worker|RayWorker'
# Ray's own processes (and sparkbook's probes) are not vLLM's work: they tick while vLLM hangs.
ray_own='raylet|gcs_server|dashboard|log_monitor|monitor\.py|runtime_env|ray start|ray::IDLE|ray status|pgrep'
# compilers by their program's name; inductor's compile workers by their module
compilers='^(cc1|cc1plus|gcc|g\+\+|c\+\+|cc|clang|clang\+\+|ld|ld\.[a-z]+|as|collect2|ptxas|nvcc|cicc|nvlink|fatbinary|ninja|make)$'
ticks=0 worker_ticks=0 seen_workers=0 stuck=0 worker_stuck=0 compile_ticks=0
if [ "${state%% *}" != absent ]; then
  while read -r pid args; do
    if [ "$mode" != mp ] && [[ $args =~ $ray_own ]]; then
      continue
    fi
    stat=$(cat "/proc/$pid/stat" 2>/dev/null) || continue
    read -r -a f <<< "${stat##*) }"
    prog=${args%% *}
    if [[ ${prog##*/} =~ $compilers || $args =~ compile_worker ]]; then
      compile_ticks=$((compile_ticks + f[11] + f[12] + f[13] + f[14]))
      continue
    fi
    ticks=$((ticks + f[11] + f[12]))
    case ${f[0]} in T | t | D) held=1 ;; *) held=0 ;; esac
    stuck=$((stuck + held))
    if [[ $args =~ $workers ]]; then
      seen_workers=1 worker_ticks=$((worker_ticks + f[11] + f[12])) worker_stuck=$((worker_stuck + held))
      compile_ticks=$((compile_ticks + f[13] + f[14]))
    fi
  done < <(docker top "$container" -eo pid,args 2>/dev/null | tail -n +2 || true)
fi
if [ "$seen_workers" = 1 ]; then
  ticks=$worker_ticks stuck=$worker_stuck
fi
echo '@@ cpu'
awk -v t="$ticks" -v hz="$(getconf CLK_TCK)" 'BEGIN { printf "%.2f\n", t / hz }'
echo '@@ compile'
awk -v t="$compile_ticks" -v hz="$(getconf CLK_TCK)" 'BEGIN { printf "%.2f\n", t / hz }'
echo '@@ stuck'
echo "$stuck"

echo '@@ tail'
if [ "$mode" = ray-head ]; then
  tail -n "$lines" -- "$5" 2>/dev/null || true
else
  docker logs --tail "$lines" "$container" 2>&1 || true
fi
