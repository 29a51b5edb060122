"""torch's c10d rendezvous with its state signed: nothing read from the store is unpickled unless it
carries this job's HMAC (launcher.agent.signing).

torch's C10dRendezvousBackend keeps the rendezvous state in the store as base64(pickle) and every
node agent ``pickle.loads`` what it reads there (dynamic_rendezvous._BackendRendezvousStateHolder.sync):
anyone who can reach the rendezvous port could run code in every agent. SignedBackend wraps torch's
backend: it signs every state it writes and verifies every state it reads, before torch unpickles it.

The secret never enters LaunchConfig.rdzv_configs (torch logs them): the configs carry a handle to
it, a random name this process alone can look up.
"""

from __future__ import annotations

import secrets
from typing import Any, Dict, Optional, Tuple

from torch.distributed.elastic.rendezvous import RendezvousParameters, rendezvous_handler_registry
from torch.distributed.elastic.rendezvous.api import RendezvousStateError
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import RendezvousBackend, Token, create_handler

from launcher.agent import signing
from launcher.runtime import env

BACKEND_NAME = "launcher-signed-c10d"
KEY_HANDLE = "launcher_key_handle"  # the rdzv_configs entry naming the key in _KEYS
_KEYS: Dict[str, bytes] = {}


class UnsignedStateError(RendezvousStateError):
    """The store holds a rendezvous state this job did not sign. A torch RendezvousError, so that
    torch's shutdown and keep-alive paths log it instead of raising past the agent."""


class SignedBackend(RendezvousBackend):
    """A RendezvousBackend whose states are signed on the way in and verified on the way out."""

    def __init__(self, inner: RendezvousBackend, key: bytes, where: str, run_id: str) -> None:
        self._inner, self._key, self._where = inner, key, where
        self._context = f"torch.rendezvous.{run_id}"

    @property
    def name(self) -> str:
        return BACKEND_NAME  # torch's registry checks the handler's backend name against the one asked for

    def get_state(self) -> Optional[Tuple[bytes, Token]]:
        found = self._inner.get_state()
        if found is None:
            return None
        blob, token = found
        return self._open(blob), token

    def set_state(self, state: bytes, token: Optional[Token] = None) -> Optional[Tuple[bytes, Token, bool]]:
        found = self._inner.set_state(signing.sign(self._key, self._context, state), token)
        if found is None:
            return None
        blob, new_token, written = found
        return self._open(blob), new_token, written

    def _open(self, blob: bytes) -> bytes:
        try:
            return signing.verify(self._key, self._context, blob)
        except signing.SignatureError as e:
            raise UnsignedStateError(unsigned_state_message(self._where, str(e))) from None


def unsigned_state_message(where: str, reason: str) -> str:
    return (f"rendezvous state at {where} is not signed with this job's secret: {reason} (another job on the "
            "same port, a node given another secret, or tampering); nothing of it was loaded: give every node "
            f"the same secret (--rdzv-secret-file or {env.RDZV_SECRET}), or pick another port")


def _create_signed_handler(params: RendezvousParameters) -> Any:
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import create_backend

    key = _KEYS[str(params.get(KEY_HANDLE))]
    backend, store = create_backend(params)
    return create_handler(store, SignedBackend(backend, key, params.endpoint, params.run_id), params)


def signed_c10d(key: bytes) -> Tuple[str, Dict[str, str]]:
    """(backend name, rdzv_configs entries) for torch's elastic_launch: its c10d rendezvous, signed with key."""
    handle = secrets.token_hex(8)
    _KEYS[handle] = key
    rendezvous_handler_registry.register(BACKEND_NAME, _create_signed_handler)
    return BACKEND_NAME, {KEY_HANDLE: handle}
