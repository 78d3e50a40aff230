#!/usr/bin/env bash
# The Ray cluster as the Ray container on this node sees it: a line "RAYNODES [JSON]" (address,
# liveness and resources of every node), then "@@ status" and `ray status`, whose exit status is
# this script's.
# Usage: ray_nodes.sh CONTAINER
set -euo pipefail
container=$1
docker exec "$container" python3 -c 'import json, ray
ray.init(address="auto", logging_level="ERROR")
print("RAYNODES " + json.dumps([{"ip": n["NodeManagerAddress"], "alive": n["Alive"],
                                 "resources": n["Resources"]} for n in ray.nodes()]))' || true
echo '@@ status'
docker exec "$container" ray status
