#!/usr/bin/env bash
# What a node's Docker holds and can do, for the image distribution (03): sections introduced by
# "@@ NAME" lines:
#   image         IMAGE's identity and size: `docker image inspect` with FORMAT (its ID, size,
#                 registry digests, diff IDs and runtime config, one JSON object: the format is
#                 sparkbook/facts/identity.py's INSPECT_FORMAT); nothing when it is absent
#   docker        the server's version
#   driver        the storage driver and its status (the containerd image store shows there)
#   root          Docker's root folder
#   layers        the diff IDs of every image the node holds, one JSON list per image
#   zstd          zstd's path, or "absent"
# A section whose command fails holds its error (or nothing); the script itself always succeeds.
# Usage: image_survey.sh IMAGE FORMAT
set -euo pipefail
image=$1 format=$2

echo '@@ image'
docker image inspect --format "$format" -- "$image" 2>/dev/null || true
echo '@@ docker'
docker version --format '{{.Server.Version}}' 2>&1 || true
echo '@@ driver'
docker info --format '{{.Driver}} {{json .DriverStatus}}' 2>&1 || true
echo '@@ root'
docker info --format '{{.DockerRootDir}}' 2>&1 || true
echo '@@ layers'
docker image ls -q --no-trunc | sort -u \
  | xargs -r docker image inspect --format '{{json .RootFS.Layers}}' 2>/dev/null || true
echo '@@ zstd'
command -v zstd || echo absent
