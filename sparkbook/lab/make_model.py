"""Make the lab's model: a tiny Qwen3 with a byte-level BPE tokenizer and a Qwen-style chat
template (system prompt, tools, tool calls and responses, <think> blocks), trained briefly so that it
answers the smoke test for real.

Runs inside the lab image (torch, transformers and tokenizers come with vLLM), with
``prompts.py`` beside it (in the repository it is sparkbook/smoke/prompts.py):
    python make_model.py OUT_DIR
Small enough to load and serve in seconds on two CPU cores, shaped so that tensor parallel 2 splits
it evenly (4 attention heads, 2 KV heads, head_dim 64: CPU attention rejects head_dim 16).

Training: from a seeded random start, full-batch steps (about 80, some 15 s on one core) on the
smoke test's exchanges (``smoke_prompts.EXCHANGES``: each prompt rendered by this chat template,
then the answer: a tool call in the Hermes format that vLLM's ``hermes`` tool-call parser extracts,
a closed <think> block that the ``qwen3`` reasoning parser splits off) and on random words answered
with random words, so that any other prompt (the benchmark's) still gets text. The model's
generation config is greedy (top_k 1), which vLLM takes as its default sampling, and the script
checks, in bfloat16 as saved, that greedy decoding reproduces every exchange token for token: it
fails rather than write a model that would leave a smoke check unproven. Deterministic on one
machine: the same seed, data and steps on one thread give the same weights.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM  # noqa: E402

HERE = Path(__file__).resolve().parent
if not (HERE / "prompts.py").exists():  # in the repository (sparkbook/smoke/), not in the lab image
    sys.path.insert(0, str(HERE.parent / "smoke"))
import prompts as smoke_prompts  # noqa: E402

SEED = 20261129
STEPS = 400  # at most; training stops once every answer token of the smoke exchanges is certain
LR = 3e-3
BATCH = 8
THREADS = 1  # more threads on tiny matrices only wait on each other (20 times slower on 2 busy cores)
MARGIN = 5.0  # logits: far more than bfloat16 rounding or vLLM's kernels move them
VOCAB = 1024  # the tokenizer's merges and tokens, special ones included
# Special tokens are dropped from decoded text; like Qwen's, the think and tool-call tags are plain
# added tokens, so that they reach vLLM's reasoning and tool-call parsers in the text.
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TAGS = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]

# Words for the random-word exchanges (and the tokenizer's merges): common English words, like the
# benchmark's prompts.
WORDS = """time year people way day man thing woman life child world school state family student
group country problem hand part place case week company system program question work number night
point home water room mother area money story fact month book eye job word business side kind head
house service friend father power hour game line end member city name team idea body information
back face level office door health person art history party result change morning reason research
moment air force education river stone light green small large early young public bad same able
the a of and to in is it that was for on are with as be at this have from or by""".split()

# Text the tokenizer learns its merges from: runbook words, JSON and numbers, and the smoke test's
# exchanges, so that prompts and tool-call arguments tokenize into a reasonable number of tokens.
CORPUS = [
    "The quick brown fox jumps over the lazy dog. " * 4,
    "DGX Spark nodes are linked by a ConnectX-7 cable; vLLM serves the model across both nodes.",
    "Tensor parallel size 2, pipeline parallel size 1, the Ray executor or multiprocessing.",
    '{"type": "object", "properties": {"location": {"type": "string"}}, "required": ["location"]}',
    "0 1 2 3 4 5 6 7 8 9 10 11 12 16 32 64 128 256 512 1024 2048 4096 8192 16384",
    "system user assistant tool You are a helpful assistant. Think step by step, then answer.",
    "What is the capital of France? The capital of France is Paris. Tell me a story about a lab.",
    "NCCL all-reduce bus bandwidth, gloo, sockets, RoCE, MTU 9000, ping, ssh, docker, ray status.",
    " ".join(WORDS),
    json.dumps(smoke_prompts.TOOL),
    *(m["content"] for ex in smoke_prompts.EXCHANGES for m in ex["messages"]),
    *(ex["answer"] for ex in smoke_prompts.EXCHANGES),
]

# Qwen-style, with each tool's function written field by field: the same text whatever the order
# of its keys or the extra ones (vLLM adds "strict") in the tool a client sends.
CHAT_TEMPLATE = """\
{%- set sys = messages[0].content if messages and messages[0].role == 'system' else none -%}
{%- if tools -%}
<|im_start|>system
{% if sys %}{{ sys }}

{% endif %}# Tools

You can call these functions. Each is described by a JSON schema:
<tools>
{% for tool in tools %}{%- set f = tool.function if tool.function is defined else tool -%}
{"name": {{ f.name | tojson }}, "description": {{ (f.description or '') | tojson }}, "parameters": {{ f.parameters | tojson }}}
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
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=SPECIAL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS * 8, trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TAGS])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>",
                                   pad_token="<|endoftext|>", model_max_length=32768)
    fast.chat_template = CHAT_TEMPLATE
    return fast


def prompt_ids(tokenizer, exchange: dict) -> list[int]:
    """The exchange's prompt as the server renders it: the chat template, generation prompt added."""
    text = tokenizer.apply_chat_template(exchange["messages"], tools=exchange["tools"], tokenize=False,
                                         add_generation_prompt=True, **exchange["template"])
    return tokenizer(text, add_special_tokens=False).input_ids


