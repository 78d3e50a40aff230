#!/usr/bin/env bash
# The fingerprint vllm serve was started with in the Ray container: "FP=VALUE" (empty when it has
# none), read from the environment of its oldest process; exit status 3 when vllm serve does not run.
# Usage: serve_fingerprint.sh CONTAINER PATTERN VARIABLE
#   e.g. serve_fingerprint.sh sparkbook-lab-ray '[v]llm serve' SPARKBOOK_SERVE_FINGERPRINT
set -euo pipefail
container=$1 pattern=$2 variable=$3
pid=$(docker exec "$container" pgrep -o -f "$pattern") || exit 3
# a process that ends meanwhile has no fingerprint
value=$(docker exec "$container" cat "/proc/$pid/environ" | tr '\0' '\n' | sed -n "s/^$variable=//p") || true
echo "FP=$value"
