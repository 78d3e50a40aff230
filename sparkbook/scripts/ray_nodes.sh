#!/usr/bin/env bash
# The Ray cluster as the Ray container on this node sees it: a line "RAYVERSION X.Y.Z" (the Ray of
# the image), a line "RAYNODES [JSON]" (address, liveness and resources of every node); with "actors", a line "RAYACTORS [JSON]" (class and node
# address of every live actor: vLLM's Ray workers among them; "RAYACTORS-ERROR ..." where Ray's
# state API is missing); then "@@ status" and `ray status`, whose exit status is this script's.
# Usage: ray_nodes.sh CONTAINER [actors]
#   e.g. ray_nodes.sh sparkbook-lab-ray actors
set -euo pipefail
container=$1 actors=${2:-}
docker exec "$container" python3 -c 'import json, sys, ray
print("RAYVERSION " + ray.__version__, flush=True)
ray.init(address="auto", logging_level="ERROR")
nodes = ray.nodes()
print("RAYNODES " + json.dumps([{"ip": n["NodeManagerAddress"], "alive": n["Alive"],
                                 "resources": n["Resources"]} for n in nodes]))
if sys.argv[1:] != ["actors"]:
    raise SystemExit(0)
try:
    from ray.util.state import list_actors
    ip = {n["NodeID"]: n["NodeManagerAddress"] for n in nodes}
    alive = list_actors(filters=[("state", "=", "ALIVE")], limit=10000)
    print("RAYACTORS " + json.dumps([{"class": a.class_name, "ip": ip.get(a.node_id, "?")} for a in alive]))
except Exception as e:
    print("RAYACTORS-ERROR " + (str(e).splitlines() or [type(e).__name__])[0][:300])' "$actors" || true
echo '@@ status'
docker exec "$container" ray status
