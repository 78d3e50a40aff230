"""What the smoke test sends, and what the lab's model is trained to answer: one place for both.

:mod:`sparkbook.smoke.api` sends these prompts and this tool. ``sparkbook/lab/make_model.py`` trains the
lab's tiny model on :data:`EXCHANGES` (each prompt rendered by the model's own chat template, then
the answer) so that under greedy decoding it answers them for real: a tool call that vLLM's tool-call
parser must extract, a reasoning block that its reasoning parser must split off. That script runs in
the lab image with this file beside it, so this module uses the standard library only and imports
nothing from sparkbook.
"""

from __future__ import annotations

import json

HELLO = "Say hello in one short sentence."
# A question a thinking model settles in a few lines of reasoning.
REASONING = "What is 17 + 25? Think it through, then give only the number."
# A question that needs the tool: a model with tools and tool_choice "auto" should call it.
TOOL_PROMPT = "What is the weather in Paris right now? Use the get_weather tool, in celsius."

# A tool whose arguments have few valid values. Keys in the order vLLM hands a tool to the chat
# template (its FunctionDefinition: name, description, parameters, strict), so that a template that
# renders a tool whole sees the same text from the smoke test and from make_model.py.
TOOL: dict = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "enum": ["Paris", "Berlin", "Tokyo"]},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
        "strict": True,  # the arguments follow the schema (guided decoding), as OpenAI defines it
    },
}
TOOL_NAME: str = TOOL["function"]["name"]
TOOL_ARGUMENTS = {"city": "Paris", "unit": "celsius"}  # what TOOL_PROMPT asks for

# Qwen3-style templates: with thinking off the prompt already closes the reasoning block, so a
# tool call comes at once (the tool checks); the reasoning check asks for thinking explicitly
# (Qwen3 names the switch enable_thinking; DeepSeek-V3.1 and Granite name it thinking).
NO_THINKING = {"enable_thinking": False}
THINKING = {"enable_thinking": True, "thinking": True}


def hermes_call(name: str, arguments: dict) -> str:
    """A tool call in the Hermes format that vLLM's ``hermes`` tool-call parser extracts, written
    exactly as vLLM's structural tag for that format writes it (tags on their own lines; see
    vllm/tool_parsers/structural_tag_registry.py, ``_hermes_tool_tags``). The arguments carry no
    blanks, so that a JSON grammar with or without free whitespace accepts them as they are."""
    args = json.dumps(arguments, separators=(",", ":"))
    return f'<tool_call>\n{{"name": {json.dumps(name)}, "arguments": {args}}}\n</tool_call>'


def think(reasoning: str, answer: str) -> str:
    """A closed reasoning block, then the answer: what the ``qwen3`` reasoning parser splits."""
    return f"<think>\n{reasoning}\n</think>\n\n{answer}"


# The exchanges the lab's model learns: the messages, tools and chat-template arguments of a smoke
# request, and the assistant's answer (the end-of-turn token follows it).
EXCHANGES: list[dict] = [
    {"check": "chat", "messages": [{"role": "user", "content": HELLO}], "tools": None,
     "template": {}, "answer": think("A greeting is asked for.", "Hello from the sparkbook lab!")},
    {"check": "reasoning", "messages": [{"role": "user", "content": REASONING}], "tools": None,
     "template": THINKING, "answer": think("17 plus 25: 17 + 20 = 37, and 37 + 5 = 42.", "42")},
    {"check": "tool call", "messages": [{"role": "user", "content": TOOL_PROMPT}], "tools": [TOOL],
     "template": NO_THINKING, "answer": hermes_call(TOOL_NAME, TOOL_ARGUMENTS)},
]
