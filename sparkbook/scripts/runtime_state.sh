#!/usr/bin/env bash
# The serving runtime on this node, for sparkbook's preflight (01): the running containers
# ("@@ containers": "NAME<TAB>IMAGE<TAB>STATUS") and IMAGE's identity ("@@ image": `docker image
# inspect` with FORMAT, sparkbook/facts/identity.py's INSPECT_FORMAT: its ID, registry
# digests, diff IDs and runtime config as one JSON object, or "absent").
# Usage: runtime_state.sh IMAGE FORMAT
set -euo pipefail
usage="usage: runtime_state.sh IMAGE FORMAT"
image=${1:?$usage}
format=${2:?$usage}

echo "@@ containers"
docker ps --format '{{.Names}}\t{{.Image}}\t{{.Status}}' 2>/dev/null || true
echo "@@ image"
docker image inspect --format "$format" -- "$image" 2>/dev/null || echo absent
