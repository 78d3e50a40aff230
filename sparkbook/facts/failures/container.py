"""The failures of the container and the platform under it: the image (its entrypoint, its
commands, its architecture), the GPU and driver it reaches, the model files and the hub they come
from, the ports it takes.

Standard library only.
"""

from __future__ import annotations

from .kinds import ALL_STEPS, sig

SIGNATURES = [
    sig("entrypoint-swallowed-command",
        # the first such message of a line only (a later one's words are the first's too), then a
        # word the arguments hold: a program, a script or an option of what was meant to run
        [r"^(?=(?P<head>.*?(?P<at>(?:vllm(?: serve)?|\S\.py): error: unrecognized arguments:)))(?P=head)"
         r".*?[\s'\"](?:(?:serve|ray|start|torchrun|bash|sh|python3?|-c|--head|--block|[^\s'\"]+\.py|"
         r"[^\s'\"]+\.sh)(?=[\s'\"=]|$)|/bin/\S|--rdzv|--nproc[-_]per[-_]node|--address|--num-gpus|"
         r"--node-ip-address)"],
        "a command was swallowed by the image's ENTRYPOINT: what was meant to run (`ray start`, "
        "`torchrun`, a script, or `vllm serve` itself) was appended to the image's own command "
        "(`vllm/vllm-openai` images declare ENTRYPOINT [\"vllm\", \"serve\"]) and vLLM's argument "
        "parser refused it",
        "run the container with an explicit entrypoint for what it runs (`docker run --entrypoint "
        "...`; in sparkbook `runtime.entrypoint`), or drop the repeated `vllm serve` from the "
        "command when the image already starts it", phase="container", steps=ALL_STEPS),
    sig("command-not-in-image",
        [r"exec: \\?\"?[^\s\"\\:]+\\?\"?: executable file not found in \$PATH",
         r"exec: \\?\"?[^\s\"\\:]+\\?\"?: stat [^:]+: no such file or directory"],
        "the container's command is not in the image (the image lacks the program, or its "
        "ENTRYPOINT is unset so the first argument was taken as the program)",
        "choose an image that holds vLLM, Ray and torchrun (the image check of 04_ray_cluster.ipynb "
        "and 05_serve.ipynb names what is missing), or set the entrypoint (`runtime.entrypoint`)",
        phase="container", steps=ALL_STEPS),
    sig("no-gpu-in-container",
        [r"Failed to infer device type", r"No platform detected, vLLM is running on UnspecifiedPlatform",
         r"No CUDA GPUs are available", r"Found no NVIDIA driver on your system",
         r"could not select device driver .{0,200}? with capabilities: \[\[gpu\]\]",
         r"CUDA driver initialization failed"],
        "the container sees no GPU (started without the GPU flags, or the NVIDIA container runtime "
        "is missing on the node)",
        "start it with `--gpus all` (runtime.gpus) and check the NVIDIA Container Toolkit on the "
        "node (`docker run --rm --gpus all <image> nvidia-smi`; 01_preflight.ipynb's runtime check)",
        phase="container", steps=ALL_STEPS),
    sig("gpu-arch-unsupported",
        [r"no kernel image is available for execution on the device",
         r"with CUDA capability sm_\d\w* is not compatible with the current PyTorch installation",
         r"cudaErrorNoKernelImageForDevice"],
        "the image's PyTorch or kernels were not built for this GPU (GB10 is sm_121: it needs a "
        "CUDA 12.9+/13 build with Blackwell kernels)",
        "use an image built for the GPU (for DGX Spark one built for sm_121, e.g. NVIDIA's vLLM "
        "container or a community Spark image)", phase="container", steps=ALL_STEPS,
        reason="version", fix="version"),
    sig("port-in-use",
        [r"Address already in use|EADDRINUSE|address already in use",
         r"Failed to bind to (?:port|address)"],
        "a port is already in use",
        "stop what holds the port (`ss -ltnp`; 08_teardown.ipynb removes sparkbook's own) or change `ports`",
        phase="container", steps=ALL_STEPS,
        reason="resource", fix="setting"),
    sig("hf-gated-model",
        [r"GatedRepoError", r"Cannot access gated repo", r"You are trying to access a gated repo",
         r"Access to model \S+ is restricted",
         # the HTTP error before GatedRepoError (a 401 is not this: a wrong repo id or token gets it)
         r"403 Client Error: Forbidden for url: https://huggingface\.co/"],
        "the model is gated on the Hugging Face Hub and the container had no token with access to it",
        "accept the model's terms on its Hub page and give the containers a token with access "
        "(HF_TOKEN; 01_preflight.ipynb checks it), or serve a local copy (model.path)", phase="config"),
    sig("model-not-found",
        [r"Invalid repository ID or local directory specified",
         r"is not a local folder and is not a valid model identifier",
         r"Incorrect path_or_model_id",
         r"is not the path to a directory containing a file named config\.json",
         r"does not appear to have a file named config\.json",
         r"HFValidationError: Repo id must be in the form",
         r"Repository Not Found|RepositoryNotFoundError",
         r"Can't load the configuration of",
         r"No such file or directory: '(?=[^']*')"  # a quote closes it: each run below is read once
         r"(?:[^']*(?:config\.json|\.safetensors)|[^']*tokenizer[^']*)'"],
        "the model path was not found",
        "put the model at model.path on every node (03_distribute_image.ipynb checks and copies it); the "
        "path is the one inside the container (check the mount)", phase="config"),
    sig("unsupported-architecture",
        [r"Model architectures? \[?[^\]]{0,500}\]? (?:are|is) not supported",
         r"Model architectures? \[[^\]]{0,500}\] failed to be inspected",
         r"Transformers does not recognize this architecture",
         r"GGUF model with architecture \S+ is not supported"],
        "this vLLM (or the transformers inside the image) does not know the model's architecture",
        "use an image whose vLLM supports the model (its model card names the minimum vLLM and "
        "transformers; 05_serve.ipynb's image check lists the image's architectures), or check "
        "`architectures` in the model's config.json", phase="config",
        reason="version", fix="version"),
]
