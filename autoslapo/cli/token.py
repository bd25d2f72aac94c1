"""``autoslapo token create|list|revoke``: the service's API tokens (the store keeps only a hash)."""

from __future__ import annotations

import argparse
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``autoslapo token``."""
    parser.add_argument("action", choices=["create", "list", "revoke"], help="what to do")
    parser.add_argument("--name", default=None, help="the token's name (create, revoke)")
    parser.add_argument("--role", choices=["read", "submit", "admin"], default=None,
                        help="create only (default read): read: GET; submit: also submit and cancel its own "
                             "studies; admin: everything")
    parser.add_argument("--storage", default=None, help="store URL (default $AUTOSLAPO_STORAGE or sqlite:///autoslapo.db)")


def run(args: argparse.Namespace) -> int:
    """Create (printing the token once), list or revoke tokens; returns 0."""
    from autoslapo.errors import UsageError
    from autoslapo.service.auth import create_token
    from store import open_store

    if args.action in ("create", "revoke") and not args.name:
        raise UsageError(f"`autoslapo token {args.action}` needs --name NAME")
    extra = [f for f, given in (("--name", args.action == "list" and args.name is not None),
                                ("--role", args.action != "create" and args.role is not None)) if given]
    if extra:  # taken and ignored, they looked like filters (`token list --role admin`)
        raise UsageError(f"`autoslapo token {args.action}` takes no {' or '.join(extra)}: got "
                         f"{' '.join(extra)}; drop it (--name names the token to create or revoke, --role "
                         "the role of one created)")
    from autoslapo.storage import open_existing_store

    # listing and revoking create no database; creating a token makes the store if it is not there yet
    store = open_store(args.storage) if args.action == "create" else open_existing_store(
        args.storage, read_only=args.action == "list")
    if store is None:
        from store import resolve_url

        if args.action == "revoke":
            raise UsageError(f"no store at {resolve_url(args.storage)} (the file does not exist): no token named "
                             f"{args.name!r} to revoke; check --storage")
        sys.stderr.write(f"no store at {resolve_url(args.storage)} yet (the file does not exist): no tokens\n")
        return 0
    with store:
        if args.action == "create":
            token = create_token(store, args.name, args.role or "read")
            sys.stderr.write(f"token {args.name!r} ({args.role or 'read'}) created; it is shown once, keep it secret:\n")
            sys.stdout.write(token + "\n")
        elif args.action == "revoke":
            store.tokens.revoke(args.name)
            sys.stdout.write(f"token {args.name!r} revoked\n")
        else:
            for t in store.tokens.list():
                state = "active" if t.active else f"revoked {t.revoked_at:%Y-%m-%d %H:%M}"
                sys.stdout.write(f"{t.name:<24} {t.role:<7} created {t.created_at:%Y-%m-%d %H:%M}  {state}\n")
    return 0
