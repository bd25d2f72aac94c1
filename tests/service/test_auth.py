"""Token checks: the in-memory cache of verified tokens honours revocation within its bound; roles hold."""

from __future__ import annotations

import threading

import pytest
from fastapi.testclient import TestClient

from autoslapo.errors import UsageError
from autoslapo.service import ServiceSettings, TokenCheck, create_app, create_token
from store import Store
from tests.service.conftest import bearer


class Clock:
    """Monotonic seconds that move only when the test says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_revoked_token_is_refused_once_its_cache_entry_lapses(service_store: Store) -> None:
    clock = Clock()
    check = TokenCheck(service_store, cache_s=5.0, clock=clock)
    token = create_token(service_store, "ci", "submit")
    header = f"Bearer {token}"
    assert check.cached(header) is None  # never verified yet: the store and argon2 decide
    assert check.caller(header) == check.cached(header) is not None
    assert check.caller(header).role == "submit"  # type: ignore[union-attr]
    service_store.tokens.revoke("ci")
    clock.now += 4.9
    assert check.caller(header) is not None  # still inside the documented 5 s bound
    clock.now += 0.2
    assert check.cached(header) is None and check.caller(header) is None
    clock.now += 100
    assert check.caller(header) is None  # a refused token is not cached as valid later either


def test_argon2_runs_once_per_token_then_the_row_is_rechecked(service_store: Store) -> None:
    clock = Clock()
    check = TokenCheck(service_store, cache_s=5.0, clock=clock)
    header = f"Bearer {create_token(service_store, 'ci', 'read')}"
    callers: list[object] = []
    threads = [threading.Thread(target=lambda: callers.append(check.caller(header))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(callers) == 8 and all(c is not None for c in callers)
    assert check.argon2_runs == 1  # eight concurrent first checks, one argon2 run
    for _ in range(3):
        clock.now += 6  # lapsed: the row is read again (still active, same hash), argon2 is not rerun
        assert check.cached(header) is None and check.caller(header) is not None
    assert check.argon2_runs == 1
    service_store.tokens.revoke("ci")
    clock.now += 6
    assert check.caller(header) is None


def test_a_token_in_use_is_rechecked_before_its_trust_runs_out(service_store: Store) -> None:
    clock = Clock()
    check = TokenCheck(service_store, cache_s=5.0, clock=clock)
    header = f"Bearer {create_token(service_store, 'ci', 'read')}"
    assert check.caller(header) is not None
    assert not check.due(header) and not check.claim_recheck(header)
    clock.now += 4.5  # in the last second of its trust: one recheck is claimed, the rest go on from memory
    assert check.due(header) and check.claim_recheck(header) and not check.claim_recheck(header)
    service_store.tokens.revoke("ci")
    assert check.cached(header) is not None  # still trusted (the 5 s bound) until the recheck ran
    assert check.caller(header, recheck=True) is None
    assert check.cached(header) is None and check.caller(header) is None


def test_without_a_cache_revocation_is_seen_at_once(service_store: Store) -> None:
    check = TokenCheck(service_store, cache_s=0)
    token = create_token(service_store, "ci", "read")
    assert check.caller(f"Bearer {token}") is not None
    assert check.cached(f"Bearer {token}") is None
    service_store.tokens.revoke("ci")
    assert check.caller(f"Bearer {token}") is None


def test_wrong_secrets_and_shapes_are_refused_and_never_cached(service_store: Store) -> None:
    check = TokenCheck(service_store)
    token = create_token(service_store, "ci", "admin")
    forged = token[:-4] + ("AAAA" if not token.endswith("AAAA") else "BBBB")
    for header in (f"Bearer {forged}", "Bearer aslp__x", "Bearer aslp_x", f"Basic {token}", "", None,
                   f"Bearer {token.replace('aslp_', 'xxxx_', 1)}"):
        assert check.caller(header) is None, header
        assert check.cached(header) is None, header
    assert check.caller(f"Bearer {token}") is not None
    for scheme in ("bearer", "BEARER"):  # the scheme's name is case-insensitive (RFC 9110, section 11.1)
        assert check.caller(f"{scheme} {token}") is not None, scheme


def test_the_cache_is_bounded_least_recently_used_first(service_store: Store) -> None:
    check = TokenCheck(service_store, max_tokens=2)
    first, second, third = (f"Bearer {create_token(service_store, f't{i}', 'read')}" for i in range(3))
    for header in (first, second, third):
        assert check.caller(header) is not None
    assert check.cached(first) is None  # dropped: the oldest of three in a cache of two
    assert check.cached(second) is not None and check.cached(third) is not None
    assert check.caller(first) is not None  # verified again from the store


def test_cache_settings_are_checked(service_store: Store) -> None:
    with pytest.raises(UsageError, match="cache_s >= 0"):
        TokenCheck(service_store, cache_s=-1)
    with pytest.raises(UsageError, match="token_cache_s"):
        ServiceSettings(token_cache_s=-1)
    with pytest.raises(UsageError, match="answer_cache_s"):
        ServiceSettings(answer_cache_s=60)


def test_roles_hold_on_the_cached_endpoints(service_store: Store, tokens: dict[str, str]) -> None:
    best = {"model": "bert", "gpus": 8}
    with TestClient(create_app(service_store, ServiceSettings(token_cache_s=0))) as client:
        for path, params in (("/v1/best", best), ("/v1/studies", None)):
            assert client.get(path, params=params).status_code == 401
            assert client.get(path, params=params, headers=bearer("aslp_nope_nope")).status_code == 401
            for role in ("read", "submit", "admin"):  # twice: the second check may come from the cache
                for _ in range(2):
                    r = client.get(path, params=params, headers=bearer(tokens[role]))
                    assert r.status_code in (200, 404), r.text
        assert client.post("/v1/studies", json={"model": "bert", "gpus": 8},
                           headers=bearer(tokens["read"])).status_code == 403
        service_store.tokens.revoke("t-read")
        assert client.get("/v1/best", params=best, headers=bearer(tokens["read"])).status_code == 401
        assert client.get("/v1/studies", headers=bearer(tokens["read"])).status_code == 401
    with TestClient(create_app(service_store, ServiceSettings())) as client:  # default cache: same answers
        r = client.get("/v1/studies", headers=bearer(tokens["submit"]))
        assert r.status_code == 200 and r.json() == {"studies": []}
        assert client.get("/v1/studies", headers=bearer(tokens["submit"])).status_code == 200
        assert client.get("/v1/studies").status_code == 401
        cookie = client.get("/v1/studies", cookies={"autoslapo_token": tokens["admin"]})
        assert cookie.status_code == 200
