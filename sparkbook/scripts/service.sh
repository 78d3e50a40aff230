#!/usr/bin/env bash
# The supervisor of a sparkbook service container (`sparkbook service install`): PID 1 of the
# container, which Docker's restart policy (`--restart unless-stopped`) brings back after a crash
# and whenever the node's dockerd starts, at boot. It orders the start across the nodes that each
# restart on their own:
#   worker  waits until the head's Ray port answers, then becomes `ray start --block` (when the
#           head goes away, Ray ends it, and Docker starts it again: it waits for the head anew);
#   head    starts `ray start --block`, waits until SPARKBOOK_SERVICE_NODES nodes are alive in Ray,
#           then starts the engine in a process group of its own. Every
#           SPARKBOOK_SERVICE_CHECK_S seconds (20) it checks that the engine lives and that every
#           node it started with is still in Ray (a node that rebooted rejoins under a new ID);
#           when either fails, the engine's whole process group is stopped (its engine-core process
#           too, which would hold Ray's placement group) and started again once the nodes are back, after a backoff of 5 s doubling up to 60 s (reset after 10 minutes of
#           serving). When Ray itself ends, so does the container, and Docker restarts it.
# Every line of its own starts with "sparkbook-service: " in the container's log (`docker logs`),
# beside Ray's and the engine's output.
# Environment: SPARKBOOK_SERVICE_ROLE (head|worker), SPARKBOOK_SERVICE_RAY (the `ray start` command
# line, quoted), SPARKBOOK_SERVICE_HEAD (the head's Ray address, HOST:PORT); on the head also
# SPARKBOOK_SERVICE_SERVE (the engine's command line, quoted) and SPARKBOOK_SERVICE_NODES.
# The engine's name appears nowhere in this text: the patterns that find its process (05's, 08's)
# must never match this program (or a subshell of it, which shows the same command line).
# Usage (as the container's command): bash -c "$(cat service.sh)" service.sh
set -euo pipefail
say() { echo "sparkbook-service: $*"; }
check_s=${SPARKBOOK_SERVICE_CHECK_S:-20}
# PID 1 ignores a signal it has no handler for: `docker stop` must not wait for its KILL
trap 'exit 0' TERM INT

if [ "$SPARKBOOK_SERVICE_ROLE" = worker ]; then
  host=${SPARKBOOK_SERVICE_HEAD%:*} port=${SPARKBOOK_SERVICE_HEAD##*:}
  until (exec 3<>"/dev/tcp/$host/$port") 2>/dev/null; do
    say "waiting for the head's Ray at $SPARKBOOK_SERVICE_HEAD"
    sleep 5
  done
  say "the head's Ray answers at $SPARKBOOK_SERVICE_HEAD: joining"
  eval "exec $SPARKBOOK_SERVICE_RAY"
fi

alive() {  # the IDs of the nodes alive in Ray, one per line (none when Ray does not answer)
  python3 -c 'import ray
ray.init(address="auto", logging_level="ERROR")
for n in ray.nodes():
    if n["Alive"]:
        print("ALIVE " + n["NodeID"])' 2>/dev/null | sed -n 's/^ALIVE //p' || true
}

count() { printf '%s' "$1" | grep -c . || true; }

engine=
stop_engine() {  # the engine's whole process group: TERM, 30 s, then KILL
  [ -n "$engine" ] || return 0
  kill -TERM -- "-$engine" 2>/dev/null || true
  for _ in $(seq 30); do
    kill -0 -- "-$engine" 2>/dev/null || break
    sleep 1
  done
  kill -KILL -- "-$engine" 2>/dev/null || true
  wait "$engine" 2>/dev/null || true
  engine=
}

eval "exec $SPARKBOOK_SERVICE_RAY" &
ray=$!
trap 'say "stopping"; stop_engine; kill -TERM "$ray" 2>/dev/null || true; wait "$ray" || true; exit 0' TERM INT
say "Ray head started (pid $ray)"

backoff=5
while kill -0 "$ray" 2>/dev/null; do
  members=$(alive)
  n=$(count "$members")
  if [ "$n" -lt "$SPARKBOOK_SERVICE_NODES" ]; then
    say "$n of $SPARKBOOK_SERVICE_NODES nodes alive in Ray: waiting"
    sleep 5
    continue
  fi
  say "$n of $SPARKBOOK_SERVICE_NODES nodes alive in Ray: starting the engine"
  started=$SECONDS
  setsid bash -c "$SPARKBOOK_SERVICE_SERVE" &
  engine=$!
  say "the engine started (pid $engine)"
  while kill -0 "$engine" 2>/dev/null; do
    sleep "$check_s"
    kill -0 "$ray" 2>/dev/null || break
    now=$(alive)
    [ -n "$now" ] || continue  # Ray did not answer this time: asked again at the next check
    # a node the engine started with is gone (one that rebooted comes back under a new ID)
    gone=$(printf '%s\n' "$members" | grep -cvxF -f <(printf '%s\n' "$now") || true)
    if [ "$gone" -gt 0 ] && kill -0 "$engine" 2>/dev/null; then
      say "$gone node(s) the engine started with left Ray: stopping the engine"
      break
    fi
  done
  kill -0 "$engine" 2>/dev/null || say "the engine ended"
  stop_engine
  if [ $((SECONDS - started)) -gt 600 ]; then backoff=5; fi
  say "starting the engine again in $backoff s"
  sleep "$backoff"
  backoff=$((backoff * 2 > 60 ? 60 : backoff * 2))
done
say "Ray ended: the container ends (Docker starts it again)"
exit 1