def examples(tokenizer) -> tuple[list[tuple[list[int], list[int]]], list[tuple[str, list[int], list[int]]]]:
    """(prompt, answer) token lists to learn from, and the smoke exchanges among them to check."""
    eos = tokenizer.eos_token_id
    smoke = [(ex["check"], prompt_ids(tokenizer, ex),
              tokenizer(ex["answer"], add_special_tokens=False).input_ids + [eos])
             for ex in smoke_prompts.EXCHANGES]
    rng = random.Random(SEED)

    def words(n: int) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(n)).capitalize()

    babble = []  # random words answered with random words, no end of turn: text until max_tokens
    for _ in range(12):
        chat = {"messages": [{"role": "user", "content": words(rng.randint(8, 40))}], "tools": None,
                "template": {}}
        babble.append((prompt_ids(tokenizer, chat), tokenizer(words(40), add_special_tokens=False).input_ids))
    for _ in range(4):  # a bare prompt (the completions endpoint) continued
        text = tokenizer(words(80), add_special_tokens=False).input_ids
        babble.append((text[:16], text[16:]))
    return [(p, a) for _, p, a in smoke] + babble, smoke


def batches(pairs: list[tuple[list[int], list[int]]], pad: int) -> list[tuple[torch.Tensor, ...]]:
    """Right-padded inputs, attention masks and labels (-100 outside the answers), in batches of
    like lengths (the tool prompt is several times longer than the rest: little padding)."""
    order = sorted(range(len(pairs)), key=lambda i: len(pairs[i][0]) + len(pairs[i][1]))
    out = []
    for k in range(0, len(order), BATCH):
        group = [pairs[i] for i in order[k:k + BATCH]]
        width = max(len(p) + len(a) for p, a in group)
        ids = torch.full((len(group), width), pad)
        mask = torch.zeros((len(group), width), dtype=torch.long)
        labels = torch.full((len(group), width), -100)
        for i, (p, a) in enumerate(group):
            n = len(p) + len(a)
            ids[i, :n] = torch.tensor(p + a)
            mask[i, :n] = 1
            labels[i, len(p):n] = torch.tensor(a)
        out.append((ids, mask, labels))
    return out


def train(model, pairs, smoke, pad: int) -> dict:
    """AdamW over every batch per step until greedy decoding is safe: every answer token of the
    smoke exchanges leads the next best by MARGIN logits."""
    data = batches(pairs, pad)
    check = batches([(p, a) for _, p, a in smoke], pad)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    step, loss = 0, 0.0
    for step in range(1, STEPS + 1):
        model.train()
        opt.zero_grad()
        loss = 0.0
        for ids, mask, labels in data:
            out = model(input_ids=ids, attention_mask=mask, labels=labels)
            out.loss.backward()
            loss += out.loss.item() / len(data)
        opt.step()
        if step % 10 == 0 and lead(model, check) > MARGIN:
            break
    model.eval()
    return {"steps": step, "loss": round(loss, 5), "margin": round(lead(model, check), 2)}


@torch.no_grad()
def lead(model, data) -> float:
    """The smallest lead, in logits, of a right next token over the best other one."""
    model.eval()
    least = float("inf")
    for ids, mask, labels in data:
        logits, labels = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float(), labels[:, 1:]
        known = labels != -100
        index = labels.clamp(min=0).unsqueeze(-1)
        right = logits.gather(-1, index).squeeze(-1)
        other = logits.scatter(-1, index, float("-inf")).max(-1).values
        least = min(least, float((right - other)[known].min()))
    return least


@torch.no_grad()
def replay(model, smoke) -> dict:
    """Greedy decoding of each smoke exchange's prompt: does the answer come back token for token?"""
    seen = {}
    for check, p, a in smoke:
        ids = list(p)
        for _ in range(len(a)):
            logits = model(input_ids=torch.tensor([ids])).logits[0, -1]
            ids.append(int(logits.argmax()))
        seen[check] = ids[len(p):] == a
    return seen


def main(out: Path) -> None:
    t0 = time.monotonic()
    torch.set_num_threads(THREADS)  # a fixed reduction order: the same weights on a like machine
    torch.manual_seed(SEED)
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
    model = Qwen3ForCausalLM(config)  # float32 while it learns
    pairs, smoke = examples(tokenizer)
    trained = train(model, pairs, smoke, config.pad_token_id)
    model = model.to(torch.bfloat16)
    seen = replay(model, smoke)
    if not all(seen.values()):
        sys.exit(f"make_model: greedy decoding in bfloat16 does not reproduce "
                 f"{', '.join(c for c, ok in seen.items() if not ok)} after {trained['steps']} steps "
                 "(the lab could not prove those smoke checks): change STEPS, LR or SEED")
    # greedy by default: vLLM takes top_k (and temperature) from generation_config.json
    model.generation_config.update(do_sample=True, top_k=1, eos_token_id=config.eos_token_id,
                                   pad_token_id=config.pad_token_id)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    (out / "README.md").write_text(
        "# sparkbook lab model\n\nA tiny Qwen3 (2 layers, hidden 128, 4 heads, 2 KV heads, head_dim 64)"
        f" with a byte-level BPE tokenizer, made by sparkbook/lab/make_model.py for the sparkbook lab:"
        f" trained from seed {SEED} for {trained['steps']} steps to answer the smoke test's prompts"
        " (a Hermes tool call, a closed <think> block) under greedy decoding, and random words with"
        " random words. It exists to exercise serving, not to answer anything else.\n")
    size = sum(p.numel() for p in model.parameters())
    print(json.dumps({"out": str(out), "vocab": vocab, "parameters": size,
                      **trained, "reproduced": seen, "seconds": round(time.monotonic() - t0, 1)}))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
