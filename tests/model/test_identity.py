"""Golden vectors, bounds, redaction and properties of streamsched.identity.

The expected identities are checked three ways: an independent re-implementation of the
encoding documented in identity.py (written here with struct/hashlib), the library, and
hard-coded literals. If any two disagree the encoding has changed, which breaks every stored
claim: bump IDENTITY_VERSION instead of editing the literals.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import struct
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamsched.errors import BoundExceeded, InvalidName, ReservedName, StreamschedError
from streamsched.model.identity import (
    IDENTITY_VERSION,
    IdentityParts,
    business_identity,
    canonical_encoding,
    canonical_target,
    claim_identity,
    release_identity,
    route_key,
)
from streamsched.model.limits import MAX_TARGET_BYTES, MAX_TARGET_COMPONENTS

IDENTITY_RE = re.compile(r"sched_[0-9a-f]{64}")
MARKER = "PLAINTEXT-MARKER-7f3a"

# --- independent re-implementation of the documented encoding ---------------------------------


def _ref_field(number: int, raw: bytes) -> bytes:
    return struct.pack(">BI", number, len(raw)) + raw


def _ref_target(target: tuple[str, ...]) -> bytes:
    out = struct.pack(">B", len(target))
    for component in target:
        raw = component.encode("utf-8")
        out += struct.pack(">I", len(raw)) + raw
    return out


def _ref_encoding(p: IdentityParts) -> bytes:
    return (
        b"streamsched/business-identity/v1\x00"
        + _ref_field(1, b"v1")
        + _ref_field(2, p.scheduler.encode("utf-8"))
        + _ref_field(3, p.topic.encode("utf-8"))
        + _ref_field(4, p.selection.encode("utf-8"))
        + _ref_field(5, struct.pack(">Q", p.due_ns))
        + _ref_field(6, p.tenant.encode("utf-8"))
        + _ref_field(7, _ref_target(p.target))
        + _ref_field(8, p.attempt_kind.encode("utf-8"))
    )


def _ref_identity(p: IdentityParts) -> str:
    return "sched_" + hashlib.sha256(_ref_encoding(p)).hexdigest()


def _ref_bound(domain: bytes, identity: str, ordinal: int) -> str:
    digest = bytes.fromhex(identity.removeprefix("sched_"))
    return "sched_" + hashlib.sha256(domain + digest + struct.pack(">Q", ordinal)).hexdigest()


def _ref_route_key(tenant: str, target: tuple[str, ...]) -> bytes:
    raw = _ref_field(1, tenant.encode("utf-8")) + _ref_field(2, _ref_target(target))
    return hashlib.sha256(b"streamsched/route-key/v1\x00" + raw).hexdigest()[:32].encode()


# --- golden vectors ---------------------------------------------------------------------------

BASE = IdentityParts("billing", "invoices.due", "cron-0", 1_700_000_000_000_000_000, "acme",
                     ("customer", "42"), "run")

GOLDEN: list[tuple[str, IdentityParts, str]] = [
    ("basic", BASE,
     "sched_6f222a4c174f81ea706bffc21fd541ac5bda38afccd3e73f49cc2079643bf300"),
    ("due_ns_zero", dataclasses.replace(BASE, due_ns=0),
     "sched_a91c7cdc8761f5ea39f7426eab91dfa4698030a01557bb3922bf5f32d29ca066"),
    ("due_ns_u64_max", dataclasses.replace(BASE, due_ns=2**64 - 1),
     "sched_8bb083dc8d6ff2274dbd39adf199c89bf3eb64e19b65ce421231057b5f72ea19"),
    ("unicode_tenant",
     IdentityParts("mail_sched", "mail-out", "daily", 1_717_171_717_123_456_789,
                   "テナント-Müller-😀", ("ü", "日本"), "send"),
     "sched_dce02c4d9c96853dc45d664291e021ba8bd4ca07b16baef955f4e53b8417241b"),
    ("empty_target",
     IdentityParts("mail_sched", "mail-out", "daily", 1_717_171_717_123_456_789, "acme", (), "send"),
     "sched_62cc5a64777e2ef4608f878302f20bd0286c74f33a0838738bea414b6aaec14a"),
    ("eight_components_empty_tenant",
     IdentityParts("s.1", "t-1", "sel_1", 12345, "", ("a", "b", "c", "d", "e", "f", "g", "h"), "retry"),
     "sched_17d5d9975c2a42f562750295680261fda0374262b968e4df9f1d9aec5e69ad32"),
    ("one_empty_component",
     IdentityParts("s.1", "t-1", "sel_1", 12345, "t", ("",), "retry"),
     "sched_15e0baff83e7d2af2740afa00a9065ca41b98ff3eaa0f930510f9d512d4dfe22"),
    ("two_empty_components",
     IdentityParts("s.1", "t-1", "sel_1", 12345, "t", ("", ""), "retry"),
     "sched_0c853e1feb53cb8f0039553eeb09b8149b99c16eb0bf5ca9bea23465cdaec683"),
]

GOLDEN_CLAIM_1 = "sched_55b738228b90e643eafb6be4b25ef7887b84b341a79ab3638f32561ab323e6cc"
GOLDEN_RELEASE_1 = "sched_867fb45e9460e9bf6feecb4551ac0610d1682866bef2642326fe60fa521e62f1"
GOLDEN_ROUTE = b"3b1d20e97caa3eb4cc7d8be16de1b35e"


def test_identity_version_is_v1() -> None:
    assert IDENTITY_VERSION == "v1"


@pytest.mark.parametrize(("parts", "expected"), [(p, e) for _, p, e in GOLDEN],
                         ids=[n for n, _, _ in GOLDEN])
def test_golden_vectors(parts: IdentityParts, expected: str) -> None:
    assert canonical_encoding(parts) == _ref_encoding(parts)
    assert _ref_identity(parts) == expected
    assert business_identity(parts) == expected


def test_golden_vectors_are_distinct() -> None:
    values = [e for _, _, e in GOLDEN]
    assert len(set(values)) == len(values)


def test_golden_claim_release_route() -> None:
    base = business_identity(BASE)
    assert _ref_bound(b"streamsched/claim-identity/v1\x00", base, 1) == GOLDEN_CLAIM_1
    assert _ref_bound(b"streamsched/release-identity/v1\x00", base, 1) == GOLDEN_RELEASE_1
    assert claim_identity(base, 1) == GOLDEN_CLAIM_1
    assert release_identity(base, 1) == GOLDEN_RELEASE_1
    assert _ref_route_key("acme", ("customer", "42")) == GOLDEN_ROUTE
    assert route_key("acme", ("customer", "42")) == GOLDEN_ROUTE


def test_list_target_equals_tuple_target() -> None:
    assert canonical_target(["customer", "42"]) == canonical_target(("customer", "42"))
    assert route_key("acme", ["customer", "42"]) == route_key("acme", ("customer", "42"))


# --- claim / release / route ------------------------------------------------------------------


def test_claim_release_differ_and_bind_ordinal() -> None:
    base = business_identity(BASE)
    seen = {base}
    for ordinal in (1, 2, 3, 10, 2**64 - 1):
        c = claim_identity(base, ordinal)
        r = release_identity(base, ordinal)
        assert IDENTITY_RE.fullmatch(c) and IDENTITY_RE.fullmatch(r)
        assert c != r
        assert c not in seen and r not in seen
        seen |= {c, r}
        assert claim_identity(base, ordinal) == c  # deterministic
    assert claim_identity(base, 1) != claim_identity(base, 2)
    assert release_identity(base, 1) != release_identity(base, 2)


def test_claim_identity_depends_on_business_identity() -> None:
    a = business_identity(BASE)
    b = business_identity(dataclasses.replace(BASE, due_ns=BASE.due_ns + 1))
    assert claim_identity(a, 1) != claim_identity(b, 1)
    assert release_identity(a, 1) != release_identity(b, 1)


@pytest.mark.parametrize("ordinal", [0, -1, -(2**70), 2**64])
@pytest.mark.parametrize("fn", [claim_identity, release_identity])
def test_bad_ordinal_rejected(fn: object, ordinal: int) -> None:
    base = business_identity(BASE)
    with pytest.raises(BoundExceeded):
        fn(base, ordinal)  # type: ignore[operator]


@pytest.mark.parametrize("bad", ["", "sched_", "sched_" + "0" * 63, "sched_" + "0" * 65,
                                 "sched_" + "g" * 64, "SCHED_" + "0" * 64, "x" * 70, 12])
def test_malformed_identity_rejected(bad: object) -> None:
    with pytest.raises(InvalidName):
        claim_identity(bad, 1)  # type: ignore[arg-type]
    with pytest.raises(InvalidName):
        release_identity(bad, 1)  # type: ignore[arg-type]


def test_route_key_stable_and_shared() -> None:
    k = route_key("acme", ("customer", "42"))
    assert k == route_key("acme", ("customer", "42"))
    assert isinstance(k, bytes) and re.fullmatch(rb"[0-9a-f]{32}", k)
    # every identity of one (tenant, target) shares the key, whatever the other fields are
    other = dataclasses.replace(BASE, scheduler="other", due_ns=1, attempt_kind="x")
    assert route_key(other.tenant, other.target) == k
    assert route_key("acme", ("customer", "43")) != k
    assert route_key("acmf", ("customer", "42")) != k
    assert route_key("acme", ("customer42",)) != k
    assert b"acme" not in k and b"customer" not in k


# --- bounds and typed errors ------------------------------------------------------------------


def test_nine_components_rejected() -> None:
    target = tuple(str(i) for i in range(MAX_TARGET_COMPONENTS + 1))
    with pytest.raises(BoundExceeded) as ei:
        business_identity(dataclasses.replace(BASE, target=target))
    assert ei.value.limit == MAX_TARGET_COMPONENTS and ei.value.actual == 9
    with pytest.raises(BoundExceeded):
        route_key("acme", target)


def test_canonical_target_size_boundary() -> None:
    # 1 count byte + 4 length bytes + payload
    at_limit = ("x" * (MAX_TARGET_BYTES - 5),)
    assert len(canonical_target(at_limit)) == MAX_TARGET_BYTES
    business_identity(dataclasses.replace(BASE, target=at_limit))
    over = ("x" * (MAX_TARGET_BYTES - 4),)
    with pytest.raises(BoundExceeded) as ei:
        business_identity(dataclasses.replace(BASE, target=over))
    assert ei.value.limit == MAX_TARGET_BYTES
    # spread over several components
    spread = tuple("y" * 125 for _ in range(8))  # 1 + 8 * 129 = 1033
    with pytest.raises(BoundExceeded):
        canonical_target(spread)
    # multi-byte characters count in bytes, not characters
    with pytest.raises(BoundExceeded):
        canonical_target(("é" * 510,))  # 1 + 4 + 1020 bytes


def test_tenant_too_long_rejected() -> None:
    with pytest.raises(BoundExceeded):
        business_identity(dataclasses.replace(BASE, tenant="t" * 257))
    business_identity(dataclasses.replace(BASE, tenant="t" * 256))


@pytest.mark.parametrize("field", ["scheduler", "topic", "selection", "attempt_kind"])
def test_reserved_prefix_rejected(field: str) -> None:
    with pytest.raises(ReservedName):
        business_identity(dataclasses.replace(BASE, **{field: "__streamsched.internal"}))


@pytest.mark.parametrize("field", ["scheduler", "topic", "selection", "attempt_kind"])
@pytest.mark.parametrize("bad", ["", ".", "..", "has space", "slash/x", "ü", "a" * 201, None, 5])
def test_invalid_names_rejected(field: str, bad: object) -> None:
    with pytest.raises(InvalidName):
        business_identity(dataclasses.replace(BASE, **{field: bad}))


def test_lone_surrogate_tenant_rejected() -> None:
    with pytest.raises(InvalidName):
        business_identity(dataclasses.replace(BASE, tenant="ok\ud800"))
    with pytest.raises(InvalidName):
        route_key("ok\udfff", ())


def test_lone_surrogate_target_rejected() -> None:
    with pytest.raises(InvalidName):
        business_identity(dataclasses.replace(BASE, target=("a", "\udc80")))


@pytest.mark.parametrize("bad", [None, 3, b"bytes"])
def test_non_string_tenant_or_component_rejected(bad: object) -> None:
    with pytest.raises(InvalidName):
        business_identity(dataclasses.replace(BASE, tenant=bad))  # type: ignore[arg-type]
    with pytest.raises(InvalidName):
        business_identity(dataclasses.replace(BASE, target=("a", bad)))  # type: ignore[arg-type]


@pytest.mark.parametrize("due", [-1, -(2**63), 2**64, 2**80])
def test_due_ns_out_of_range(due: int) -> None:
    with pytest.raises(BoundExceeded):
        business_identity(dataclasses.replace(BASE, due_ns=due))


@pytest.mark.parametrize("due", [True, 1.0, "1", None])
def test_due_ns_must_be_int(due: object) -> None:
    with pytest.raises(InvalidName):
        business_identity(dataclasses.replace(BASE, due_ns=due))  # type: ignore[arg-type]


REDACTION_CASES = {
    "tenant_surrogate": dataclasses.replace(BASE, tenant=MARKER + "\ud800"),
    "tenant_too_long": dataclasses.replace(BASE, tenant=MARKER * 20),
    "target_nine": dataclasses.replace(BASE, tenant=MARKER, target=(MARKER,) * 9),
    "target_too_big": dataclasses.replace(BASE, tenant=MARKER, target=(MARKER * 60,)),
    "target_surrogate": dataclasses.replace(BASE, tenant=MARKER, target=(MARKER + "\udfff",)),
    "target_spread": dataclasses.replace(BASE, tenant=MARKER, target=(MARKER * 6,) * 8),
    "reserved_with_tenant": dataclasses.replace(BASE, tenant=MARKER, target=(MARKER,),
                                                scheduler="__streamsched"),
    "negative_due": dataclasses.replace(BASE, tenant=MARKER, target=(MARKER,), due_ns=-5),
}


@pytest.mark.parametrize("parts", list(REDACTION_CASES.values()), ids=list(REDACTION_CASES))
def test_errors_do_not_leak_plaintext(parts: IdentityParts) -> None:
    with pytest.raises(StreamschedError) as ei:
        business_identity(parts)
    err = ei.value
    for text in (str(err), repr(err), repr(err.args), repr(vars(err)) if hasattr(err, "__dict__") else ""):
        assert MARKER not in text
        assert "PLAINTEXT" not in text
    assert err.__cause__ is None or MARKER not in str(err.__cause__)
    assert err.__suppress_context__ or err.__context__ is None


def test_route_key_errors_do_not_leak_plaintext() -> None:
    for tenant, target in ((MARKER + "\ud800", ()), (MARKER, (MARKER * 60,)), (MARKER, (MARKER,) * 9)):
        with pytest.raises(StreamschedError) as ei:
            route_key(tenant, target)
        assert MARKER not in str(ei.value) and MARKER not in repr(ei.value)


# --- properties -------------------------------------------------------------------------------

_name = st.from_regex(r"[A-Za-z0-9._-]{1,24}", fullmatch=True).filter(
    lambda s: s not in (".", "..") and not s.startswith("__streamsched"))
_text = st.text(max_size=16)  # default alphabet excludes surrogates; <= 64 bytes
_target = st.lists(_text, max_size=MAX_TARGET_COMPONENTS).map(tuple)
_due = st.integers(min_value=0, max_value=2**64 - 1)
_parts = st.builds(IdentityParts, scheduler=_name, topic=_name, selection=_name, due_ns=_due,
                   tenant=_text, target=_target, attempt_kind=_name)
_FIELD_STRATEGIES: dict[str, st.SearchStrategy[object]] = {
    "scheduler": _name, "topic": _name, "selection": _name, "due_ns": _due,
    "tenant": _text, "target": _target, "attempt_kind": _name,
}


@settings(max_examples=120, deadline=None)
@given(parts=_parts)
def test_identity_deterministic_and_well_formed(parts: IdentityParts) -> None:
    ident = business_identity(parts)
    assert IDENTITY_RE.fullmatch(ident)
    assert ident == business_identity(dataclasses.replace(parts))
    assert ident == _ref_identity(parts)
    assert canonical_encoding(parts) == _ref_encoding(parts)
    for ordinal in (1, 2):
        assert IDENTITY_RE.fullmatch(claim_identity(ident, ordinal))
        assert IDENTITY_RE.fullmatch(release_identity(ident, ordinal))
    assert route_key(parts.tenant, parts.target) == _ref_route_key(parts.tenant, parts.target)


@settings(max_examples=150, deadline=None)
@given(parts=_parts, data=st.data())
def test_changing_any_single_field_changes_identity(parts: IdentityParts, data: st.DataObject) -> None:
    field = data.draw(st.sampled_from(sorted(_FIELD_STRATEGIES)))
    old = getattr(parts, field)
    new = data.draw(_FIELD_STRATEGIES[field].filter(lambda v: v != old), label=field)
    changed = dataclasses.replace(parts, **{field: new})
    assert canonical_encoding(changed) != canonical_encoding(parts)
    assert business_identity(changed) != business_identity(parts)
    if field in ("tenant", "target"):
        assert route_key(changed.tenant, changed.target) != route_key(parts.tenant, parts.target)
    else:
        assert route_key(changed.tenant, changed.target) == route_key(parts.tenant, parts.target)


@settings(max_examples=100, deadline=None)
@given(a=_target, b=_target)
def test_target_boundaries_are_unambiguous(a: tuple[str, ...], b: tuple[str, ...]) -> None:
    # length-prefixing means concatenation-equal targets still differ
    if a != b:
        assert canonical_target(a) != canonical_target(b)


_SUBPROCESS_SCRIPT = r"""
import json, sys
from streamsched.model.identity import (IdentityParts, business_identity, claim_identity,
    release_identity, route_key)
