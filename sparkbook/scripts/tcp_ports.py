"""TCP reachability of the serving ports between the nodes, for sparkbook's preflight (01).

Every node runs this at the same moment, each with its own spec: it listens briefly on each port on
its own fabric address (never on all interfaces), connects to the same ports of every peer, and
prints one JSON line: what it listened on, how many probes it made, and each probe that failed
with what was seen. It exits once every peer has connected to (and left) each port it listens on
and its own probes are done, or at its deadline (window + timeout + 1 s), whichever comes first:
nothing stays listening after it, even when no one reads its answer.

A refused connection is retried until the window closes (the peer's listener may not be up yet); a
connection left unanswered for the timeout is a dropped SYN: a firewall. Standard library only.

    python3 tcp_ports.py '{"address": "10.77.1.11", "ports": [6379, 8000], "timeout": 2,
                           "window": 5, "peers": [["spark-2", "10.77.1.12"]]}'
"""

from __future__ import annotations

import errno
import json
import selectors
import socket
import sys
import threading
import time


def listen(address: str, ports: list[int]) -> tuple[dict[str, str], dict[int, socket.socket]]:
    """A listener on ``address`` for each free port; per port: listening, busy or the error."""
    state: dict[str, str] = {}
    socks: dict[int, socket.socket] = {}
    for port in ports:
        try:
            family, kind, proto, _, where = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM)[0]
            s = socket.socket(family, kind, proto)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(where)
            s.listen(64)
            s.setblocking(False)
        except OSError as e:
            state[str(port)] = "busy" if e.errno == errno.EADDRINUSE else f"error: {e.strerror or e}"
            continue
        socks[port] = s
        state[str(port)] = "listening"
    return state, socks


def probe(source: str, address: str, port: int, timeout: float, until: float) -> str:
    """ok, timeout (no answer: dropped), refused (after retries until ``until``), or the error.
    From this node's own fabric address, as Ray and NCCL connect: where the nodes are one machine
    (a test), a connection's port is then never one that a peer is about to listen on."""
    while True:
        try:
            with socket.create_connection((address, port), timeout=timeout, source_address=(source, 0)):
                return "ok"
        except ConnectionRefusedError:
            if time.monotonic() >= until:
                return "refused"
            time.sleep(0.2)
        except socket.timeout:
            return "timeout"
        except OSError as e:
            return e.strerror or str(e)


def main(spec: dict) -> dict:
    start = time.monotonic()
    timeout, window = float(spec["timeout"]), float(spec["window"])
    deadline = start + window + timeout + 1
    state, socks = listen(spec["address"], spec["ports"])
    failed: list[dict] = []
    lock = threading.Lock()

    def one(peer: str, address: str, port: int) -> None:
        seen = probe(spec["address"], address, port, timeout, start + window)
        if seen != "ok":
            with lock:
                failed.append({"peer": peer, "address": address, "port": port, "seen": seen})

    probes = [threading.Thread(target=one, args=(peer, address, port), daemon=True)
              for peer, address in spec["peers"] for port in spec["ports"]]
    for t in probes:
        t.start()
    # Accept every peer's connection until all have come (and gone) or the deadline. The peer
    # closes first, then this end: no TIME_WAIT is left on the port that Ray or vLLM binds next.
    accepted = {port: 0 for port in socks}
    sel = selectors.DefaultSelector()
    for port, s in socks.items():
        sel.register(s, selectors.EVENT_READ, port)
    want, open_conns = len(spec["peers"]), 0
    while time.monotonic() < deadline:
        if (all(n >= want for n in accepted.values()) and not open_conns
                and not any(t.is_alive() for t in probes)):
            break
        for key, _ in sel.select(timeout=0.1):
            sock = key.fileobj
            if key.data is None:  # an accepted connection: the peer closed it (or broke it)
                sel.unregister(sock)
                sock.close()  # type: ignore[union-attr]
                open_conns -= 1
                continue
            try:
                conn, _ = sock.accept()  # type: ignore[union-attr]
            except OSError:
                continue
            accepted[key.data] += 1
            open_conns += 1
            sel.register(conn, selectors.EVENT_READ, None)
    for key in list(sel.get_map().values()):
        key.fileobj.close()  # type: ignore[union-attr]
    with lock:
        return {"listen": state, "accepted": {str(p): n for p, n in accepted.items()},
                "probes": len(probes), "failed": sorted(failed, key=lambda f: (f["peer"], f["port"]))}


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))), flush=True)
