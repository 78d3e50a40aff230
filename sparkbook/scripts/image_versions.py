"""What a serving runtime holds, for a bug report (`sparkbook collect`): run by ``bug_report.sh``
inside the image, without GPUs (``vllm --version`` crashes there, so vLLM is not imported), with
python3 as the entrypoint; or by the python of the runtime's virtualenv. Prints one line
``VERSIONS {json}``: Python, every installed package (name: version), torch's CUDA and the NCCL
that torch loads (where it answers without a GPU).

    python3 image_versions.py
"""

import importlib.metadata as md
import json
import sys

out = {"python": sys.version.split()[0], "packages": {}}
for dist in md.distributions():
    name = (dist.metadata or {}).get("Name")
    if name:
        out["packages"][name] = dist.version
try:
    import torch
    out["torch_cuda"] = torch.version.cuda
    v = torch.cuda.nccl.version()  # a tuple (2, 27, 7); an int 22707 in older torch
    out["nccl"] = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
except Exception as e:  # no torch, or a torch built without NCCL
    out["nccl_error"] = f"{type(e).__name__}: {e}"
print("VERSIONS " + json.dumps(out))
