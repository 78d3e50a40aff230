#!/usr/bin/python3 -IS
"""Simulated perftest for the lab: ``ib_write_bw`` and ``ib_write_lat`` on each lab node's PATH
(links to this file), printing what perftest prints (linux-rdma/perftest; real outputs of DGX
Sparks with their sources in tests/fixtures/perftest/), for what the rail really carries.

The lab's kernel has no RDMA, so the data goes over a real TCP stream between the two nodes' rail
addresses, the ones the HCA named by ``-d`` sits on: the veth of the lab's fabric, shaped by the
node's state as a cable would be (the lab faults' `tc` shaping of a rail, its link state). The
bandwidth test streams for ``-D`` seconds (both ways at once with ``-b``, whose row is the sum, as
perftest's is); the latency test times ``-n`` round trips of ``-s`` bytes and reports half of each.
Rows are judged as real ones: sparkbook cannot tell them apart, which is the point; the tool says
on stderr that it is simulated, and in its title line.

Standalone on purpose: runs with the node's python3; reads the node's state through simhw.py beside it.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
import simhw  # noqa: E402  (beside this file on the node's PATH)

PORT = 18515  # perftest's default
CHUNK = 1 << 20
LINE = "-" * 87
USAGE = """Usage:
  {tool}            start a server and wait for connection
  {tool} <host>     connect to server at <host>

Options:
  -p, --port=<port>  Listen on/connect to port <port> (default 18515)
  -d, --ib-dev=<dev>  Use IB device <dev> (default first device found)
  -i, --ib-port=<port>  Use port <port> of IB device (default 1)
  -s, --size=<size>  Size of message to exchange (default 65536)
  -n, --iters=<iters>  Number of exchanges (at least 5, default 1000)
  -x, --gid-index=<index>  Test uses GID with GID index
  -D, --duration  Run test for a customized period of seconds.
  -b, --bidirectional  Measure bidirectional bandwidth (default unidirectional)
  -q, --qp=<num of qp's>  Num of qp's(default 1)
  -F, --CPU-freq  Do not show a warning even if cpufreq_ondemand module is loaded
  --report_gbits  Report Max/Average BW of test in Gbit/sec (instead of MiB/sec)
  --bind_source_ip  Source IP of the interface used for connection establishment
"""

FLAGS = {"-p": "port", "--port": "port", "-d": "dev", "--ib-dev": "dev", "-i": "ib_port", "--ib-port": "ib_port",
         "-s": "size", "--size": "size", "-n": "iters", "--iters": "iters", "-x": "gid", "--gid-index": "gid",
         "-D": "duration", "--duration": "duration", "-q": "qps", "--qp": "qps", "--bind_source_ip": "bind"}
SWITCHES = {"-b": "bidir", "--bidirectional": "bidir", "-F": "cpu_freq", "--CPU-freq": "cpu_freq",
            "--report_gbits": "gbits"}


def options(tool: str, argv: list[str]) -> dict:
    lat = tool.endswith("_lat")
    o = {"port": PORT, "dev": None, "size": 2 if lat else 65536, "iters": 1000 if lat else 5000, "gid": 3,
         "duration": None, "qps": 1, "bind": None, "bidir": False, "gbits": False, "server": None}
    args = list(argv)
    while args:
        a = args.pop(0)
        key, _, value = a.partition("=")
        if key in FLAGS:
            o[FLAGS[key]] = value or args.pop(0)
        elif a in SWITCHES:
            o[SWITCHES[a]] = True
        elif a in ("-h", "--help"):
            print(USAGE.format(tool=tool))
            sys.exit(0)
        elif a.startswith("-"):
            print(f"{tool}: unrecognized option '{a}'", file=sys.stderr)
            sys.exit(1)
        else:
            o["server"] = a
    for k in ("port", "size", "iters", "gid", "qps"):
        o[k] = int(o[k])
    o["duration"] = float(o["duration"]) if o["duration"] else None
    return o


def device(s: dict, name: str | None) -> tuple[dict, dict | None]:
    """The HCA named by -d (the first otherwise) and its netdev's link."""
    found = [(n, link) for n, link in simhw.nics(s) if name in (None, n["hca"])]
    if not found:
        print(f"IB device {name} not found\n Unable to find the Infiniband/RoCE device", flush=True)
        sys.exit(1)
    return found[0]


