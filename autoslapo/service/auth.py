"""API tokens: made here, shown once, stored only as an argon2id hash; roles and what each may do.

A token reads ``aslp_<key>_<secret>``: the key finds the row, argon2 checks the whole token
against the stored hash. argon2 is slow on purpose (tens of ms of CPU, seconds on a starved
machine), so a verified token is remembered, keyed by an HMAC-SHA256 of the token under a key
made at start-up (the token itself is never kept). For ``CACHE_S`` seconds it is trusted from
memory; after that one indexed read of its row confirms it is still active with the same hash
(argon2 already proved the token against that hash, so it is not run again). A revoked token is
thus refused within ``CACHE_S`` seconds. The server rechecks a token in use a little before its
trust runs out (``due``), in the background, so a busy client's requests never wait for it.
Concurrent first checks of one token share one argon2 run. Failed checks are not remembered.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError

from autoslapo.errors import UsageError
from store import TOKEN_ROLES, Store

PREFIX = "aslp"
#: What each role may do, lowest first: read (GET), submit (also POST studies and cancel its own), admin.
RANK = {role: i for i, role in enumerate(TOKEN_ROLES)}
CACHE_S = 5.0
CACHE_TOKENS = 10_000
RECHECK_AHEAD_S = 1.0  # ``due`` this long before a token's trust runs out
_STRIPES = 64  # locks that serialise checks of the same token (by digest), bounded whatever the traffic

_hasher = PasswordHasher()


@dataclass(frozen=True)
class Caller:
    """Who sent a request: a token's name and role (``anonymous``/``read`` under --allow-anonymous-read)."""

    name: str
    role: str

    def may(self, role: str) -> bool:
        """True when this caller's role is ``role`` or above."""
        return RANK[self.role] >= RANK[role]


def create_token(store: Store, name: str, role: str) -> str:
    """Store a new token's hash under ``name`` with ``role``; return the token (the only time it exists).

    Raises UsageError for a bad name or role, StorageError for a taken name.
    """
    if role not in TOKEN_ROLES:
        raise UsageError(f"--role must be one of {', '.join(TOKEN_ROLES)}: got {role!r}")
    if not name or len(name) > 100 or not all(c.isalnum() or c in "._-" for c in name):
        raise UsageError(f"token names are 1-100 of letters, digits, . _ -: got {name[:60]!r}")
    key = secrets.token_hex(6)
    token = f"{PREFIX}_{key}_{secrets.token_urlsafe(32)}"
    store.tokens.add(name, key, role, _hasher.hash(token))
    return token


@dataclass(frozen=True)
class _Verified:
    until: float  # trusted from memory until then (monotonic seconds)
    caller: Caller
    secret_hash: str  # the stored hash argon2 verified this token against


class TokenCheck:
    """Turns an ``Authorization`` header into a ``Caller`` (or None for no valid token).

    ``cache_s``: how long a verified token is trusted without asking the store again (0: every
    request reads the row and runs argon2), which is also how long a revocation may take to be
    seen. At most ``max_tokens`` verified tokens are remembered, the least recently used dropped
    first. ``clock``: monotonic seconds.
    """

    def __init__(self, store: Store, *, cache_s: float = CACHE_S, max_tokens: int = CACHE_TOKENS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if cache_s < 0 or max_tokens < 1:
            raise UsageError(f"the token cache needs cache_s >= 0 and max_tokens >= 1: got {cache_s}, {max_tokens}")
        self.store = store
        self.cache_s = cache_s
        self.max_tokens = max_tokens
        self.clock = clock
        self.argon2_runs = 0  # how many tokens were checked with argon2 (the slow path), for tests and metrics
        self._key = secrets.token_bytes(32)
        self._cache: OrderedDict[bytes, _Verified] = OrderedDict()
        self._lock = threading.Lock()
        self._stripes = [threading.Lock() for _ in range(_STRIPES)]
        self._rechecking: set[bytes] = set()

    def cached(self, header: str | None) -> Caller | None:
        """The caller of a token trusted from memory right now, else None (no store, no argon2:
        cheap enough for the event loop). None does not mean invalid: ask ``caller``."""
        token = _token(header)
        if token is None:
            return None
        hit = self._remembered(self._digest(token))
        return hit.caller if hit is not None and hit.until > self.clock() else None

    def due(self, header: str | None) -> bool:
        """True when the token is trusted from memory but for less than ``RECHECK_AHEAD_S`` more
        seconds: time to ``caller(header, recheck=True)``."""
        token = _token(header)
        hit = None if token is None else self._remembered(self._digest(token))
        return hit is not None and hit.until - self.clock() < min(RECHECK_AHEAD_S, self.cache_s / 2)

    def claim_recheck(self, header: str | None) -> bool:
        """``due``, and no one claimed this token's recheck yet: the caller runs
        ``caller(header, recheck=True)`` (in the background); everyone else goes on from memory."""
        token = _token(header)
        if token is None or not self.due(header):
            return False
        digest = self._digest(token)
        with self._lock:
            if digest in self._rechecking:
                return False
            self._rechecking.add(digest)
            return True

    def caller(self, header: str | None, *, recheck: bool = False) -> Caller | None:
        """The caller a ``Bearer`` header names, or None when it is missing, malformed, unknown or revoked.

        ``recheck``: read the token's row now even if it is still trusted from memory."""
        token = _token(header)
        if token is None:
            return None
        digest = self._digest(token)
        with self._stripes[digest[0] % _STRIPES]:
            try:
                return self._check(token, digest, recheck=recheck)
            finally:
                with self._lock:
                    self._rechecking.discard(digest)

    def _check(self, token: str, digest: bytes, *, recheck: bool) -> Caller | None:
        known = self._remembered(digest)
        if known is not None and known.until > self.clock():
            ahead = known.until - self.clock() < min(RECHECK_AHEAD_S, self.cache_s / 2)
            if not (recheck and ahead):
                return known.caller
        record = self.store.tokens.by_key(token.split("_", 2)[1])
        if record is None or not record.active:
            self._forget(digest)
            return None
        if known is None or known.secret_hash != record.secret_hash:
            self.argon2_runs += 1
            try:
                _hasher.verify(record.secret_hash, token)
            except (VerificationError, InvalidHashError):
                self._forget(digest)
                return None
        found = Caller(record.name, record.role)
        if self.cache_s > 0:
            with self._lock:
                self._cache[digest] = _Verified(self.clock() + self.cache_s, found, record.secret_hash)
                self._cache.move_to_end(digest)
                while len(self._cache) > self.max_tokens:
                    self._cache.popitem(last=False)
        return found

    def _remembered(self, digest: bytes) -> _Verified | None:
        with self._lock:
            hit = self._cache.get(digest)
            if hit is not None:
                self._cache.move_to_end(digest)
            return hit

    def _forget(self, digest: bytes) -> None:
        with self._lock:
            self._cache.pop(digest, None)

    def _digest(self, token: str) -> bytes:
        return hmac.new(self._key, token.encode(), hashlib.sha256).digest()


def _token(header: str | None) -> str | None:
    """The token of a ``Bearer aslp_<key>_<secret>`` header, or None when it has another shape (the scheme's
    name in any case: RFC 9110, section 11.1)."""
    scheme, _, token = (header or "").partition(" ")
    if scheme.lower() != "bearer":
        return None
    token = token.strip()
    parts = token.split("_", 2)
    if len(parts) != 3 or parts[0] != PREFIX or not parts[1] or not parts[2]:
        return None
    return token
