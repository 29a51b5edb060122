"""What counts as a secret in a record of a run, and the redaction every record goes through.

Records are config.yaml, plan.json, env/*.json, the dry-run print-out and the config and command line sent to W&B.
The workers themselves get the real values: only what is written down or shown is redacted. A secret is known by
its name (a key or flag named like one), by its shape (a token with a known prefix, wherever it stands in a value)
or, after `=`, by looking random (looks_random: the mix of cases and digits of a generated key, which names, paths,
numbers and run ids do not have).
"""

from __future__ import annotations

import re
from typing import Any, List

REDACTED = "<redacted>"
# A key or flag name that holds a secret: api_key/api-key, token, secret, password, credentials, auth
# (`--auth`, `http_auth`; not "author"), and environment-style names ending in _KEY (AWS_ACCESS_KEY,
# HF_KEY; not "keep" or "monkey").
_SECRET_NAME = re.compile(r"(api[-_]?key|(^|[-_])(key|auth)$|token|secret|passw(or)?d|credential)", re.IGNORECASE)
# A value that is a secret whatever it is called: W&B API keys (40 hex digits), AWS access key ids,
# GitHub, Hugging Face, OpenAI-style and Slack tokens, Google API keys.
_SECRET_VALUE = re.compile(
    r"^([0-9a-f]{40}|(AKIA|ASIA)[0-9A-Z]{16}|gh[pousr]_[A-Za-z0-9]{20,}|hf_[A-Za-z0-9]{20,}"
    r"|sk-[A-Za-z0-9_-]{20,}|xox[abprs]-[A-Za-z0-9-]{10,}|AIza[0-9A-Za-z_-]{35})$")
# Inside any value or free text (a list override, a saved git diff): the same shapes as a word of their own, not
# glued to letters before them (`task-...` holds no `sk-` key); not 40 hex digits, which name commits in diffs.
_SECRET_IN_TEXT = re.compile(
    r"(?<![A-Za-z0-9])((AKIA|ASIA)[0-9A-Z]{16}|gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{22,}"
    r"|hf_[A-Za-z0-9]{20,}|sk-[A-Za-z0-9_-]{20,}|xox[abprs]-[A-Za-z0-9-]{10,}|AIza[0-9A-Za-z_-]{35})")
# A word of a value after `=` that may be a generated key (base64, base62: 20 characters or more), for looks_random.
_WORD = re.compile(r"(?<![A-Za-z0-9+/_.=-])[A-Za-z0-9+/_-]{20,}={0,2}(?![A-Za-z0-9+/_.=-])")
# A lower-case letter between two capitals or digits, or a digit between two letters: what a random mix of cases
# and digits is full of (about one in seven characters) and words, names and versions rarely hold.
_ODD = re.compile(r"(?<=[A-Z0-9])[a-z](?=[A-Z0-9])|(?<=[A-Za-z])[0-9](?=[A-Za-z])")
_SECRET_ASSIGNMENT = re.compile(
    r"(?i)((?:api[-_]?key|[A-Za-z0-9]*[-_]key|token|secret|passw(?:or)?d|credential)[\w-]*[\"']?\s*[:=]\s*[\"']?)([^\s\"',;]+)")
# Credentials in a URL, anywhere in a string: scheme://user:PASSWORD@host, or scheme://USERINFO@host.
_URL_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^\s/?#@\"']+)@")
# A lone userinfo that reads as a login name (git@, ubuntu@, anonymous@, user42@) stays: a user name is
# no secret. Anything else there (mixed case, longer than a login name, more than 4 digits, a key shape)
# is taken for a token (https://TOKEN@github.com).
_LOGIN_NAME = re.compile(r"^(?!(.*[0-9]){5})[a-z_][a-z0-9._-]{0,31}$")
# Short flags whose next word (or attached rest: mysql -pPASSWORD) is a secret for common tools:
# -k (an API key), -p and -P (a password). They also mean a path or a port for others: a value that
# looks like a path (/, ./, ../, ~) or a plain number is kept.
_SECRET_SHORT_FLAGS = ("-k", "-p", "-P")
_PATH_OR_NUMBER = re.compile(r"^([/~]|\.\.?/|\.\.?$|[0-9]+(\.[0-9]+)?$)")


def is_secret_name(name: str) -> bool:
    return bool(_SECRET_NAME.search(name.lstrip("-")))


