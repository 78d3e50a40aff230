"""The failures of the fabric between the nodes and of the collectives over it: NCCL, RDMA,
gloo, the rendezvous and Ray's head.

Standard library only.
"""

from __future__ import annotations

from .kinds import ALL_STEPS, SERVING, NCCL_DETAIL, RAY_UP, sig

SIGNATURES = [
    sig("rdma-memlock",
        [r"Call to ibv_reg_mr\w* failed", r"ibv_\w{1,40}(?:\(\) | )failed.{0,40}Cannot allocate memory"],
        "RDMA could not register (lock) memory: the container's locked-memory limit is too low",
        "start the containers with `--ulimit memlock=-1` and `--cap-add IPC_LOCK` (runtime.rdma) and "
        "check `ulimit -l` inside them", phase="distributed init", steps=ALL_STEPS,
        detail=NCCL_DETAIL),
    sig("nccl-no-interface",
        [r"Bootstrap : no socket interface found", r"no NCCL_SOCKET_IFNAME interface found"],
        "NCCL found no usable network interface: NCCL_SOCKET_IFNAME names an interface the "
        "container does not have",
        "set NCCL_SOCKET_IFNAME (and GLOO_SOCKET_IFNAME) to the fabric rail's interface as the "
        "node names it (`ip -br addr`), with the container on the host network",
        phase="distributed init", steps=ALL_STEPS, detail=NCCL_DETAIL),
    sig("nccl-timeout",
        [r"Watchdog caught collective operation timeout",
         r"ProcessGroupNCCL.{0,80}(?:timed out|operation timeout)",
         r"NCCL (?:WARN|error).{0,120}[Tt]imeout",
         r"RayChannelTimeoutError|Timed out waiting for object available"],
        "an NCCL collective timed out or hung",
        "run 02_collectives.ipynb: check NCCL_SOCKET_IFNAME / NCCL_IB_HCA point at the fabric rails, the "
        "rails' MTU, and that RDMA devices reach the container (runtime.rdma)",
        phase="runtime", steps=ALL_STEPS, detail=NCCL_DETAIL,
        reason="fabric", fix="setting"),
    sig("nccl-error",
        [r"unhandled system error", r"remote process exited or there was a network error",
         r"ncclSystemError|ncclRemoteError|ncclInternalError|ncclUnhandledCudaError|"
         r"NCCL_ERROR_SYSTEM_ERROR",
         r"NCCL error.{0,200}(?:internal error|unhandled cuda error|invalid usage)"],
        "NCCL failed between the nodes: a system call or the network failed (a rail down, RDMA "
        "devices or locked memory missing in the container, a wrong interface), or a peer process "
        "died first (then its own log has the first error)",
        "run 02_collectives.ipynb with NCCL_DEBUG=INFO: the NCCL WARN line before the error names the "
        "call that failed; check the rails, their MTU, `--device /dev/infiniband`, IPC_LOCK and "
        "`--ulimit memlock=-1` on the containers, and the other node's log",
        phase="distributed init", steps=ALL_STEPS, detail=NCCL_DETAIL,
        reason="fabric", fix="setting", catch_all=True),
    sig("rendezvous-unreachable",
        [r"The client socket has timed out after \S+ while trying to connect to",
         r"DistNetworkError", r"Gloo connectFullMesh failed",
         r"TCPStore.{0,80}(?:Connection refused|timed out)"],
        "a rank could not reach the rendezvous or its peers (firewall, wrong rail address, the "
        "head's process not started)",
        "check every node reaches the head's fabric address on the rendezvous port (01_preflight.ipynb's "
        "ports check) and that the head's container started (its log)",
        # not 02's: its own diagnosis names the ranks that never joined and the address
        phase="distributed init",
        reason="fabric", fix="setting"),
    sig("ray-gcs-unreachable",
        [r"Unable to connect to GCS at", r"Failed to connect to GCS",
         r"Failed to get cluster ID from GCS", r"Timed out while waiting for GCS to become available"],
        "a node could not reach the Ray head (GCS): wrong head address, a firewall, or the head's "
        "Ray not running",
        "check the head's Ray container is up and that every node reaches its fabric address on "
        "the Ray port (04_ray_cluster.ipynb; 01_preflight.ipynb's ports check)", phase="ray",
        steps=("04",) + SERVING, cleared_by=RAY_UP,
        reason="fabric", fix="setting"),
    # vLLM and SGLang both print this line once a rank's tensor-parallel group spans nodes, then go
    # on ("Init torch distributed ends"); as the last line of every rank, the hang a DGX Spark pair
    # reported with SGLang's images, while vLLM's ran on the same fabric (source:
    # github.com/MiaAI-Lab/Qwen3.8-Flash-Next-Dual-DGX-Sparks/issues/3)
    sig("cross-node-init-hang",
        [r"Custom ?[Aa]llreduce is disabled because this process group spans across nodes"],
        "the ranks stopped while setting up their communicators across the nodes: each got as far "
        "as the all-reduce of a group that spans the nodes (NCCL had connected over the fabric), "
        "then nothing, and no weights were loaded",
        "run 02_collectives.ipynb with the serving image (NCCL over the rails, its NCCL version), and "
        "NCCL_DEBUG=INFO on every node to see the last channel each built; where the fabric passes, "
        "compare the image's NCCL and engine version with one that starts on it (on a DGX Spark pair "
        "this hang came with one engine's images while another's ran)",
        phase="distributed init", steps=SERVING, hang=True, reason="fabric", fix="version"),
]
