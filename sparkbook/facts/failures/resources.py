"""The failures of resources: memory (the GPU's, which on GB10 is the host's, the KV cache's,
Ray's threshold) and disk.

Standard library only.
"""

from __future__ import annotations

from .kinds import ALL_STEPS, NCCL_DETAIL, SERVING, sig

SIGNATURES = [
    sig("free-memory-at-startup",
        [r"Free memory on device.{0,80}on startup is less than desired GPU memory utilization",
         r"Free memory on device.{0,80}less than desired"],
        "less memory was free when vLLM started than serving.gpu_memory_utilization asks for (a "
        "share of the total memory, not of what is free): on GB10 the page cache and every other "
        "process share the same unified memory",
        "lower serving.gpu_memory_utilization below free/total from the message, stop other GPU "
        "processes (a previous vLLM still running?) and drop the page cache before starting "
        "(`sync; echo 3 | sudo tee /proc/sys/vm/drop_caches`)", phase="kv cache",
        reason="resource", fix="setting"),
    sig("kv-cache-too-small",
        [r"KV cache is needed, which is larger than the available KV cache memory",
         r"No available memory for the cache blocks",
         r"larger than the maximum number of tokens that can be stored in KV cache"],
        "the KV cache does not fit: after the weights, the memory left cannot hold one request of "
        "the model's maximum length",
        "lower serving.max_model_len (the message names the longest that fits), raise "
        "serving.gpu_memory_utilization, or use a smaller or more quantised model / an fp8 KV cache",
        phase="kv cache",
        reason="resource", fix="setting"),
    sig("ray-oom-killer",
        [r"killed due to memory pressure \(OOM\)", r"ray\.exceptions\.OutOfMemoryError",
         r"Task was killed due to the node running low on memory",
         r"which exceeds the memory usage threshold"],
        "Ray's memory monitor killed a worker: on GB10 the memory the GPU uses is host memory too, "
        "so Ray counts the model's weights and KV cache against its threshold",
        "start Ray with RAY_memory_monitor_refresh_ms=0 (or a higher RAY_memory_usage_threshold), "
        "or lower serving.gpu_memory_utilization", steps=("04",) + SERVING,
        reason="resource", fix="setting"),
    sig("disk-full",
        [r"\[Errno 28\] No space left on device", r"No space left on device \(os error 28\)",
         r"code: 28, kind: StorageFull"],
        "a disk on the node is full: the one holding the model, the Hugging Face cache, Docker's "
        "storage or /tmp (a download, an image or Ray's spill files filled it)",
        "free space on the node (`df -h`; `docker image prune` removes unused images) or point the "
        "model or cache at a bigger disk; 01_preflight.ipynb's model disk and docker disk rows show "
        "what is free",
        steps=ALL_STEPS,
        reason="resource", fix="setting"),
    sig("out-of-memory",
        [r"CUDA out of memory|OutOfMemoryError|CUDA error: out of memory",
         r"Cannot allocate memory", r"NV_ERR_NO_MEMORY", r"invoked oom-killer|Out of memory: Killed process"],
        "out of memory",
        "lower serving.gpu_memory_utilization or serving.max_model_len; on GB10 stop other GPU "
        "processes and drop the page cache (`sync; echo 3 | sudo tee /proc/sys/vm/drop_caches`)",
        steps=ALL_STEPS,
        reason="resource", fix="setting"),
]

# Mined from public threads (2026-12-06), as in fabric.py.
SIGNATURES += [
    sig("shm-too-small",
        [(r"Error while creating shared memory segment", "pytorch/ci-infra#490", "hiyouga/LlamaFactory#7233",
          "kserve/kserve#3791", "NVIDIA/nccl#342"),
         (r"failed to extend /dev/shm/", "pytorch/ci-infra#490", "kserve/kserve#3791"),
         (r"unable to write to file </torch_", "idiap/ESLAM#20", "pangeo-data/pangeo-docker-images#258"),
         (r"insufficient shared memory \(shm\)", "pangeo-data/pangeo-docker-images#258"),
         (r"SemLock\(.{0,200}No space left on device", "OptimalScale/LMFlow#160")],
        "the container's /dev/shm is too small (Docker gives 64 MB unless told otherwise) for NCCL's "
        "shared-memory transport, torch's shared tensors or vLLM's broadcast buffers: the disk is not full",
        "run the containers with `--ipc=host` or a large `--shm-size` (`df -h /dev/shm` inside one shows "
        "the limit)",
        phase="distributed init", steps=ALL_STEPS, detail=NCCL_DETAIL, reason="resource", fix="setting"),
]
