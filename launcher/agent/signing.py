"""Signed values for the stores a job's nodes share: HMAC-SHA256 with the job's rendezvous secret.

A signed value is ``PREFIX || hex(mac) || payload``, the MAC taken over the value's context (the
store key it is written under, say) and the payload, so a value cannot be replayed under another
key. Pure functions: nothing here reads a store or unpickles; callers verify before they decode.
"""

from __future__ import annotations

import hashlib
import hmac

PREFIX = b"launcher-hmac-sha256:"
MAC_HEX_LEN = 64  # hex digits of a SHA-256 MAC


class SignatureError(ValueError):
    """A value that is unsigned, truncated, or signed with another key; the message says which."""


def foreign_value_message(where: str, what: str) -> str:
    """A one-machine job's store (on loopback, its secret its own) holds a value this job did not write."""
    return (f"the job's store at {where} holds a value not signed by this job (another user or process wrote to "
            f"this job's store): {what}; the job was stopped and nothing of it was loaded (docs/security.md)")


def is_signed(blob: bytes) -> bool:
    """Whether blob has the shape of a signed value (a value without a key can still be told apart)."""
    return bytes(blob).startswith(PREFIX)


def _mac(key: bytes, context: str, payload: bytes) -> bytes:
    return hmac.new(key, context.encode() + b"\0" + payload, hashlib.sha256).hexdigest().encode()


def sign(key: bytes, context: str, payload: bytes) -> bytes:
    """payload, signed with key for context."""
    if not key:
        raise ValueError("an empty key signs nothing")
    return PREFIX + _mac(key, context, payload) + payload


def verify(key: bytes, context: str, blob: bytes) -> bytes:
    """The payload of a value sign(key, context, payload) made, or SignatureError; never decodes it."""
    blob = bytes(blob)
    if not is_signed(blob):
        raise SignatureError("the value is not signed")
    mac, payload = blob[len(PREFIX):len(PREFIX) + MAC_HEX_LEN], blob[len(PREFIX) + MAC_HEX_LEN:]
    if len(mac) < MAC_HEX_LEN:
        raise SignatureError("the value is truncated")
    if not hmac.compare_digest(mac, _mac(key, context, payload)):
        raise SignatureError("its signature does not match (another secret, or altered)")
    return payload
