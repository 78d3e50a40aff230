"""Python reprs as programs log them, read back into values: a dict's repr (vLLM's "non-default
args: {...}") and a ``key=value, ...`` list (vLLM's "with config: ..."). Their values mix literals
with reprs no parser reads (``StructuredOutputsConfig(backend='xgrammar', ...)``, ``torch.bfloat16``,
``<CompilationMode.VLLM_COMPILE: 3>``, an unquoted model name): a literal becomes its value, a
``Name(key=value, ...)`` repr a dict of its fields, anything else its text. Tested on vLLM's lines
from DGX Sparks (../shared/field-samples/vllm-ray-head-startup-1.txt) and from the lab."""

from __future__ import annotations

import ast
import re
from typing import Any

_OPEN, _CLOSE = "([{", ")]}"
_CALL = re.compile(r"^[A-Za-z_][\w.]*\((.*)\)$", re.S)
_KEY = re.compile(r"^\s*([A-Za-z_]\w*)=(.*)$", re.S)


def split_top(text: str, sep: str) -> list[str]:
    """``text`` cut at each ``sep`` outside brackets and quotes."""
    parts, depth, quote, start, i = [], 0, "", 0, 0
    while i < len(text):
        c = text[i]
        if quote:
            if c == "\\":
                i += 1
            elif c == quote:
                quote = ""
        elif c in "'\"":
            quote = c
        elif c in _OPEN:
            depth += 1
        elif c in _CLOSE:
            depth = max(depth - 1, 0)
        elif c == sep and depth == 0:
            parts.append(text[start:i])
            start = i + 1
        i += 1
    parts.append(text[start:])
    return [p for p in parts if p.strip()]


def value(text: str) -> Any:
    """A literal's value; a ``Name(key=value, ...)`` repr's fields as a dict; else the text."""
    text = text.strip()
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        pass
    if text.startswith("{") and text.endswith("}"):
        try:
            return mapping(text)
        except ValueError:
            return text
    call = _CALL.match(text)
    if call:
        fields = key_values(call.group(1))
        if fields or not call.group(1).strip():
            return fields
    return text


def mapping(text: str) -> dict[Any, Any]:
    """A dict's repr, ``{'a': 1, 'b': Config(x=2)}``, as a dict (see :func:`value`). Raises
    ValueError when it is no dict."""
    text = text.strip()
    if not (text.startswith("{") and text.endswith("}")):
        raise ValueError(f"not a dict: {text[:60]!r}")
    out = {}
    for item in split_top(text[1:-1], ","):
        key, colon, rest = item.partition(":")
        if not colon:
            raise ValueError(f"not a dict item: {item[:60]!r}")
        out[value(key)] = value(rest)
    return out


def key_values(text: str) -> dict[str, Any]:
    """``a=1, b='x', c=Name(d=2)`` as a dict (see :func:`value`); a part that is no ``key=value``
    belongs to the value before it (an unquoted value with a comma)."""
    last, raw = None, {}
    for part in split_top(text, ","):
        found = _KEY.match(part)
        if found:
            last = found.group(1)
            raw[last] = found.group(2)
        elif last:
            raw[last] += "," + part
    return {key: value(text) for key, text in raw.items()}
