#!/usr/bin/env bash
# The serving runtime on this node, for sparkbook's preflight (01). With Docker: the running
# containers ("@@ containers": "NAME<TAB>IMAGE<TAB>STATUS") and IMAGE's identity ("@@ image":
# `docker image inspect` with FORMAT, sparkbook/distribution/identity.py's INSPECT_FORMAT: its ID,
# registry digests, diff IDs and runtime config as one JSON object, or "absent"); with a
# virtualenv: the version of vLLM in it ("@@ venv", else the last line of the error).
# Usage: runtime_state.sh docker IMAGE FORMAT
#        runtime_state.sh venv VENV_DIR
set -euo pipefail
usage="usage: runtime_state.sh docker IMAGE FORMAT | venv VENV_DIR"
kind=${1:?$usage}
target=${2:?$usage}

if [ "$kind" = docker ]; then
  format=${3:?$usage}
  echo "@@ containers"
  docker ps --format '{{.Names}}\t{{.Image}}\t{{.Status}}' 2>/dev/null || true
  echo "@@ image"
  docker image inspect --format "$format" -- "$target" 2>/dev/null || echo absent
else
  echo "@@ venv"
  "$target/bin/python" -c 'import vllm; print(vllm.__version__)' 2>&1 | tail -n 1 || true
fi
