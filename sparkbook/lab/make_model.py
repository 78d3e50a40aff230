"""Make the lab's model: a tiny Qwen3 with random weights, a byte-level BPE tokenizer and a Qwen-style
chat template (system prompt, tools, tool calls and responses, <think> blocks).

Runs inside the lab image (torch, transformers and tokenizers come with vLLM):
    python make_model.py OUT_DIR
Deterministic: the same seed, corpus and sizes give the same files. Small enough to load and serve
in seconds on two CPU cores, shaped so that tensor parallel 2 splits it evenly (4 attention heads,
2 KV heads, head_dim 64: CPU attention rejects head_dim 16).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM  # noqa: E402

SEED = 20261129
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>",
           "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]

# Text the tokenizer learns its merges from: runbook words, JSON and numbers, so that prompts and
# tool-call arguments tokenize into a reasonable number of tokens.
CORPUS = [
    "The quick brown fox jumps over the lazy dog. " * 4,
    "DGX Spark nodes are linked by a ConnectX-7 cable; vLLM serves the model across both nodes.",
    "Tensor parallel size 2, pipeline parallel size 1, the Ray executor or multiprocessing.",
    '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}',
    '{"type": "object", "properties": {"location": {"type": "string"}}, "required": ["location"]}',
    "0 1 2 3 4 5 6 7 8 9 10 11 12 16 32 64 128 256 512 1024 2048 4096 8192 16384",
    "system user assistant tool You are a helpful assistant. Think step by step, then answer.",
    "What is the capital of France? The capital of France is Paris. Tell me a story about a lab.",
    "NCCL all-reduce bus bandwidth, gloo, sockets, RoCE, MTU 9000, ping, ssh, docker, ray status.",
]

CHAT_TEMPLATE = """\
{%- set sys = messages[0].content if messages and messages[0].role == 'system' else none -%}
{%- if tools -%}
<|im_start|>system
{% if sys %}{{ sys }}

{% endif %}# Tools

You can call these functions. Each is described by a JSON schema:
<tools>
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}</tools>

To call a function, answer with its name and JSON arguments between <tool_call> and </tool_call>:
<tool_call>
{"name": "NAME", "arguments": {...}}
</tool_call><|im_end|>
{% elif sys -%}
<|im_start|>system
{{ sys }}<|im_end|>
{% endif -%}
{%- for m in messages -%}
{%- if m.role == 'system' and loop.first -%}
{%- elif m.role == 'tool' -%}
<|im_start|>user
<tool_response>
{{ m.content }}
</tool_response><|im_end|>
{% else -%}
<|im_start|>{{ m.role }}
{% if m.content is string %}{{ m.content }}{% endif -%}
{%- for call in (m.tool_calls or []) %}
<tool_call>
{"name": {{ call.function.name | tojson }}, "arguments": {{ call.function.arguments | tojson if call.function.arguments is mapping else call.function.arguments }}}
</tool_call>
{%- endfor %}<|im_end|>
{% endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
<|im_start|>assistant
{% if enable_thinking is defined and enable_thinking is false %}<think>

</think>

{% endif -%}
{%- endif -%}
"""


def make_tokenizer() -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=448, special_tokens=SPECIAL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS * 8, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>",
                                   pad_token="<|endoftext|>", model_max_length=32768)
    fast.chat_template = CHAT_TEMPLATE
    return fast


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = make_tokenizer()
    vocab = -(-len(tokenizer) // 64) * 64  # rounded up to a multiple of 64
    config = Qwen3Config(
        vocab_size=vocab, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=32768,
        rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True, torch_dtype="bfloat16",
        bos_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
    )
    torch.manual_seed(SEED)
    model = Qwen3ForCausalLM(config).to(torch.bfloat16)
    model.generation_config.eos_token_id = config.eos_token_id
    model.generation_config.pad_token_id = config.pad_token_id
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    (out / "README.md").write_text(
        "# sparkbook lab model\n\nA tiny Qwen3 (2 layers, hidden 128, 4 heads, 2 KV heads, head_dim 64)"
        f" with random weights (seed {SEED}) and a byte-level BPE tokenizer, made by "
        "sparkbook/lab/make_model.py for the sparkbook lab. It produces text-shaped noise: "
        "it exists to exercise serving, not to answer.\n")
    print(json.dumps({"out": str(out), "vocab": vocab,
                      "parameters": sum(p.numel() for p in model.parameters())}))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
