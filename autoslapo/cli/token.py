"""``autoslapo token create|list|revoke``: the service's API tokens (the store keeps only a hash)."""

from __future__ import annotations

import argparse
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``autoslapo token``."""
    parser.add_argument("action", choices=["create", "list", "revoke"], help="what to do")
    parser.add_argument("--name", default=None, help="the token's name (create, revoke)")
    parser.add_argument("--role", choices=["read", "submit", "admin"], default="read",
                        help="read: GET; submit: also submit and cancel its own studies; admin: everything")
    parser.add_argument("--storage", default=None, help="store URL (default $AUTOSLAPO_STORAGE or sqlite:///autoslapo.db)")


def run(args: argparse.Namespace) -> int:
    """Create (printing the token once), list or revoke tokens; returns 0."""
    from autoslapo.errors import UsageError
    from autoslapo.service.auth import create_token
    from store import open_store

    if args.action in ("create", "revoke") and not args.name:
        raise UsageError(f"`autoslapo token {args.action}` needs --name NAME")
    with open_store(args.storage) as store:
        if args.action == "create":
            token = create_token(store, args.name, args.role)
            sys.stderr.write(f"token {args.name!r} ({args.role}) created; it is shown once, keep it secret:\n")
            sys.stdout.write(token + "\n")
        elif args.action == "revoke":
            store.tokens.revoke(args.name)
            sys.stdout.write(f"token {args.name!r} revoked\n")
        else:
            for t in store.tokens.list():
                state = "active" if t.active else f"revoked {t.revoked_at:%Y-%m-%d %H:%M}"
                sys.stdout.write(f"{t.name:<24} {t.role:<7} created {t.created_at:%Y-%m-%d %H:%M}  {state}\n")
    return 0
