#!/usr/bin/env bash
# Make sparkbook's private working folder DIR on this node (and its parent, one per SSH user),
# mode 0700, with DIR/logs in it. Refuses a symbolic link, or a folder that another user owns (on
# a shared /tmp anyone may create the name first): prints "WORKDIR-REFUSED PATH WHY", exit 3.
# Usage: workdir.sh DIR
#   e.g. workdir.sh /tmp/sparkbook-alice/spark-pair
set -euo pipefail
dir=$1
umask 077
me=$(id -u)
for d in "${dir%/*}" "$dir" "$dir/logs"; do
  mkdir -p -- "$d" 2>/dev/null || true
  # stat without -L reads the name itself: a link shows as a link, owned by whoever made it
  if [ -L "$d" ] || [ ! -d "$d" ]; then
    echo "WORKDIR-REFUSED $d is not a folder (a symbolic link or a file is in the way)"
    exit 3
  fi
  owner=$(stat -c %u -- "$d")
  if [ "$owner" != "$me" ]; then
    echo "WORKDIR-REFUSED $d belongs to uid $owner, not to this user (uid $me)"
    exit 3
  fi
  chmod 0700 -- "$d"
done
echo "WORKDIR $dir"
