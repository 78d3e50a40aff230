#!/usr/bin/env bash
# One end of a perftest measurement of one rail between two nodes, for sparkbook's 02: the server
# (it waits for one client) or the client (it connects to the server's rail address, trying again
# while the server is still starting). Prints the tool's output, then "RDMA-EXIT CODE"; where the
# tool is missing, only "RDMA-UNAVAILABLE TOOL". perftest's server takes the client's connection
# details on a TCP port, on every interface unless told otherwise: with --bind_source_ip (perftest
# 4.5 and later) it listens on the rail's own address only; an older perftest would listen
# everywhere, so it is not run: only "RDMA-BIND all" is printed.
# Usage: rdma_test.sh server|client bw|bidir|lat HCA GID_INDEX PORT SECONDS SIZE QPS ITERS WAIT RAIL_IP [SERVER_IP]
#   SECONDS, SIZE, QPS: a bandwidth test's length (-D), message size (-s) and QPs (-q); ITERS: the
#   latency test's round trips (-n, of perftest's default 2 bytes); WAIT: the seconds a client
#   tries again while its server starts
#   e.g. rdma_test.sh client bw rocep1s0f1 3 18515 3 65536 4 1000 20 10.0.0.1 10.0.0.2
set -euo pipefail
export LC_ALL=C
role=$1 test=$2 hca=$3 gid=$4 port=$5 seconds=$6 size=$7 qps=$8 iters=$9 wait_s=${10} rail_ip=${11} server=${12:-}
tool=ib_write_bw
[ "$test" = lat ] && tool=ib_write_lat
if ! command -v "$tool" >/dev/null; then
  echo "RDMA-UNAVAILABLE $tool"
  exit 0
fi
args=(-d "$hca" -i 1 -x "$gid" -p "$port" -F)
case $test in
  bw) args+=(-s "$size" -D "$seconds" --report_gbits -q "$qps") ;;
  bidir) args+=(-s "$size" -D "$seconds" --report_gbits -q "$qps" -b) ;;
  lat) args+=(-n "$iters") ;;
  *) echo "RDMA-EXIT 2 unknown test $test"; exit 2 ;;
esac
help=$("$tool" --help 2>&1 || true)  # perftest's --help exits non-zero
if grep -q -- --bind_source_ip <<<"$help"; then
  args+=(--bind_source_ip "$rail_ip")
else
  echo "RDMA-BIND all"  # its port would open on every interface: not run
  exit 0
fi
[ "$role" = client ] && args+=("$server")
echo "RDMA-COMMAND $tool ${args[*]}"
if [ "$role" = server ]; then
  code=0
  "$tool" "${args[@]}" 2>&1 || code=$?
  echo "RDMA-EXIT $code"
  exit 0
fi
# the client: the server may not listen yet (both ends start at once); nothing else is retried
deadline=$((SECONDS + wait_s))
while :; do
  code=0
  out=$("$tool" "${args[@]}" 2>&1) || code=$?
  if [ "$code" -eq 0 ] || ! grep -q "Couldn't connect to" <<<"$out" || [ "$SECONDS" -ge "$deadline" ]; then
    break
  fi
  sleep 0.3
done
printf '%s\n' "$out"
echo "RDMA-EXIT $code"
