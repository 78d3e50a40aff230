"""What a serving runtime holds, for a bug report (`sparkbook collect`) and the run fingerprint:
run by ``bug_report.sh`` or ``fingerprint.sh`` inside the image, without GPUs (``vllm --version``
crashes there, so vLLM is not imported), with python3 as the entrypoint; or by the python of the
runtime's virtualenv. Prints one line ``VERSIONS {json}``: Python, every installed package (name:
version), torch's CUDA and the NCCL that torch loads (where it answers without a GPU).

With ``--light`` (the fingerprint, maybe in the serving container of a Spark whose memory vLLM
holds): NCCL as an installed nvidia-nccl package names it (the library a pip-installed torch
loads), else as the image's NCCL_VERSION (NVIDIA's images: the system NCCL a torch built there
loads), with ``nccl_from`` saying which; torch (about 1 GB of memory, seconds) is imported only
when neither names it.

    python3 image_versions.py [--light]
"""

import importlib.metadata as md
import json
import os
import sys

out = {"python": sys.version.split()[0], "packages": {}}
for dist in md.distributions():
    name = (dist.metadata or {}).get("Name")
    if name:
        out["packages"][name] = dist.version
# An image FROM nvidia/cuda carries its libnccl2's version as NCCL_VERSION (12.8.1: 2.25.1-1, its
# Dockerfile's ENV); a torch from pip in it loads its nvidia-nccl-cuXX dependency instead (pip-compile
# lists "nvidia-nccl-cu12 ... via torch"): the package, where there is one, comes first.
package = next((k for k in sorted(out["packages"]) if k.lower().replace("_", "-").startswith("nvidia-nccl")), None)
if "--light" in sys.argv[1:] and (package or os.environ.get("NCCL_VERSION")):
    out["nccl"] = out["packages"][package] if package else os.environ["NCCL_VERSION"]
    out["nccl_from"] = package or "NCCL_VERSION"
else:
    try:
        import torch
        out["torch_cuda"] = torch.version.cuda
        v = torch.cuda.nccl.version()  # a tuple (2, 27, 7); an int 22707 in older torch
        out["nccl"] = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
    except Exception as e:  # no torch, or a torch built without NCCL
        out["nccl_error"] = f"{type(e).__name__}: {e}"
print("VERSIONS " + json.dumps(out))
