"""Hide credentials in anything autoslapo prints or logs."""

from __future__ import annotations

import re

# scheme://user:password@host -> scheme://user:***@host ; also catches ?password=... query args.
_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*://)(?P<user>[^:/@\s]*):(?P<pw>[^@\s]*)@")
_QUERY_PW = re.compile(r"(?i)(?P<key>[?&](?:password|passwd|pwd|token)=)[^&\s]*")


def redact(text: str) -> str:
    """Return ``text`` with every URL password and password/token query value replaced by ``***``."""
    text = _USERINFO.sub(lambda m: f"{m['scheme']}{m['user']}:***@", text)
    return _QUERY_PW.sub(lambda m: f"{m['key']}***", text)
