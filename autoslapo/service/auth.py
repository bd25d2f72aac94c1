"""API tokens: made here, shown once, stored only as an argon2id hash; roles and what each may do.

A token reads ``aslp_<key>_<secret>``: the key finds the row, argon2 checks the whole token
against the stored hash. Verified tokens are cached (by their SHA-256, for a few seconds) so a
busy reader does not pay argon2 on every request; a revoked token stops working within that time.
"""

from __future__ import annotations

import hashlib
import secrets
import threading
import time
from dataclasses import dataclass

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError

from autoslapo.errors import UsageError
from store import TOKEN_ROLES, Store, TokenRecord

PREFIX = "aslp"
#: What each role may do, lowest first: read (GET), submit (also POST studies and cancel its own), admin.
RANK = {role: i for i, role in enumerate(TOKEN_ROLES)}
CACHE_S = 5.0

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


class TokenCheck:
    """Turns an ``Authorization`` header into a ``Caller`` (or None for no valid token)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._cache: dict[str, tuple[float, TokenRecord]] = {}
        self._lock = threading.Lock()

    def caller(self, header: str | None) -> Caller | None:
        """The caller a ``Bearer`` header names, or None when it is missing, malformed, unknown or revoked."""
        if not header or not header.startswith("Bearer "):
            return None
        token = header[len("Bearer "):].strip()
        parts = token.split("_", 2)
        if len(parts) != 3 or parts[0] != PREFIX:
            return None
        digest = hashlib.sha256(token.encode()).hexdigest()
        now = time.monotonic()
        with self._lock:
            hit = self._cache.get(digest)
        if hit is not None and hit[0] > now:
            return Caller(hit[1].name, hit[1].role)
        record = self.store.tokens.by_key(parts[1])
        if record is None or not record.active:
            return None
        try:
            _hasher.verify(record.secret_hash, token)
        except (VerificationError, InvalidHashError):
            return None
        with self._lock:
            if len(self._cache) > 10_000:
                self._cache.clear()
            self._cache[digest] = (now + CACHE_S, record)
        return Caller(record.name, record.role)
