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
        if vllm_config.parallel_config.worker_cls == "auto":
            vllm_config.parallel_config.worker_cls = f"{__package__}.lab_worker.PipelineCPUWorker"
        super().check_and_update_config(vllm_config)

    @classmethod
    def get_device_communicator_cls(cls) -> str:
        return f"{__package__}.lab_communicator.HostLocalCpuCommunicator"
