"""What counts as a secret in a record of a run, and the redaction every record goes through.

Records are config.yaml, plan.json, the dry-run print-out and the config sent to W&B. The workers
themselves get the real values: only what is written down or shown is redacted.
"""

from __future__ import annotations

import re
from typing import Any, List

REDACTED = "<redacted>"
# A key or flag name that holds a secret: api_key/api-key, token, secret, password, credentials, and
# environment-style names ending in _KEY (AWS_ACCESS_KEY, HF_KEY; not "keep" or "monkey").
_SECRET_NAME = re.compile(r"(api[-_]?key|(^|[-_])key$|token|secret|passw(or)?d|credential)", re.IGNORECASE)
# A value that is a secret whatever it is called: W&B API keys (40 hex digits), AWS access key ids,
# GitHub, Hugging Face, OpenAI-style and Slack tokens, Google API keys.
_SECRET_VALUE = re.compile(
    r"^([0-9a-f]{40}|(AKIA|ASIA)[0-9A-Z]{16}|gh[pousr]_[A-Za-z0-9]{20,}|hf_[A-Za-z0-9]{20,}"
    r"|sk-[A-Za-z0-9_-]{20,}|xox[abprs]-[A-Za-z0-9-]{10,}|AIza[0-9A-Za-z_-]{35})$")
# In free text (a saved git diff): the same shapes inside a line (not 40 hex digits: diffs name commits),
# and the value of an assignment to a secret-named variable (API_KEY = "...", token: ...).
_SECRET_IN_TEXT = re.compile(
    r"((AKIA|ASIA)[0-9A-Z]{16}|gh[pousr]_[A-Za-z0-9]{20,}|hf_[A-Za-z0-9]{20,}|sk-[A-Za-z0-9_-]{20,}"
    r"|xox[abprs]-[A-Za-z0-9-]{10,}|AIza[0-9A-Za-z_-]{35})")
_SECRET_ASSIGNMENT = re.compile(
    r"(?i)((?:api[-_]?key|[A-Za-z0-9]*[-_]key|token|secret|passw(?:or)?d|credential)[\w-]*[\"']?\s*[:=]\s*[\"']?)([^\s\"',;]+)")


def is_secret_name(name: str) -> bool:
    return bool(_SECRET_NAME.search(name.lstrip("-")))


def redact(value: Any) -> Any:
    """A copy of a record (dicts, lists, tuples, strings) with every secret replaced by <redacted>."""
    if isinstance(value, dict):
        return {k: (REDACTED if is_secret_name(str(k)) and v else redact(v)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        items = redact_argv([v for v in value])
        return items if isinstance(value, list) else tuple(items)
    if isinstance(value, str) and _SECRET_VALUE.match(value):
        return REDACTED
    return value


def redact_text(text: str) -> str:
    """Free text with key-shaped values and the values of secret-named assignments replaced by <redacted>."""
    text = _SECRET_IN_TEXT.sub(REDACTED, text)
    return _SECRET_ASSIGNMENT.sub(lambda m: m.group(1) + REDACTED, text)


def redact_argv(argv: List[Any]) -> List[Any]:
    """Argument lists: `--api-key X`, `--token=X`, `AWS_SECRET_KEY=X` and key-shaped values are redacted."""
    out: List[Any] = []
    hide_next = False
    for item in argv:
        if not isinstance(item, str):
            out.append(redact(item))
            hide_next = False
            continue
        name, eq, _ = item.partition("=")
        if hide_next and not item.startswith("--"):
            out.append(REDACTED)
        elif eq and is_secret_name(name):
            out.append(f"{name}={REDACTED}")
        else:
            out.append(redact(item))
        # a flag named like a secret (`--password X`) hides the word after it
        hide_next = item.startswith("-") and not eq and is_secret_name(item)
    return out
