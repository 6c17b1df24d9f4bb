"""Every bound on what a client may submit, written once. The spec models (deadman.spec),
the OpenAPI document, the settings and the store all read them from here."""

from __future__ import annotations

import re

#: job types, queue names, node names (and limit keys): 1-128 of [A-Za-z0-9_.:-]
NAME_PATTERN = "^[A-Za-z0-9_.:-]{1,128}$"
NAME_RE = re.compile(NAME_PATTERN)
NAME_RULE = "must be 1-128 characters of A-Z a-z 0-9 _ . : -"
#: idempotency keys in a body (the header has its own, stricter form)
KEY_MAX_LEN = 255
KEY_PATTERN = "^[^\\u0000-\\u001f\\u007f]{1,255}$"
KEY_RULE = "must be 1-255 characters, without control characters"
#: a workflow's name: free text, without control characters
WORKFLOW_NAME_PATTERN = "^[^\\u0000-\\u001f\\u007f]{1,128}$"
WORKFLOW_NAME_RULE = "must be 1-128 characters, without control characters"
MAX_BIGINT = 2**63 - 1


def decimal_pattern(limit: int) -> str:
    """A regular expression (JSON Schema's dialect and Python's alike) that matches
    exactly the decimals 1..limit written without a leading zero. Spelled out digit by
    digit, so that what the OpenAPI document allows is what the server accepts: with
    a plain ``[1-9][0-9]{0,18}``, a schema-valid id past bigint was refused. A
    capturing group, not ``(?:...)``: with the latter, schemathesis's stateful run
    (tests/integration/test_api_schemathesis.py) stopped following the document's
    links to real ids (seen, not explained)."""
    top = str(limit)
    width = len(top)
    alternatives = [f"[1-9][0-9]{{0,{width - 2}}}"] if width > 1 else []
    for at, digit in enumerate(top):
        lowest = 1 if at == 0 else 0
        if int(digit) > lowest:
            rest = width - at - 1
            tail = f"[0-9]{{{rest}}}" if rest else ""
            alternatives.append(f"{top[:at]}[{lowest}-{int(digit) - 1}]{tail}")
    alternatives.append(top)
    return "^(" + "|".join(alternatives) + ")$"


#: ids as this API writes them: 1..bigint in ASCII digits, no leading zero
ID_PATTERN = decimal_pattern(MAX_BIGINT)

PRIORITY_MIN, PRIORITY_MAX = -100, 100
#: one bound for every way in (HTTP, Client, CLI, DEADMAN_MAX_ATTEMPTS)
MAX_ATTEMPTS_MIN, MAX_ATTEMPTS_MAX = 1, 100
MAX_DELAY_MS = 10 * 365 * 24 * 3600 * 1000
MAX_TIMEOUT_MS = 2**31 - 1  # the column is an integer
MAX_BACKOFF_MS = 86_400_000
MAX_DEPENDS_ON = 100
MAX_BATCH = 1000
MAX_NODES = 1000
MAX_EDGES = 10_000

#: flow control (deadman.spec.limits): a limit per key
LIMIT_CONCURRENCY_MAX = 100_000
RATE_COUNT_MAX = 1_000_000
RATE_PER_MS_MAX = 86_400_000
LIMITS_LISTED_MAX = 1000

#: schedules (deadman.spec.schedules): an interval's bounds, a cron expression's length
EVERY_MS_MIN, EVERY_MS_MAX = 100, 31 * 86_400_000
CRON_MAX_LEN = 256
TIMEZONE_MAX_LEN = 64
SCHEDULES_LISTED_MAX = 1000

#: jobs one page of a job listing filtered by queue or type looks through when it can
#: reach succeeded jobs (no index holds those by queue or type: migration 0020); a
#: page that found fewer jobs than it asked for in them still has a cursor onward
#: (deadman.store.reads.job_page).
LIST_WINDOW = 50_000

#: GET /jobs/{id}?wait_ms=N: the longest long-poll, in milliseconds (SQS caps its long
#: poll at 20 s too: under the idle timeouts of common proxies and load balancers)
WAIT_MS_MAX = 20_000