def header(title: str, o: dict, nic: dict, link: dict) -> str:
    mtu, _ = simhw.ib_mtu(link["mtu"])
    lines = [LINE, f"                    {title}    ({simhw.MARK})",
             f" Dual-port       : OFF\t\tDevice         : {nic['hca']}",
             f" Number of qps   : {o['qps']}\t\tTransport type : IB",
             " Connection type : RC\t\tUsing SRQ      : OFF",
             " PCIe relax order: ON", " ibv_wr* API     : ON",
             f" TX depth        : {1 if 'Latency' in title else 128}",
             f" Mtu             : {mtu}[B]", " Link type       : Ethernet", f" GID index       : {o['gid']}",
             " Max inline data : 0[B]", " rdma_cm QPs\t : OFF", " Data ex. method : Ethernet", LINE]
    return "\n".join(lines)


def addresses(local: str, remote: str) -> str:
    gid = lambda ip: "00:00:00:00:00:00:00:00:00:00:255:255:" + ":".join(f"{int(b):02d}" for b in ip.split("."))  # noqa: E731
    return "\n".join([f" local address: LID 0000 QPN 0x0{os.getpid() % 4096:03x} PSN 0x{os.getpid() * 7919 % 16**6:06x}",
                      f" GID: {gid(local)}", f" remote address: LID 0000 QPN 0x0{(os.getpid() + 1) % 4096:03x} "
                      f"PSN 0x{os.getpid() * 104729 % 16**6:06x}", f" GID: {gid(remote)}", LINE])


def stream_out(conn: socket.socket, seconds: float) -> None:
    """Frames of CHUNK bytes for ``seconds``, each behind its length, then a length of 0 (the
    connection stays open for the exchange of the counts)."""
    buf, frame = bytes(CHUNK), CHUNK.to_bytes(8, "big")
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        conn.sendall(frame)
        conn.sendall(buf)
    conn.sendall(bytes(8))


def read_exactly(conn: socket.socket, view: memoryview) -> None:
    got = 0
    while got < len(view):
        k = conn.recv_into(view[got:])
        if not k:
            raise ConnectionError("the peer closed the connection")
        got += k


def stream_in(conn: socket.socket) -> tuple[int, float]:
    """Bytes received until the sender's end, and the seconds from the first frame on."""
    buf, head = bytearray(CHUNK), bytearray(8)
    got, start = 0, None
    while True:
        read_exactly(conn, memoryview(head))
        n = int.from_bytes(head, "big")
        if not n:
            return got, time.monotonic() - (start or time.monotonic())
        start = start or time.monotonic()
        read_exactly(conn, memoryview(buf)[:n])
        got += n


def report_bw(o: dict, bytes_moved: int, seconds: float) -> str:
    rate = bytes_moved * 8 / max(seconds, 1e-9)  # bits/s
    iters = bytes_moved // o["size"]
    if o["gbits"]:
        unit, value = "Gb/sec", rate / 1e9
    else:
        unit, value = "MB/sec", rate / 8 / 2**20
    head = f" #bytes     #iterations    BW peak[{unit}]    BW average[{unit}]   MsgRate[Mpps]"
    row = f" {o['size']:<10} {iters:<16} {0.0:<18.2f} {value:<18.2f} {iters / max(seconds, 1e-9) / 1e6:.6f}"
    return "\n".join([head, row, LINE])


def report_lat(o: dict, us: list[float]) -> str:
    us = sorted(us)
    pct = lambda p: us[min(len(us) - 1, int(p * len(us)))]  # noqa: E731
    head = (" #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    "
            "t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] ")
    row = (f" {o['size']:<7} {len(us):<13} {us[0]:<14.2f} {us[-1]:<12.2f} {statistics.median(us):<18.2f} "
           f"{statistics.mean(us):<15.2f} {statistics.pstdev(us):<15.2f} {pct(0.99):<23.2f} {pct(0.999):.2f}")
    return "\n".join([head, row, LINE])


