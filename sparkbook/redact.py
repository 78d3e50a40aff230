"""Secrets never reach a notebook, a report or a log: every value of this machine's environment
that looks like a token (by its name) is masked wherever sparkbook shows or writes text."""

from __future__ import annotations

import os
import re

MASK = "********"
NAMES = re.compile(r"TOKEN|SECRET|PASSWORD|API_KEY|ACCESS_KEY")


def secrets(extra_names: tuple[str, ...] = ()) -> list[str]:
    """The secret values in the environment: variables named like a token, and ``extra_names``
    (e.g. the parameters' ``model.hf_token_env``). Short values are left alone (they would mask
    ordinary words)."""
    return sorted({v for k, v in os.environ.items()
                   if v and len(v) >= 8 and (NAMES.search(k) or k in extra_names)}, key=len, reverse=True)


def mask(text: str, extra_names: tuple[str, ...] = ()) -> str:
    for value in secrets(extra_names):
        text = text.replace(value, MASK)
    return text
