"""The failures of the fabric between the nodes and of the collectives over it: NCCL, RDMA,
gloo, the rendezvous and Ray's head.

Standard library only.
"""

from __future__ import annotations

from .kinds import ALL_STEPS, NCCL_DETAIL, PROGRESS, RAY_UP, SERVING, sig

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

# Mined from public threads (2026-12-06): each pattern names the logs it was written from, which
# are in tests/fixtures/logs/ under the signature's name.
SIGNATURES += [
    sig("ib-completion-error",
        [(r"NET/IB\w* ?: Got completion (?:from peer \S+ )?with (?:status=|error )",
          "NVIDIA/nccl#1405", "NVIDIA/nccl#426", "NVIDIA/nccl-tests#252", "NVIDIA/nccl#1710",
          "eugr/spark-vllm-docker#150"),
         (r"NET/IB ?: \S+ Got async event : (?:local access violation|.{0,60}error)", "NVIDIA/nccl#1710")],
        "an RDMA transfer between the nodes failed after the connection was made: the work completion "
        "came back with an error (status 12, retry exceeded: the peer never acknowledged, as with a "
        "link-local or RoCE v1 GID, an MTU that differs between the ends, or a link that flaps; status "
        "4, 9 or 10: memory registration or GPUDirect is not usable on this path)",
        "run 02_collectives.ipynb with NCCL_DEBUG=INFO: set NCCL_IB_GID_INDEX to the RoCE v2 GID that "
        "carries the rail's IPv4 address (`show_gids`, the same index on every node), check MTU 9000 on "
        "both ends and the links (`ibdev2netdev`); on GB10 try NCCL_NET_GDR_LEVEL=LOC (no GPUDirect RDMA "
        "through peermem); a link that flaps: reseat the cable",
        phase="runtime", steps=ALL_STEPS, detail=NCCL_DETAIL, reason="fabric", fix="setting"),
    sig("ib-qp-connect-failed",
        [(r"Call to ibv_modify_qp failed with (?:error )?(?:\d+ )?(?:Connection timed out|Network is "
          r"unreachable|No route to host|No such device)",
          "NVIDIA/nccl-tests#185", "NVIDIA/nccl#2013", "NVIDIA/nccl#769")],
        "the two ends of an RDMA connection cannot address each other: the GID index picks a link-local "
        "or unrouted address, the rails are on different subnets, or NCCL paired a device that is not "
        "the cabled one",
        "set NCCL_IB_GID_INDEX to the RoCE v2 GID of the rail's IPv4 address, NCCL_IB_HCA to the cabled "
        "devices only (`ibdev2netdev`), and give each rail's two ends addresses in one subnet "
        "(`sparkbook fabric plan`); with more than two nodes try NCCL_CROSS_NIC=0",
        phase="distributed init", steps=ALL_STEPS, detail=NCCL_DETAIL, reason="fabric", fix="setting"),
    sig("rdma-not-in-container",
        [(r"NET/IB ?: No device found", "NVIDIA/nccl#451", "NVIDIA/nccl#941"),
         (r"Failed to open libibverbs\.so", "sgl-project/sglang#1427", "vllm-project/vllm#6732",
          "NVIDIA/nccl-tests#14"),
         (r"NET/IB ?: Unable to open device|Call to ibv_open_device failed", "NVIDIA/nccl#451")],
        "NCCL found no RDMA device in the container and fell back to TCP sockets (or found none and "
        "stopped): /dev/infiniband was not passed in, or the image has no libibverbs and mlx5 driver",
        "start the containers with `--device /dev/infiniband --cap-add IPC_LOCK --ulimit memlock=-1` "
        "(runtime.rdma) and use an image that ships rdma-core (`ibv_devinfo` inside it lists the rails)",
        phase="distributed init", steps=ALL_STEPS, cleared_by=PROGRESS, detail=NCCL_DETAIL,
        reason="configuration", fix="setting"),
    sig("nccl-duplicate-gpu",
        [(r"Duplicate GPU detected : rank \d+ and rank \d+ both on CUDA device",
          "verl-project/verl#161", "NVIDIA/Megatron-LM#661", "horovod/horovod#3929")],
        "two ranks of one communicator are on one GPU of one host, as NCCL tells hosts apart (by host "
        "hash and bus id): two workers placed on one node, or two nodes NCCL takes for one (the same "
        "hostname or NCCL_HOSTID)",
        "`ray status` must show one GPU on each node (04_ray_cluster.ipynb); give each node its own "
        "hostname and VLLM_HOST_IP / `ray start --node-ip-address`, and do not set one NCCL_HOSTID on all",
        phase="distributed init", steps=ALL_STEPS, detail=NCCL_DETAIL, reason="configuration", fix="setting"),
    sig("nccl-peer-unreachable",
        [(r"[Cc]onnect(?: to \S+)? returned \d*\(?(?:No route to host|Connection refused|Network is unreachable)",
          "sgl-project/sglang#3820", "hiyouga/LlamaFactory#8045", "pytorch/pytorch#38702"),
         (r"Socket creation failed : Address family not supported", "NVIDIA/nccl-tests#14")],
        "a rank could not open a TCP connection to another rank's NCCL socket: NCCL took the wrong "
        "interface (the management port or docker0, NCCL_SOCKET_IFNAME unset or wrong), a firewall "
        "drops the ports, or the container is not on the host network",
        "set NCCL_SOCKET_IFNAME to the fabric rail on every node, run the containers with "
        "`--network host`, and let the rails pass TCP between the nodes (01_preflight.ipynb's ports "
        "check)",
        phase="distributed init", steps=ALL_STEPS, detail=NCCL_DETAIL, reason="fabric", fix="setting"),
    sig("gloo-loopback-address",
        [(r"Unable to resolve hostname to a \(local\) address", "vllm-project/vllm#7074",
          "aws-samples/aws-do-eks#50"),
         (r"connect \[127\.\d+\.\d+\.\d+\]:\d+|remote=\[127\.", "pytorch/pytorch#15592",
          "aws-samples/aws-do-eks#50")],
        "gloo bound to the loopback address: the node's hostname resolves to 127.0.1.1 (Ubuntu's "
        "/etc/hosts), so the other ranks were told to connect to it",
        "set GLOO_SOCKET_IFNAME to the fabric rail (as NCCL_SOCKET_IFNAME) on every node, or make the "
        "hostname resolve to the rail's address",
        phase="distributed init", steps=ALL_STEPS, reason="configuration", fix="setting"),
    sig("gloo-bad-ifname",
        [(r"Unable to find address for: \S+", "aws-samples/aws-do-eks#51")],
        "GLOO_SOCKET_IFNAME names an interface the container does not have (or one without an IPv4 "
        "address), or NCCL's list syntax (`^lo,docker`), which gloo reads as one name",
        "set GLOO_SOCKET_IFNAME to one interface that exists in the container with an address "
        "(`ip -br addr` on the node, with the container on the host network)",
        phase="distributed init", steps=ALL_STEPS, reason="configuration", fix="setting"),
    sig("nccl-cuda-unsupported-op",
        [(r"NCCL WARN Cuda failure 'operation not supported'", "NVIDIA/nccl#2101",
          "meta-pytorch/torchtune#2556", "sgl-project/sglang#16015")],
        "NCCL's initialisation used a CUDA feature (memory pools, cuMem) that this driver or GPU does "
        "not offer to it: the image's NCCL and CUDA do not fit the node's driver",
        "use an image built for the node's CUDA and driver (on GB10, CUDA 13); as a workaround try "
        "NCCL_CUMEM_ENABLE=0 in serving.env",
        phase="distributed init", steps=ALL_STEPS, detail=NCCL_DETAIL, reason="version", fix="version"),
    sig("nccl-version-mismatch",
        # NCCL's init.cc writes it; no public log holds it
        [r"Mismatched NCCL version detected"],
        "the ranks run different NCCL versions: the nodes' images differ",
        "run the same image on every node (03_distribute_image.ipynb copies it; 04_ray_cluster.ipynb compares them)",
        phase="distributed init", steps=ALL_STEPS, detail=NCCL_DETAIL, reason="version", fix="version"),
]
