"""deadman.db.jsoncodec gives what the json module gives, for every JSON value:
orjson where it is exact, json where it is not."""

from __future__ import annotations

import json
import math
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from psycopg.pq import Format

from deadman.db import jsoncodec

#: integers far past 64 bits both ways, floats of every kind but NaN and infinity
#: (which the codec's dumps is never given: check_storable refuses them)
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.sampled_from([2**63 - 1, 2**63, 2**64 - 1, 2**64, -(2**63), -(2**63) - 1])
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


def same(a: Any, b: Any) -> bool:
    """Equal, and of the same types all the way down (1 == 1.0 would hide a float)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b) or (isinstance(a, float) and math.isnan(a) and math.isnan(b))


@given(VALUES)
def test_loads_reads_what_json_reads(value: Any) -> None:
    text = json.dumps(value)
    assert same(jsoncodec.loads(text.encode()), json.loads(text))
    assert same(jsoncodec.loads(memoryview(text.encode())), json.loads(text))
    assert same(jsoncodec.loads(text), json.loads(text))


@given(VALUES)
def test_dumps_writes_what_json_reads_back(value: Any) -> None:
    assert same(json.loads(jsoncodec.dumps(value)), value)


def test_numbers_orjson_alone_reads_differently() -> None:
    for text in ["18446744073709551616", "-9223372036854775809", "1" * 40, "1e400", "-1e400"]:
        assert same(jsoncodec.loads(text.encode()), json.loads(text)), text


def test_what_orjson_cannot_encode_goes_to_json() -> None:
    assert jsoncodec.dumps({"n": 2**70}) == '{"n": 1180591620717411303424}'
    assert json.loads(jsoncodec.dumps({1: "a"})) == {"1": "a"}  # json's key coercion


def test_invalid_json_is_refused_as_json_refuses_it() -> None:
    for text in [b"", b"{", b"[1,]", b"nul"]:
        try:
            jsoncodec.loads(text)
        except ValueError:
            continue
        raise AssertionError(f"{text!r} was accepted")


@given(VALUES)
def test_the_text_loaders_read_what_json_reads(value: Any) -> None:
    """json and jsonb in text format load through one call to loads (DECISIONS 102),
    short texts included, as bytes or as a memoryview, whatever psycopg hands over."""
    text = json.dumps(value)
    for name in ("json", "jsonb"):
        oid = jsoncodec.CONTEXT.types[name].oid
        cls = jsoncodec.CONTEXT.get_loader(oid, Format.TEXT)
        assert cls is not None
        loader = cls(oid, jsoncodec.CONTEXT)
        assert same(loader.load(text.encode()), json.loads(text))
        assert same(loader.load(memoryview(text.encode())), json.loads(text))


def test_short_texts_orjson_alone_reads_differently_go_to_json() -> None:
    """The short path (under 19 bytes) still hands a number beyond a double to json."""
    for text in ["1e400", "-1e400", "[1e999]", '{"a":1e309}', "1" * 18, "-" + "9" * 17]:
        assert len(text) < 19
        assert same(jsoncodec.loads(text.encode()), json.loads(text)), text
        assert same(jsoncodec.loads(memoryview(text.encode())), json.loads(text)), text
