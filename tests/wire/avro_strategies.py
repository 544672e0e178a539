"""Hypothesis strategies for values of streamsched's Avro schemas (shared by codec tests)."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from streamsched.model.limits import MAX_TARGET_COMPONENTS
from streamsched.wire.avro_schema import parsed_schema

INT32 = st.integers(-(2**31), 2**31 - 1)
INT64 = st.integers(-(2**63), 2**63 - 1)
TEXT = st.text(max_size=24)
BINARY = st.binary(max_size=48)


def avro_values(name: str, *, text: st.SearchStrategy[str] = TEXT,
                binary: st.SearchStrategy[bytes] = BINARY) -> st.SearchStrategy[Any]:
    """Records of schema ``name``; arrays stay within every codec bound."""
    schema = parsed_schema(name)
    named: dict[str, Any] = schema["__named_schemas"]
    leaves = {"null": st.none(), "boolean": st.booleans(), "int": INT32, "long": INT64,
              "string": text, "bytes": binary}

    def values(node: Any) -> st.SearchStrategy[Any]:
        if isinstance(node, list):
            return st.one_of([values(branch) for branch in node])
        if isinstance(node, str):
            if node in named:
                return values(named[node])
            node = {"type": node}
        kind = node["type"]
        if kind == "record":
            return st.fixed_dictionaries({f["name"]: values(f["type"]) for f in node["fields"]})
        if kind == "enum":
            return st.sampled_from(node["symbols"])
        if kind == "array":
            return st.lists(values(node["items"]), max_size=MAX_TARGET_COMPONENTS)
        return leaves[kind]

    return values(schema)


def zigzag(n: int) -> bytes:
    """Avro's varint of ``n`` (zig-zag, 7 bits per byte); an ``n`` outside int64 is written as its
    raw magnitude, so tests can build over-long encodings the decoders must refuse."""
    z = (n << 1) ^ (n >> 63) if -(2**63) <= n < 2**63 else n
    out = bytearray()
    while z & ~0x7F:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)
