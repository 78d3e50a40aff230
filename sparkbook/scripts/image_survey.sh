#!/usr/bin/env bash
# What a node's Docker holds and can do, for the image distribution (03): sections introduced by
# "@@ NAME" lines:
#   id            the image's ID and size, or "absent"
#   image layers  the image's diff IDs (a JSON list)
#   docker        the server's version
#   driver        the storage driver and its status (the containerd image store shows there)
#   root          Docker's root folder
#   layers        the diff IDs of every image the node holds, one JSON list per image
#   zstd          zstd's path, or "absent"
# A section whose command fails holds its error (or nothing); the script itself always succeeds.
# Usage: image_survey.sh IMAGE
set -euo pipefail
image=$1

echo '@@ id'
docker image inspect --format '{{.Id}} {{.Size}}' -- "$image" 2>/dev/null || echo absent
echo '@@ image layers'
docker image inspect --format '{{json .RootFS.Layers}}' -- "$image" 2>/dev/null || true
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
