"""JSON through orjson wherever it gives exactly what the ``json`` module gives
(DECISIONS 69): the worker decodes every claimed job's ``payload`` and ``backoff``
and encodes every finished batch, a few microseconds per job in ``json``.

orjson differs from ``json`` in three ways that would change data, each fenced off:

- **Decoding an integer outside 64 bits** gives a float (``2**64`` comes back as
  ``1.8446744073709552e19``): text with a run of 19 or more digits goes to ``json``.
  Such a run is the only way to write an integer outside [-2**63, 2**64).
- **Decoding a number beyond a double** (``1e400``, which jsonb can hold) raises:
  it goes to ``json`` (which gives ``inf``, as before).
- **Encoding**: an integer outside 64 bits or a non-string key raises (then ``json``
  encodes it); NaN and infinity become ``null`` silently, so :func:`dumps` is only
  for values already checked by :func:`deadman.storable.check_storable` (which
  refuses them) or built from ints and strings.

:data:`CONTEXT` carries the decoder for psycopg's ``json``/``jsonb`` loaders; the
pools and connections Deadman opens are made with it, never psycopg's global
adapters (an application's own connections keep ``json``).
"""

from __future__ import annotations

import json
import re
from typing import Any

import orjson
import psycopg
from psycopg.abc import Buffer
from psycopg.adapt import AdaptersMap, Loader
from psycopg.types.json import set_json_loads

#: the only way to write an integer outside 64 bits (or a long mantissa)
_LONG_DIGITS = re.compile(rb"\d{19}")
#: a text shorter than this cannot hold such a run
_SHORT = 19


def loads(data: bytes | bytearray | memoryview | str) -> Any:
    """``json.loads(data)``, by orjson unless the text could hold a number it reads
    differently (module docstring). A text too short to hold a run of 19 digits
    (``null``, ``{}``: most payloads and backoff policies a claim reads) goes to orjson
    as it is, without the copy and the search (DECISIONS 102)."""
    if len(data) < _SHORT:
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            pass  # a number beyond a double ("1e400"): as below
    raw = data.encode() if isinstance(data, str) else bytes(data)
    if _LONG_DIGITS.search(raw) is None:
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            pass  # a number beyond a double; json gives inf, or raises as it did
    return json.loads(raw)


def dumps(value: Any) -> str:
    """``json.dumps(value, ensure_ascii=False)``, by orjson when it can encode the value
    (separators differ; the JSON is the same). ``value`` must hold no NaN or infinity
    (module docstring)."""
    try:
        return orjson.dumps(value).decode()
    except TypeError:  # an integer outside 64 bits, a key that is not a string
        return json.dumps(value, ensure_ascii=False)


class _TextLoader(Loader):
    """json and jsonb in text format (how Deadman reads them): :func:`loads` called
    once per value. psycopg's own loader, even given ``loads``, adds a call and a copy
    of the value; a claimed job has two (its payload and its backoff policy), and
    reading them took 1.28 µs a job against 0.40 this way (DECISIONS 102)."""

    def load(self, data: Buffer) -> Any:
        return loads(data)


#: psycopg's adapters with this module's decoder for json and jsonb
CONTEXT = AdaptersMap(psycopg.adapters)
set_json_loads(loads, CONTEXT)  # the binary formats, through psycopg's loaders
CONTEXT.register_loader("json", _TextLoader)
CONTEXT.register_loader("jsonb", _TextLoader)