def looks_random(word: str) -> bool:
    """Whether a word reads as a generated key: 20 characters or more of letters of both cases and digits, with a
    lower-case letter between capitals or digits, or a digit between letters, at least every 12 characters (at
    least 3). Model names (Llama-3.1-8B-Instruct), paths, run ids, numbers and hex digests do not."""
    if len(word) < 20 or word.startswith("/") or not _WORD.fullmatch(word):
        return False
    if not (re.search("[a-z]", word) and re.search("[A-Z]", word) and re.search("[0-9]", word)):
        return False
    return len(_ODD.findall(word)) >= max(3, len(word) / 12)


def redact(value: Any) -> Any:
    """A copy of a record (dicts, lists, tuples, strings) with every secret replaced by <redacted>."""
    if isinstance(value, dict):
        return {k: (REDACTED if is_secret_name(str(k)) and v else redact(v)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        items = redact_argv([v for v in value])
        return items if isinstance(value, list) else tuple(items)
    if isinstance(value, str):
        return REDACTED if _SECRET_VALUE.match(value) or looks_random(value) else redact_urls(_redact_words(value))
    return value


def _redact_words(text: str) -> str:
    """Key-shaped words anywhere in text (`wandb.tags=[ok,ghp_...]`), and random-looking ones after its first `=`."""
    text = _SECRET_IN_TEXT.sub(REDACTED, text)
    name, eq, rest = text.partition("=")
    if not eq or len(rest) < 20:
        return text
    return name + eq + _WORD.sub(lambda m: REDACTED if looks_random(m.group()) or _SECRET_VALUE.match(m.group())
                                 else m.group(), rest)


def redact_urls(text: str) -> str:
    """text with the credentials of every URL in it redacted: postgres://u:PASS@h -> postgres://u:<redacted>@h,
    https://TOKEN@host -> https://<redacted>@host (a lone login name, as in ssh://git@host, stays)."""
    def hide(m: "re.Match[str]") -> str:
        user, colon, password = m.group("userinfo").partition(":")
        if colon:
            return f"{m.group('scheme')}{user}:{REDACTED if password else ''}@"
        is_login = _LOGIN_NAME.match(user) and not _SECRET_IN_TEXT.search(user)
        return m.group(0) if is_login else f"{m.group('scheme')}{REDACTED}@"

    return _URL_USERINFO.sub(hide, text) if "://" in text else text


def redact_text(text: str) -> str:
    """Free text with key-shaped values, URL credentials and the values of secret-named assignments redacted."""
    text = redact_urls(_SECRET_IN_TEXT.sub(REDACTED, text))
    return _SECRET_ASSIGNMENT.sub(lambda m: m.group(1) + REDACTED, text)


def redact_argv(argv: List[Any]) -> List[Any]:
    """Argument lists: `--api-key X`, `--token=X`, `--auth X`, `-p X`, `-pX`, `AWS_SECRET_KEY=X`, URL
    credentials and key-shaped values are redacted."""
    out: List[Any] = []
    hide_next = False
    for item in argv:
        if not isinstance(item, str):
            out.append(redact(item))
            hide_next = False
            continue
        name, eq, value = item.partition("=")
        if hide_next and not item.startswith("--"):
            out.append(REDACTED)
        elif eq and (is_secret_name(name) or (name in _SECRET_SHORT_FLAGS and not _PATH_OR_NUMBER.match(value))):
            out.append(f"{name}={REDACTED}")
        else:
            out.append(_redact_attached(item))
        # a flag named like a secret (`--password X`, `-p X`) hides the word after it
        hide_next = item.startswith("-") and not eq and (is_secret_name(item) or item in _SECRET_SHORT_FLAGS)
        if hide_next and item in _SECRET_SHORT_FLAGS:
            hide_next = _hides_next_word(argv, len(out) - 1)
    return out


def _hides_next_word(argv: List[Any], index: int) -> bool:
    """Whether the word after a short flag (-k, -p, -P) at argv[index] is a secret: not a path or a number."""
    following = argv[index + 1] if index + 1 < len(argv) else None
    return isinstance(following, str) and not following.startswith("-") and not _PATH_OR_NUMBER.match(following)


def _redact_attached(item: str) -> Any:
    """`-pSECRET` (mysql's form) -> `-p<redacted>`; `-p5432`, `-p/data` and everything else as redact() has it."""
    flag, rest = item[:2], item[2:]
    if flag in _SECRET_SHORT_FLAGS and rest and rest[0] != "=" and not _PATH_OR_NUMBER.match(rest):
        return flag + REDACTED
    return redact(item)
