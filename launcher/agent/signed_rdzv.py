"""torch's c10d rendezvous with its state signed: nothing read from the store is unpickled unless it
carries this job's HMAC (launcher.agent.signing).

torch's C10dRendezvousBackend keeps the rendezvous state in the store as base64(pickle) and every
node agent ``pickle.loads`` what it reads there (dynamic_rendezvous._BackendRendezvousStateHolder.sync):
anyone who can reach the rendezvous port could run code in every agent. SignedBackend wraps torch's
backend: it signs every state it writes and verifies every state it reads, before torch unpickles it.

Anything else found under the state's key is refused the same way: a value torch cannot decode, the
empty-state sentinel or a missing key after this node has seen a signed state (torch would take those
for a rendezvous not yet begun, and wait out its timeout). A store is never given the secret itself:
what goes in is the state and its MAC.

The secret never enters the rendezvous parameters (torch logs them): launcher.agent.rendezvous hands it to the
backend directly.
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

from torch.distributed.elastic.rendezvous.api import RendezvousStateError
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import RendezvousBackend, Token

from launcher.agent import signing
from launcher.runtime import env


class UnsignedStateError(RendezvousStateError):
    """The store holds a rendezvous state this job did not sign. A torch RendezvousError, so that
    torch's shutdown and keep-alive paths log it instead of raising past the agent."""


class SignedBackend(RendezvousBackend):
    """A RendezvousBackend whose states are signed on the way in and verified on the way out.

    store: the raw store under inner, to see a state key removed (torch's read would block on it);
    own_secret: the secret was made by this process (a one-machine job), so a stranger's value can only
    come from another user or process on this machine, and the message says so.
    """

    def __init__(self, inner: RendezvousBackend, key: bytes, where: str, run_id: str, store: Any = None,
                 own_secret: bool = False) -> None:
        self._inner, self._key, self._where, self._store, self._own = inner, key, where, store, own_secret
        self._context = f"torch.rendezvous.{run_id}"  # also the store key torch's backend keeps the state under
        self._seen = False  # a signed state has been read or written: from then on there is always one

    @property
    def name(self) -> str:
        return str(self._inner.name)  # c10d's, signed

    def get_state(self) -> Optional[Tuple[bytes, Token]]:
        if self._seen and self._store is not None and not self._store.check([self._context]):
            raise self._refused("the state was removed")
        found = self._guarded(self._inner.get_state)
        if found is None:
            return None
        blob, token = found
        return self._open(blob), token

    def set_state(self, state: bytes, token: Optional[Token] = None) -> Optional[Tuple[bytes, Token, bool]]:
        found = self._guarded(lambda: self._inner.set_state(signing.sign(self._key, self._context, state), token))
        if found is None:
            return None
        blob, new_token, written = found
        return self._open(blob), new_token, written

    def _guarded(self, read: Any) -> Any:
        """read()'s result; a value torch cannot decode, or the empty-state sentinel where a state was, refused."""
        try:
            found = read()
        except UnsignedStateError:
            raise
        except RendezvousStateError as e:  # torch's "the state object is corrupt": not base64, so not ours
            raise self._refused(f"it cannot be decoded ({e})") from None
        if found is None and self._seen:
            raise self._refused("it is the empty-state marker, written over this job's state")
        return found

    def _open(self, blob: bytes) -> bytes:
        try:
            payload = signing.verify(self._key, self._context, blob)
        except signing.SignatureError as e:
            raise self._refused(str(e)) from None
        self._seen = True
        return payload

    def _refused(self, reason: str) -> UnsignedStateError:
        if self._own:
            return UnsignedStateError(signing.foreign_value_message(self._where, f"the rendezvous state: {reason}"))
        return UnsignedStateError(unsigned_state_message(self._where, reason))


def unsigned_state_message(where: str, reason: str) -> str:
    return (f"rendezvous state at {where} is not signed with this job's secret: {reason} (another job on the "
            "same port, a node given another secret, or tampering); nothing of it was loaded: give every node "
            f"the same secret (--rdzv-secret-file or {env.RDZV_SECRET}), or pick another port")
