"""The failures of the platform under the engine: the image's architecture and CUDA against the
node's driver, the NVIDIA container runtime, Docker's socket and registries, kernels that were not
built (or cannot be assembled) for GB10's sm_121, and the model files on their way from the
Hugging Face Hub. Each pattern names the public logs it was written from (tests/fixtures/logs/).

Standard library only.
"""

from __future__ import annotations

from .kinds import ALL_STEPS, PROGRESS, sig

SIGNATURES = [
    # -- the container and the driver under it: they fail before anything in the image runs
    sig("image-wrong-architecture",
        [(r"[Ee]xec format error", "mmartial/ComfyUI-Nvidia-Docker#96", "remsky/Kokoro-FastAPI#401",
          "vllm-project/vllm#30076", "mlcommons/mlperf-automations#942"),
         # Docker: "The requested image's platform (X) does not match the detected host platform";
         # podman: "image platform (X) does not match the expected platform"
         (r"platform \(\S+\) does not match the (?:detected host|expected) platform",
          "microsoft/TRELLIS.2#32", "vllm-project/vllm#30076"),
         (r"[Nn]o matching manifest for \S+ in the manifest list entries", "Aandree5/picard-web#51",
          "LAION-AI/Open-Assistant#2721"),
         (r"InvalidBaseImagePlatform", "mlcommons/mlperf-automations#942")],
        "the image (or the base it was built from) is for another CPU architecture: a DGX Spark "
        "is ARM64 (aarch64), and an amd64-only image either has no arm64 variant to pull or "
        "cannot execute its programs",
        "use an arm64 image built for GB10 (runtime.image: NVIDIA's vLLM container or a "
        "vllm/vllm-openai `-aarch64` tag, or a Spark community image) and check it on every node "
        "with `docker image inspect --format '{{.Architecture}}' IMAGE` (arm64); do not force "
        "`--platform linux/amd64`: an emulated container has no GPU",
        phase="container", steps=ALL_STEPS, cleared_by=PROGRESS, reason="configuration", fix="version"),
    sig("cuda-driver-too-old",
        [(r"forward compatibility was attempted on non supported HW", "gpustack/gpustack#1540",
          "vllm-project/vllm#5510", "NVIDIA/TensorRT-LLM#1806"),
         (r"unsupported display driver / cuda driver combination", "gpustack/gpustack#4678"),
         # CUDA's errors 803 (cudaErrorSystemDriverMismatch) and 804
         # (cudaErrorCompatNotSupportedOnDevice) as torch reports them at CUDA init
         (r"Unexpected error from cudaGetDeviceCount\(\).{0,200}?Error 80[34]: ",
          "gpustack/gpustack#1540", "vllm-project/vllm#5510", "gpustack/gpustack#4678",
          "NVIDIA/TensorRT-LLM#1806"),
         (r"The NVIDIA driver on your system is too old", "guqiong96/Lvllmds4#46",
          "vllm-project/vllm#33992"),
         # the NVIDIA container runtime refuses the image's NVIDIA_REQUIRE_CUDA before it starts
         (r"nvidia-container-cli: requirement error: unsatisfied condition: cuda ?>=",
          "vllm-project/vllm#5635", "theroyallab/tabbyAPI#324", "SyneRBI/PETRIC2#27")],
        "the image's CUDA is newer than the node's NVIDIA driver supports (the container runtime "
        "refuses it, or CUDA fails to initialise), or the image loaded its own forward-"
        "compatibility libcuda (cuda-compat; vllm/vllm-openai images from v0.15 put it on the "
        "library path) on a GPU whose driver will not take it: forward compatibility works on "
        "datacenter GPUs only",
        "compare `nvidia-smi`'s 'CUDA Version' on every node with the image's CUDA and keep them "
        "in step (update DGX OS for a newer driver, or pick a runtime.image built for the nodes' "
        "CUDA 13); where the image ships cuda-compat, keep its libcuda out: "
        "VLLM_ENABLE_CUDA_COMPATIBILITY=0 in serving.env, or LD_LIBRARY_PATH to the host "
        "driver's libraries",
        phase="container", steps=ALL_STEPS, reason="version", fix="version"),
    sig("nvml-driver-mismatch",
        [(r"[Dd]river/library version mismatch", "Lightning-AI/pytorch-lightning#10128",
          "tinygrad/open-gpu-kernel-modules#47", "intel/llvm#17614")],
        "the node's NVIDIA libraries and its loaded kernel module are different versions: the "
        "driver was upgraded (apt, unattended upgrades, a DGX OS update) and the node has not "
        "rebooted since",
        "reboot the node (every node that was updated) and check `nvidia-smi` answers on each "
        "before serving; 01_preflight.ipynb reads the driver version of every node",
        phase="container", steps=ALL_STEPS, reason="version", fix="reboot"),
    sig("nvidia-runtime-missing",
        [(r"unknown or invalid runtime name: nvidia", "nv-tlabs/3dgrut#71", "NVIDIA-NeMo/labs-molt#88",
          "Leon-Sander/Local-Multimodal-AI-Chat#31")],
        "a container was started with `--runtime nvidia` (a script, a compose file or extra "
        "docker arguments) and the node's Docker has no runtime of that name: the NVIDIA "
        "Container Toolkit is not installed or not registered with Docker, or Docker was not "
        "restarted after it was",
        "register it on the node (`sudo nvidia-ctk runtime configure --runtime=docker && sudo "
        "systemctl restart docker`; 01_preflight.ipynb's 'nvidia runtime' row), or start the "
        "container with `--gpus all` and no `--runtime` (what runtime.gpus does)",
        phase="container", steps=ALL_STEPS, reason="configuration", fix="setting"),
    sig("container-toolkit-broken",
        [(r"nvidia-container-cli: initialization error: load library failed",
          "NVIDIA/libnvidia-container#231", "docker/for-win#13835")],
        "the NVIDIA container toolkit cannot load the node's driver library (libnvidia-ml): the "
        "driver is not installed, or not where the toolkit looks for it",
        "check `nvidia-smi` on the node itself; reinstall the driver (on a DGX Spark, DGX OS's "
        "packages) or the NVIDIA Container Toolkit until `docker run --rm --gpus all IMAGE "
        "nvidia-smi` works",
        phase="container", steps=ALL_STEPS, reason="configuration", fix="setting"),
    sig("docker-socket-permission",
        [(r"permission denied while trying to connect to the Docker daemon socket",
          "JdeRobot/RoboticsAcademy#2317", "microsoft/AI-Red-Teaming-Playground-Labs#55",
          "NVIDIA/nvidia-docker#1138")],
        "the user that ran `docker` may not use the Docker daemon's socket: on a fresh node, a "
        "user (or an SSH session opened before the change) outside the `docker` group",
        "`sudo usermod -aG docker $USER` on every node, then open a new SSH session (sparkbook's "
        "commands run over SSH); 01_preflight.ipynb's docker row checks it",
        phase="container", steps=ALL_STEPS, reason="configuration", fix="setting"),
    sig("image-not-available",
        # the registry's refusal as the daemon passes it on (not a compose "Warning" line: compose
        # prints one for an image it then builds)
        [(r"Error response from daemon: .{0,300}?: denied: ",
          "NVIDIA-AI-Blueprints/bring-llms-to-nim#8", "NVlabs/VILA#147", "NVlabs/alpasim#44"),
         (r"Error response from daemon: .{0,300}?manifest unknown", "duixcom/Duix-Avatar#24",
          "OVINC-CN/OpenWebUI#271", "OpenVoiceOS/ovos-docker#21")],
        "the node has no image of that name and the registry would not give it: the name or tag "
        "is wrong or was never published, the image was built or loaded on another node only, "
        "or the registry needs a login (nvcr.io does)",
        "`docker image ls` on every node: load the same image on each (03_distribute_image.ipynb) "
        "or correct runtime.image's tag; for nvcr.io, `docker login nvcr.io` with the user "
        "`$oauthtoken` and an NGC API key",
        phase="container", steps=ALL_STEPS, reason="configuration", fix="setting"),
    sig("cuda-runtime-lib-missing",
        [(r"libcudart\.so\.\d+: cannot open shared object file", "llm-d/llm-d#1402",
          "vllm-project/vllm#52300")],
        "a library in the image was built for another CUDA major version than the image holds "
        "(vLLM's extensions for CUDA 12 in a CUDA 13 image, or the other way round)",
        "use an image whose vLLM, PyTorch and CUDA agree on the major version (cu130 throughout "
        "for a DGX Spark); 05_serve.ipynb's image check shows the versions inside runtime.image",
        phase="container", steps=ALL_STEPS, reason="version", fix="version"),
    # -- kernels for GB10 (sm_121): the image runs, its GPU code does not
    sig("triton-ptxas-arch",
        [(r"ptxas fatal\s*: Value 'sm_\w+' is not defined for option 'gpu-name'",
          "triton-lang/triton#8539", "vllm-project/vllm#32575", "vllm-project/vllm#30163"),
         (r"PTXASError: PTXAS error: Internal Triton PTX codegen error", "triton-lang/triton#8539",
          "opendatalab/MinerU#4350")],
        "Triton could not assemble a kernel for this GPU: the ptxas bundled with the image's "
        "Triton (CUDA 12.8's) does not know GB10's sm_121a, although the image's own CUDA does; "
        "it fails at the first Triton kernel, after the weights load",
        "point Triton at the image's CUDA 13 ptxas: TRITON_PTXAS_PATH=/usr/local/cuda/bin/ptxas "
        "in serving.env; or use a runtime.image whose Triton knows sm_121",
        phase="kv cache", reason="version", fix="setting"),
    sig("flashinfer-no-arch",
        [(r"No supported CUDA architectures found for major versions", "vllm-project/vllm#31740",
          "flashinfer-ai/flashinfer#2577")],
        "FlashInfer's JIT found no GPU architecture to build a kernel for: the kernel vLLM chose "
        "exists for other GPUs only (an SM100 FP4 MoE kernel asks for major 10; GB10 is 12), "
        "or the nvcc FlashInfer found is older than CUDA 12.9 and so dropped SM 12.x",
        "choose kernels that run on GB10 in serving.env or serving.extra_args (e.g. "
        "VLLM_USE_FLASHINFER_MOE_FP4=0, another --moe-backend or attention backend), or use a "
        "runtime.image whose FlashInfer ships sm_121 kernels and whose CUDA_HOME is CUDA 12.9 "
        "or newer",
        phase="kv cache", reason="version", fix="setting"),
    sig("quant-kernel-unsupported",
        # vLLM's "No compiled <op> ... capability" of its CUTLASS scaled-mm family
        [(r"No compiled \w*cutlass\w*.{0,100}?capability", "vllm-project/vllm#26844",
          "zai-org/GLM-4.5#47", "vllm-project/vllm#9419")],
        "the image's vLLM has no quantised (FP8, INT8 or NVFP4) GEMM or MoE kernel compiled for "
        "this GPU's compute capability (GB10's is 121; a build for SM90/SM100 only, or an older "
        "vLLM)",
        "use a runtime.image whose vLLM was built for sm_121 with its FP8/NVFP4 kernels (a "
        "recent NVIDIA vLLM container or a Spark community build), or serve a BF16 or otherwise "
        "quantised checkpoint (model.path)",
        phase="kv cache", reason="version", fix="version"),
    # -- the model's files and the Hub
    sig("hf-transfer-missing",
        [(r"Fast (?:download|upload)(?:ing)? using 'hf_transfer' is enabled",
          "vllm-project/vllm-omni#1264", "zml/zml#339"),
         (r"'hf_transfer' package is not available", "vllm-project/vllm-omni#1264", "zml/zml#339")],
        "HF_HUB_ENABLE_HF_TRANSFER=1 is set (in the image or the environment) but the hf_transfer "
        "package is not installed, so the first download from the Hub fails",
        "set HF_HUB_ENABLE_HF_TRANSFER=0 in serving.env, or download the model beforehand and "
        "serve it from model.path",
        phase="config", reason="configuration", fix="setting"),
    sig("hf-transfer-failed",
        [(r"An error occurred while downloading using .hf_transfer.",
          "awslabs/extending-the-context-length-of-open-source-llms#4",
          "LetheSec/HuggingFace-Download-Accelerator#5")],
        "a download through hf_transfer broke off (the network dropped mid-file); hf_transfer "
        "neither resumes nor says more",
        "download again with HF_HUB_ENABLE_HF_TRANSFER=0 in serving.env, or download the model "
        "onto every node beforehand and serve it from model.path",
        phase="weights", reason="transient", fix="restart"),
    sig("hf-offline-not-cached",
        [(r"LocalEntryNotFoundError", "BerriAI/litellm#3207", "harry0703/MoneyPrinterTurbo#156"),
         (r"Cannot find an appropriate cached snapshot folder", "BerriAI/litellm#3207"),
         (r"OfflineModeIsEnabled|offline mode is enabled", "vllm-project/vllm#3719",
          "huggingface/kernels#553")],
        "the Hub could not be used (HF_HUB_OFFLINE=1, or no network) and what was asked for is "
        "not in the cache the container sees, or the caller asked the Hub anyway: with a repo "
        "id, vLLM looks it up",
        "put the model in the mounted Hugging Face cache on every node (check the HF_HOME mount "
        "of each container), or serve it by its path (model.path) rather than a repo id",
        phase="config", reason="configuration", fix="setting"),
    sig("safetensors-corrupt",
        [(r"Error while deserializing header", "QwenLM/Qwen3-VL#264", "turboderp/exllama#242",
          "lyogavin/airllm#137", "microsoft/OmniParser#34")],
        "a .safetensors file is not whole: a shard was cut short or corrupted on the way, or it "
        "is a git-lfs pointer (a clone made without git-lfs) instead of the weights",
        "download the affected shard again (`hf download ... --force-download`) and compare the "
        "model directory's sizes and checksums on every node (03_distribute_image.ipynb copies "
        "the model)",
        phase="weights", reason="transient", fix="restart"),
    sig("hf-download-size-mismatch",
        [(r"Consistency check failed: file should be of size \d+ but has size \d+",
          "huggingface/huggingface_hub#1959", "h2oai/h2o-llmstudio#860",
          "huggingface/huggingface_hub#1946")],
        "a file downloaded from the Hub has another size than the Hub says: the download was cut "
        "short (usually a passing network fault, sometimes a full disk)",
        "download it again (force_download) and check the free space where the model goes "
        "(`df -h`; 01_preflight.ipynb's model disk row)",
        phase="weights", reason="transient", fix="restart"),
]
