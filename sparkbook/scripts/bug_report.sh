#!/usr/bin/env bash
# What a bug report needs from this node (`sparkbook collect`; host_state.sh gives the GPU, memlock,
# swap and rail firmware), in sections "@@ NAME":
#   kernel log             the kernel's last 2000 lines (`journalctl -k`, else `dmesg`): OOM kills,
#                          NVRM/Xid errors, mlx5 link flaps; or why this user may read neither (no sudo)
#   kernel log, previous boot   the same of the boot before, where journald keeps it (a host wedged
#                          by memory exhaustion is reset: its OOM kills are in the previous boot)
#   image                  the ID of IMAGE, or "absent" (docker)
#   image env              IMAGE's own environment (CUDA_VERSION, NCCL_VERSION...) (docker)
#   container NAME         per container of this deployment (labelled LABEL) that this login started
#                          (labelled OWNER_LABEL; another login's are not read): image, state, exit
#                          code, command
#   container env NAME     its variables that start with one of PREFIXES and an underscore
#   docker logs NAME       the last 5000 lines of its log
#   ray log NAME FILE      Ray's session logs in a running container NAME: the last 2000 lines of
#                          raylet.out and gcs_server.out, and (FILE oom-kills) the raylet's
#                          memory-monitor lines: usage above the threshold, workers killed
#   ray status             `ray status` in RAY_CONTAINER, when it is one of those containers
#   vllm-serve.log         the last 5000 lines of SERVE_LOG (vllm serve's log, in this login's
#                          working folder)
#   processes              the 40 largest processes: this login's with their arguments, any other
#                          by its program alone (another login's command line may carry its secrets)
#   runtime versions       what VERSIONS_PY (the text of image_versions.py) prints: run in IMAGE
#                          without GPUs (`vllm --version` crashes there) with python3 as the
#                          entrypoint, never pulled; or by the python of the virtualenv VENV_DIR
# Variables whose name matches SECRET_NAMES (an ERE, case-insensitive) never leave the node. A
# section whose command fails holds its error or nothing. What a section holds never reads as a
# header: see fenced.
# Usage: bug_report.sh LABEL OWNER_LABEL SECRET_NAMES PREFIXES RAY_CONTAINER SERVE_LOG docker IMAGE VERSIONS_PY
#        bug_report.sh LABEL OWNER_LABEL SECRET_NAMES PREFIXES RAY_CONTAINER SERVE_LOG venv VENV_DIR VERSIONS_PY
#   e.g. bug_report.sh sparkbook=lab sparkbook.owner=root 'TOKEN|SECRET' 'NCCL|RAY' sparkbook-lab-ray \
#          /tmp/sparkbook-root/lab/logs/vllm-serve.log docker sparkbook-lab/vllm-cpu:latest \
#          "$(cat sparkbook/scripts/image_versions.py)"
set -euo pipefail
export LC_ALL=C
label=$1 owner=$2 secret_names=$3 prefixes=$4 ray=$5 serve_log=$6 kind=$7 target=$8 versions=$9

# NAME=value lines without any whose name looks like a secret
no_secrets() {
  grep -viE "^[^=]*($secret_names)" || true
}

# What logs, images and processes say, as a section's lines: a line that starts with two or more
# "@" and a space gets one more "@" (record/bugreport.py takes it off), so that none reads as a header
# ("@@ NAME") a log could forge; first, every line break that Python's splitlines knows (CR, VT, FF,
# FS, GS, RS, NEL, LS, PS) becomes a newline, or a line's rest after one would escape the check.
fenced() {
  sed -E 's/\r$//; s/\r|\v|\f|\x1c|\x1d|\x1e|\xc2\x85|\xe2\x80\xa8|\xe2\x80\xa9/\n/g' | sed -E 's/^@@+ /@&/'
}

