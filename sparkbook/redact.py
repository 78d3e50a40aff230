"""Secrets never reach a notebook, a report or a log: every value of this machine's environment
that looks like a token (by its name), or is named as one by the parameters (``model.hf_token_env``,
registered when parameters validate), is masked wherever sparkbook shows or writes text."""

from __future__ import annotations

import os
import re

MASK = "********"
NAMES = re.compile(r"TOKEN|SECRET|PASSWORD|API_KEY|ACCESS_KEY")
_named: set[str] = set()  # more variable names holding secrets, from the parameters


def protect(name: str) -> None:
    """Mask the value of the environment variable ``name`` too, whatever it is called."""
    _named.add(name)


def secrets() -> list[str]:
    """The secret values in the environment. Short values are left alone (they would mask
    ordinary words)."""
    return sorted({v for k, v in os.environ.items()
                   if v and len(v) >= 8 and (NAMES.search(k) or k in _named)}, key=len, reverse=True)


def mask(text: str) -> str:
    for value in secrets():
        text = text.replace(value, MASK)
    return text