out = []
for rec in json.load(sys.stdin):
    p = IdentityParts(rec["scheduler"], rec["topic"], rec["selection"], rec["due_ns"], rec["tenant"],
                      tuple(rec["target"]), rec["attempt_kind"])
    b = business_identity(p)
    out.append([b, claim_identity(b, 3), release_identity(b, 3), route_key(p.tenant, p.target).decode()])
json.dump(out, sys.stdout)
"""


def test_identity_matches_in_subprocess_with_random_hash_seed() -> None:
    parts = [p for _, p, _ in GOLDEN]
    parts += [dataclasses.replace(BASE, due_ns=i * 7_919, tenant=f"tenant-{i}-ß", target=(str(i), "k"))
              for i in range(20)]
    payload = json.dumps([dataclasses.asdict(p) for p in parts])
    env = dict(os.environ, PYTHONHASHSEED="random", PYTHONPATH="/work/main")
    proc = subprocess.run([sys.executable, "-c", _SUBPROCESS_SCRIPT], input=payload, env=env,
                          capture_output=True, text=True, timeout=60, check=True)
    remote = json.loads(proc.stdout)
    local = []
    for p in parts:
        b = business_identity(p)
        local.append([b, claim_identity(b, 3), release_identity(b, 3),
                      route_key(p.tenant, p.target).decode()])
    assert remote == local
    assert [r[0] for r in remote[: len(GOLDEN)]] == [e for _, _, e in GOLDEN]


def test_string_target_is_rejected() -> None:
    with pytest.raises(InvalidName):
        business_identity(dataclasses.replace(BASE, target="xy"))  # type: ignore[arg-type]


@pytest.mark.parametrize("mangle", ["upper", "whitespace"])
def test_non_canonical_identity_rejected(mangle: str) -> None:
    base = business_identity(BASE)
    bad = ("sched_" + base[6:].upper()) if mangle == "upper" else ("sched_" + base[6:68] + "  ")
    with pytest.raises(InvalidName):
        claim_identity(bad, 1)


@given(due=st.integers(min_value=0, max_value=2**64 - 1), tenant=st.text(max_size=40),
       target=st.lists(st.text(max_size=20), max_size=8).map(tuple))
def test_resolver_matches_business_identity(due: int, tenant: str, target: tuple[str, ...]) -> None:
    from streamsched.model.identity import IdentityResolver

    resolve = IdentityResolver(BASE.scheduler, BASE.topic, BASE.selection, BASE.attempt_kind)
    parts = dataclasses.replace(BASE, due_ns=due, tenant=tenant, target=target)
    try:
        expected = business_identity(parts)
    except StreamschedError as exc:
        with pytest.raises(type(exc)):
            resolve(due, tenant, target)
        return
    assert resolve(due, tenant, target) == expected
