#!/usr/bin/env bash
# What a bug report needs from this node (`sparkbook collect`; host_state.sh gives the GPU, memlock,
# swap and rail firmware), in sections "@@ NAME":
#   kernel log             the kernel's last 2000 lines (`journalctl -k`, else `dmesg`): OOM kills,
#                          NVRM/Xid errors, mlx5 link flaps; or why this user may read neither (no sudo)
#   kernel log, previous boot   the same of the boot before, where journald keeps it (a host wedged
#                          by memory exhaustion is reset: its OOM kills are in the previous boot)
#   image                  the ID of IMAGE, or "absent" (docker)
#   image env              IMAGE's own environment (CUDA_VERSION, NCCL_VERSION...) (docker)
#   container NAME         per container labelled LABEL: image, state, exit code, command
#   container env NAME     its variables that start with one of PREFIXES and an underscore
#   docker logs NAME       the last 5000 lines of its log
#   ray log NAME FILE      Ray's session logs in a running container NAME: the last 2000 lines of
#                          raylet.out and gcs_server.out, and (FILE oom-kills) the raylet's
#                          memory-monitor lines: usage above the threshold, workers killed
#   runtime versions       what VERSIONS_PY (the text of image_versions.py) prints: run in IMAGE
#                          without GPUs (`vllm --version` crashes there) with python3 as the
#                          entrypoint, never pulled; or by the python of the virtualenv VENV_DIR
# Variables whose name matches SECRET_NAMES (an ERE, case-insensitive) never leave the node. A
# section whose command fails holds its error or nothing.
# Usage: bug_report.sh LABEL OWNER_LABEL SECRET_NAMES PREFIXES docker IMAGE VERSIONS_PY
#        bug_report.sh LABEL OWNER_LABEL SECRET_NAMES PREFIXES venv VENV_DIR VERSIONS_PY
#   e.g. bug_report.sh sparkbook=lab sparkbook.owner=root 'TOKEN|SECRET' 'NCCL|RAY' docker \
#          sparkbook-lab/vllm-cpu:latest "$(cat sparkbook/scripts/image_versions.py)"
set -euo pipefail
export LC_ALL=C
label=$1 owner=$2 secret_names=$3 prefixes=$4 kind=$5 target=$6 versions=$7

# NAME=value lines without any whose name looks like a secret
no_secrets() {
  grep -viE "^[^=]*($secret_names)" || true
}

# Ray's session logs, run in a container ($1: its name); the raylet's memory monitor logs "Node
# memory usage above threshold" and "Killing worker ... to free up memory" (ray-project/ray#27716),
# "Worker evicted and process killed to reclaim memory" in later Ray (ray-project/ray#59368)
# shellcheck disable=SC2016  # expanded in the container
ray_logs='logs=/tmp/ray/session_latest/logs
[ -d "$logs" ] || exit 0
for f in raylet.out gcs_server.out; do
  [ -f "$logs/$f" ] || continue
  echo "@@ ray log $1 $f"
  tail -n 2000 -- "$logs/$f"
done
echo "@@ ray log $1 oom-kills"
grep -hE "memory usage above threshold|to free up memory|reclaim memory|running low on memory" \
  -- "$logs"/raylet*.out 2>/dev/null | tail -n 200 || true'

echo '@@ kernel log'
if log=$(journalctl -k -n 2000 --no-pager -q 2>/dev/null) && [ -n "$log" ]; then
  printf '%s\n' "$log"
elif log=$(dmesg 2>&1); then
  printf '%s\n' "$log" | tail -n 2000
else
  echo "refused: journalctl -k showed nothing to $(id -un) and dmesg said: ${log:-nothing}." \
    "sparkbook uses no sudo: add $(id -un) to the adm or systemd-journal group, or attach" \
    "the output of 'sudo dmesg | tail -n 2000' to the report yourself"
fi
echo '@@ kernel log, previous boot'
journalctl -k -b -1 -n 2000 --no-pager -q 2>/dev/null || true

if [ "$kind" = docker ]; then
  echo '@@ image'
  id=$(docker image inspect --format '{{.Id}}' -- "$target" 2>/dev/null) || id=absent
  echo "$id"
  echo '@@ image env'
  docker image inspect --format '{{range .Config.Env}}{{println .}}{{end}}' -- "$target" 2>/dev/null | no_secrets
fi

docker ps -a --filter "label=$label" --format '{{.Names}}' 2>/dev/null | while read -r name; do
  echo "@@ container $name"
  docker inspect --format 'image={{.Config.Image}} {{.Image}}
state={{.State.Status}} exit={{.State.ExitCode}} oom={{.State.OOMKilled}} started={{.State.StartedAt}}
command={{json .Path}} {{json .Args}}' -- "$name" 2>&1 || true
  echo "@@ container env $name"
  docker inspect --format '{{range .Config.Env}}{{println .}}{{end}}' -- "$name" 2>/dev/null \
    | { grep -E "^($prefixes)_[A-Za-z0-9_]*=" || true; } | no_secrets
  echo "@@ docker logs $name"
  docker logs --timestamps "$name" 2>&1 | tail -n 5000 || true
  docker exec "$name" sh -c "$ray_logs" sh "$name" </dev/null 2>/dev/null || true
done || true

# last: it takes the longest (torch is imported), and its container is not among those above
echo '@@ runtime versions'
if [ "$kind" = venv ]; then
  CUDA_VISIBLE_DEVICES='' timeout 180 "$target/bin/python" -c "$versions" 2>&1 | tail -n 20 || true
elif [ "$id" != absent ]; then
  timeout 180 docker run --rm --pull never --network none --label "$label" --label "$owner" \
    --entrypoint python3 "$target" -c "$versions" 2>&1 | tail -n 20 || true
fi