def exchange(conn: socket.socket, mine: dict) -> dict:
    """perftest's out-of-band exchange of the connection details: a line each way."""
    conn.sendall((json.dumps(mine) + "\n").encode())
    data = b""
    while not data.endswith(b"\n"):  # a byte at a time: what follows the line is the peer's data
        chunk = conn.recv(1)
        if not chunk:
            raise ConnectionError("the peer closed the connection")
        data += chunk
    return json.loads(data)


def run_bw(conn: socket.socket, o: dict, sending: bool) -> tuple[int, float]:
    """The bytes of this run and their seconds, as the client reports them: what the server
    received (one way), or the sum of both directions (-b)."""
    seconds = o["duration"] or max(o["iters"] * o["size"] / 2e9, 0.2)
    if o["bidir"]:
        out = threading.Thread(target=stream_out, args=(conn, seconds))
        out.start()
        got, took = stream_in(conn)
        out.join()
        theirs = exchange(conn, {"bytes": got, "seconds": took})
        return got + int(theirs["bytes"] * took / max(theirs["seconds"], 1e-9)), took
    if sending:
        stream_out(conn, seconds)
        counted = exchange(conn, {})
        return counted["bytes"], counted["seconds"]
    got, took = stream_in(conn)
    exchange(conn, {"bytes": got, "seconds": took})
    return got, took


def run_lat(conn: socket.socket, o: dict, client: bool) -> list[float]:
    msg, times = bytes(max(o["size"], 1)), []
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for _ in range(o["iters"]):
        start = time.perf_counter()
        if client:
            conn.sendall(msg)
        got = 0
        while got < len(msg):
            chunk = conn.recv(len(msg) - got)
            if not chunk:
                raise ConnectionError("the peer closed the connection")
            got += len(chunk)
        if not client:
            conn.sendall(msg)
        times.append((time.perf_counter() - start) * 1e6 / 2)
    return times


def main(argv: list[str]) -> int:
    tool = os.path.basename(argv[0])
    s = simhw.state()
    o = options(tool, argv[1:])
    print(f"[{simhw.MARK} {tool} on {s['node']}]", file=sys.stderr)
    nic, link = device(s, o["dev"])
    if not simhw.is_up(link):
        print(f" Port number {o.get('ib_port', 1)} state is Down\n Couldn't create IB resources", flush=True)
        return 1
    local = (simhw.addresses().get(nic["netdev"]) or [None])[0]
    lat = tool.endswith("_lat")
    title = "RDMA_Write " + ("Latency Test" if lat else "Bidirectional BW Test" if o["bidir"] else "BW Test")
    if o["server"] is None:
        print("\n************************************\n* Waiting for client to connect... *\n"
              "************************************", flush=True)
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((o["bind"] or "0.0.0.0", o["port"]))
        listener.listen(1)
        conn, _ = listener.accept()
        listener.close()  # one client, as perftest's server
    else:
        try:
            conn = socket.create_connection((o["server"], o["port"]), timeout=10,
                                            source_address=(o["bind"], 0) if o["bind"] else None)
        except OSError:
            print(f"Couldn't connect to {o['server']}:{o['port']}\nUnable to open file descriptor for socket "
                  "connection Unable to init the socket connection", flush=True)
            return 1
        conn.settimeout(None)
    with conn:
        peer = exchange(conn, {"ip": local})
        print(header(title, o, nic, link))
        print(addresses(local or "0.0.0.0", peer["ip"] or "0.0.0.0"))
        if lat:
            us = run_lat(conn, o, client=o["server"] is not None)
            print(report_lat(o, us))
        else:
            moved, seconds = run_bw(conn, o, sending=o["server"] is not None)
            if o["duration"]:
                print(" WARNING: BW peak won't be measured in this run.")
            print(report_bw(o, moved, seconds))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
