#!/usr/bin/env bash
# The serving runtime on this node, for sparkbook's preflight (01). With Docker: the running
# containers ("@@ containers": "NAME<TAB>IMAGE<TAB>STATUS") and the ID of IMAGE ("@@ image",
# or "absent"); with a virtualenv: the version of vLLM in it ("@@ venv", else the last line of
# the error).
# Usage: runtime_state.sh docker IMAGE
#        runtime_state.sh venv VENV_DIR
set -euo pipefail
kind=${1:?usage: runtime_state.sh docker IMAGE | venv VENV_DIR}
target=${2:?usage: runtime_state.sh docker IMAGE | venv VENV_DIR}

if [ "$kind" = docker ]; then
  echo "@@ containers"
  docker ps --format '{{.Names}}\t{{.Image}}\t{{.Status}}' 2>/dev/null || true
  echo "@@ image"
  docker image inspect --format '{{.Id}}' -- "$target" 2>/dev/null || echo absent
else
  echo "@@ venv"
  "$target/bin/python" -c 'import vllm; print(vllm.__version__)' 2>&1 | tail -n 1 || true
fi
