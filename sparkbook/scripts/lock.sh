#!/usr/bin/env bash
# The deployment's lock on the head: DIR/lock, a file of key=value lines (token, owner, host, pid,
# process, run, started) made whole in a temporary file, then linked into place, which fails when
# the lock exists (atomic: of two runs, one gets it). "process" is the holder's boot ID, PID
# namespace and start time: what tells its process from any other with that pid and host name. The
# holder touches it now and then (a heartbeat): "age" is the seconds since, by this node's clock.
# DIR is sparkbook's private working folder (workdir.sh made it). Whether a held lock is stale is
# decided by the caller, which then replaces it with "take", naming the token it found.
# Usage:
#   lock.sh acquire DIR TOKEN OWNER HOST PID PROCESS RUN STARTED
#   lock.sh take DIR OLD_TOKEN TOKEN OWNER HOST PID PROCESS RUN STARTED
#   lock.sh touch DIR TOKEN | lock.sh release DIR TOKEN | lock.sh show DIR | lock.sh break DIR
# Prints LOCK-ACQUIRED, LOCK-OURS, LOCK-RELEASED, LOCK-BROKEN, LOCK-NONE, or LOCK-HELD (the lock
# is someone else's), each followed by the lock's lines and its age where there is a lock.
#   e.g. lock.sh show /tmp/sparkbook-alice/spark-pair
set -euo pipefail
action=$1
dir=$2
lock="$dir/lock"
# One action at a time on this lock: a check and the change that follows it (take's "still the
# stale one?", release's "still ours?") must not interleave with another run's.
exec 9<"$dir"
flock -w 10 9 || { echo "lock.sh: $dir stays locked by another lock.sh" >&2; exit 2; }

holder() {  # the token in the lock ("" when there is none)
  sed -n 's/^token=//p' -- "$lock" 2>/dev/null || true
}

describe() {  # the lock's lines and its age
  cat -- "$lock"
  echo "age=$(( $(date +%s) - $(stat -c %Y -- "$lock") ))"
}

make() {  # make the lock from TOKEN OWNER HOST PID PROCESS RUN STARTED, or say who holds it
  local tmp
  tmp=$(mktemp -- "$dir/lock.XXXXXX")
  printf 'token=%s\nowner=%s\nhost=%s\npid=%s\nprocess=%s\nrun=%s\nstarted=%s\n' "$@" >"$tmp"
  if ln -- "$tmp" "$lock" 2>/dev/null; then
    rm -f -- "$tmp"
    echo LOCK-ACQUIRED
    describe
  else
    rm -f -- "$tmp"
    echo LOCK-HELD
    describe
  fi
}

case $action in
  acquire)
    if [ -e "$lock" ] && [ "$(holder)" = "$3" ]; then
      touch -- "$lock"
      echo LOCK-OURS
      describe
    else
      make "${@:3:7}"
    fi
    ;;
  take)
    # replace the lock only while it is still the one found stale (OLD_TOKEN)
    if [ -e "$lock" ] && [ "$(holder)" != "$3" ]; then
      echo LOCK-HELD
      describe
      exit 0
    fi
    rm -f -- "$lock"
    make "${@:4:7}"
    ;;
  touch|release)
    if [ ! -e "$lock" ]; then
      echo LOCK-NONE
    elif [ "$(holder)" != "$3" ]; then
      echo LOCK-HELD
      describe
    elif [ "$action" = touch ]; then
      touch -- "$lock"
      echo LOCK-OURS
    else
      rm -f -- "$lock"
      echo LOCK-RELEASED
    fi
    ;;
  show|break)
    if [ ! -e "$lock" ]; then
      echo LOCK-NONE
    elif [ "$action" = show ]; then
      echo LOCK-HELD
      describe
    else
      echo LOCK-BROKEN
      describe
      rm -f -- "$lock"
    fi
    ;;
  *)
    echo "lock.sh: unknown action $action" >&2
    exit 2
    ;;
esac
