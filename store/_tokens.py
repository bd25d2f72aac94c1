"""API tokens of the service: a name, a role, a public key to find the row, and a hash of the secret.

The store never sees a token in clear: the caller hashes it (``autoslapo.service.auth``) and hands
the hash in; a look-up returns the hash for the caller to verify.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from autoslapo.errors import StorageError
from store._engine import Transactions
from store._schema import utcnow
from store._service_schema import TOKEN_ROLES, TokenRow


@dataclass(frozen=True)
class TokenRecord:
    """A token as stored: never the token itself."""

    name: str
    key: str
    role: str
    secret_hash: str
    created_at: datetime
    revoked_at: datetime | None

    @property
    def active(self) -> bool:
        """True until revoked."""
        return self.revoked_at is None


def _record(row: TokenRow) -> TokenRecord:
    return TokenRecord(row.name, row.key, row.role, row.secret_hash, row.created_at, row.revoked_at)


class TokenTable:
    """The tokens table of one store (``Store.tokens``)."""

    def __init__(self, tx: Transactions) -> None:
        self._tx = tx

    def add(self, name: str, key: str, role: str, secret_hash: str) -> TokenRecord:
        """Store a new token's hash; raises StorageError for a taken name or an unknown role."""
        if role not in TOKEN_ROLES:
            raise StorageError(f"a token's role must be one of {', '.join(TOKEN_ROLES)}: got {role!r}")

        def insert(session: Session) -> TokenRecord:
            row = TokenRow(name=name, key=key, role=role, secret_hash=secret_hash)
            session.add(row)
            session.flush()
            return _record(row)

        made = self._tx.write_unique(f"create token {name!r}", insert)
        if made is None:
            old = next((t for t in self.list() if t.name == name), None)
            if old is not None and not old.active:  # "revoke it" was no fix for a revoked one
                raise StorageError(f"token names must be unique: {name!r} exists, revoked "
                                   f"{old.revoked_at:%Y-%m-%d %H:%M} (a name stays taken, so its old token never "
                                   "works again); pick another name")
            raise StorageError(f"token names must be unique: {name!r} exists; revoke it or pick another name")
        return made

    def by_key(self, key: str) -> TokenRecord | None:
        """The token whose public key is ``key`` (revoked or not), or None."""
        return self._tx.read("look up a token", lambda s: (lambda r: None if r is None else _record(r))(
            s.scalar(select(TokenRow).where(TokenRow.key == key))))

    def list(self) -> list[TokenRecord]:
        """Every token, oldest first."""
        return self._tx.read("list tokens",
                             lambda s: [_record(r) for r in s.scalars(select(TokenRow).order_by(TokenRow.id))])

    def revoke(self, name: str) -> TokenRecord:
        """Revoke the token called ``name`` (idempotent); raises StorageError when there is none."""

        def mark(session: Session) -> TokenRecord | None:
            row = session.scalar(select(TokenRow).where(TokenRow.name == name))
            if row is None:
                return None
            if row.revoked_at is None:
                row.revoked_at = utcnow()
            session.flush()
            return _record(row)

        found = self._tx.write("revoke a token", mark)
        if found is None:
            raise StorageError(f"no token named {name!r}; see `autoslapo token list`")
        return found