# Ray's session log $1 in a container (run there; its output is fenced here); oom-kills: the
# raylet's memory monitor's lines, "Node memory usage above threshold" and "Killing worker ... to
# free up memory" (ray-project/ray#27716), "Worker evicted and process killed to reclaim memory" in
# later Ray (ray-project/ray#59368)
# shellcheck disable=SC2016  # expanded in the container
ray_log='logs=/tmp/ray/session_latest/logs
if [ "$1" = oom-kills ]; then
  grep -hE "memory usage above threshold|to free up memory|reclaim memory|running low on memory" \
    -- "$logs"/raylet*.out 2>/dev/null | tail -n 200
elif [ -f "$logs/$1" ]; then
  tail -n 2000 -- "$logs/$1"
fi'

echo '@@ kernel log'
if log=$(journalctl -k -n 2000 --no-pager -q 2>/dev/null) && [ -n "$log" ]; then
  printf '%s\n' "$log" | fenced
elif log=$(dmesg 2>&1); then
  printf '%s\n' "$log" | tail -n 2000 | fenced
else
  echo "refused: journalctl -k showed nothing to $(id -un) and dmesg said: ${log:-nothing}." \
    "sparkbook uses no sudo: add $(id -un) to the adm or systemd-journal group, or attach" \
    "the output of 'sudo dmesg | tail -n 2000' to the report yourself" | fenced
fi
echo '@@ kernel log, previous boot'
journalctl -k -b -1 -n 2000 --no-pager -q 2>/dev/null | fenced || true

if [ "$kind" = docker ]; then
  echo '@@ image'
  id=$(docker image inspect --format '{{.Id}}' -- "$target" 2>/dev/null) || id=absent
  echo "$id"
  echo '@@ image env'
  docker image inspect --format '{{range .Config.Env}}{{println .}}{{end}}' -- "$target" 2>/dev/null \
    | no_secrets | fenced || true
fi

docker ps -a --filter "label=$label" --filter "label=$owner" --format '{{.Names}}' 2>/dev/null | while read -r name; do
  echo "@@ container $name"
  docker inspect --format 'image={{.Config.Image}} {{.Image}}
state={{.State.Status}} exit={{.State.ExitCode}} oom={{.State.OOMKilled}} started={{.State.StartedAt}}
command={{json .Path}} {{json .Args}}' -- "$name" 2>&1 | fenced || true
  echo "@@ container env $name"
  docker inspect --format '{{range .Config.Env}}{{println .}}{{end}}' -- "$name" 2>/dev/null \
    | { grep -E "^($prefixes)_[A-Za-z0-9_]*=" || true; } | no_secrets | fenced || true
  echo "@@ docker logs $name"
  docker logs --timestamps "$name" 2>&1 | tail -n 5000 | fenced || true
  for f in raylet.out gcs_server.out oom-kills; do
    echo "@@ ray log $name $f"
    docker exec "$name" sh -c "$ray_log" sh "$f" </dev/null 2>/dev/null | fenced || true
  done
  if [ "$name" = "$ray" ]; then
    echo '@@ ray status'
    docker exec "$ray" ray status </dev/null 2>&1 | head -n 60 | fenced || true
  fi
done || true

echo '@@ vllm-serve.log'
tail -n 5000 -- "$serve_log" 2>/dev/null | fenced || true
echo '@@ processes'
ps -eo pid,ppid,etime,rss,uid,args --sort=-rss 2>&1 | head -n 40 \
  | awk -v me="$(id -u)" 'NR == 1 || $5 == me { print; next } { print $1, $2, $3, $4, $5, $6 }' | fenced || true

# last: it takes the longest (torch is imported), and its container is not among those above
echo '@@ runtime versions'
if [ "$kind" = venv ]; then
  CUDA_VISIBLE_DEVICES='' timeout 180 "$target/bin/python" -c "$versions" 2>&1 | tail -n 20 | fenced || true
elif [ "$id" != absent ]; then
  timeout 180 docker run --rm --pull never --network none --label "$label" --label "$owner" \
    --entrypoint python3 "$target" -c "$versions" 2>&1 | tail -n 20 | fenced || true
fi
