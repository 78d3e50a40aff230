#!/usr/bin/env bash
# The facts of this node, for sparkbook's inventory (00) and preflight (01): "key=value" lines in a
# section "@@ facts" (host, OS, kernel, boot ID, BIOS, the SSH user with its UID and GID, CPUs, memory, free
# disk, Docker), then the GPUs as
# nvidia-smi CSV with its header in a section "@@ gpu" (or "nvidia-smi absent|failed: ...").
# Usage: inventory.sh MODEL_DIR [DOCKER_ROOT]
#   MODEL_DIR    the model's folder (it may not exist yet): the free space of its filesystem
#   DOCKER_ROOT  Docker's data root for the disk figure (default: the one `docker info` names)
set -euo pipefail
export LC_ALL=C
model_dir=${1:?usage: inventory.sh MODEL_DIR [DOCKER_ROOT]}
docker_root=${2:-}

# Free KiB of the filesystem that holds PATH, or of its nearest existing parent.
free_kb() {
  local p=$1
  while [ ! -e "$p" ]; do p=$(dirname -- "$p"); done
  df -Pk -- "$p" | awk 'NR==2 {print $4}'
}

echo "@@ facts"
echo "hostname=$(hostname)"
(
  # shellcheck source=/dev/null
  . /etc/os-release 2>/dev/null || true
  echo "os=${PRETTY_NAME:-unknown}"
)
echo "kernel=$(uname -r)"
echo "boot_id=$(cat /proc/sys/kernel/random/boot_id 2>/dev/null || true)"
echo "arch=$(uname -m)"
echo "bios=$(cat /sys/class/dmi/id/bios_version 2>/dev/null || true)"
echo "user=$(id -un)"
echo "uid=$(id -u)"
echo "gid=$(id -g)"
echo "cpus=$(nproc)"
awk '/^MemTotal:/ {print "mem_total_kb="$2} /^MemAvailable:/ {print "mem_available_kb="$2}' /proc/meminfo
echo "model_disk_free_kb=$(free_kb "$model_dir")"
if command -v docker >/dev/null 2>&1; then
  # one call: version, data root and runtimes ('|' does not occur in them)
  info=$(docker info --format '{{.ServerVersion}}|{{.DockerRootDir}}|{{json .Runtimes}}' 2>/dev/null) || true
  version=${info%%|*}
  echo "docker_version=${version:-daemon unreachable}"
  rest=${info#*|}
  root=${rest%%|*}
  if [ -z "$info" ]; then root=""; fi
  if [ -n "$docker_root" ]; then root=$docker_root; fi
  if [ -n "$root" ]; then
    echo "docker_root=$root"
    echo "docker_disk_free_kb=$(free_kb "$root")"
  fi
  if [ -n "$info" ]; then echo "docker_runtimes=${rest#*|}"; fi
else
  echo "docker_version=absent"
fi

echo "@@ gpu"
if command -v nvidia-smi >/dev/null 2>&1; then
  err=$(mktemp)
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>"$err" ||
    echo "nvidia-smi failed: $(tail -n 1 "$err")"
  rm -f "$err"
else
  echo "nvidia-smi absent"
fi
