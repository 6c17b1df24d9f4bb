"""What a handoff's notification says (DECISIONS 86), parsed strictly: anyone who can
connect may send anything on a worker's channel.

An enqueue that hands its job to a parked slot (``job_insert_handoff``) sends
``<job id> <the slot's nonce> <the job's row as JSON>``, or ``<job id>`` alone when
the slot's row has no nonce or the whole would not fit a notification (8,000 bytes).
A payload that does not start with a job id means nothing; one that does names a job,
and whatever follows it is only a claim: :mod:`deadman.worker.parking` believes the
row only with a nonce it wrote and has not seen used, and reads anything else from
the table (``job_adopt``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from deadman.db import jsoncodec
from deadman.model import Job, reader_for
from deadman.worker.listener import parse_job_id

#: deadman.jobs' timestamptz columns a Job reads (JSON has them as ISO 8601 text)
_TIMES = ("run_at", "created_at", "started_at", "finished_at", "lease_expires_at",
          "start_by", "deadline")  # fmt: skip


@dataclass(frozen=True, slots=True)
class Note:
    job_id: int
    #: None: the id alone (or what followed it was not a nonce and a row)
    nonce: int | None = None
    #: the job's row as JSON text, not parsed yet (only a trusted one is)
    row: str | None = None


def parse_note(payload: str) -> Note | None:
    """The note in a payload on a worker's handoff channel; None if it names no job."""
    head, _, rest = payload.partition(" ")
    job_id = parse_job_id(head)
    if job_id is None:
        return None
    text, _, row = rest.partition(" ")
    nonce = parse_job_id(text)  # a nonce is written as a job id is: a bigint's digits
    if nonce is None or not row.startswith("{"):
        return Note(job_id)
    return Note(job_id, nonce, row)


def job_from_row(row: str) -> Job:
    """The job a ``row_to_json`` of a deadman.jobs row describes, read as a claim reads
    its rows (jsonb columns through the same decoder, timestamps as Postgres wrote them).
    Raises (ValueError, KeyError, TypeError...) on anything else."""
    data = jsoncodec.loads(row)
    if not isinstance(data, dict):
        raise TypeError(f"a job row is a JSON object, not {type(data).__name__}")
    for name in _TIMES:
        value = data.get(name)
        if value is not None:
            if not isinstance(value, str):
                raise TypeError(f"{name} is not a timestamp: {value!r}")
            data[name] = datetime.fromisoformat(value)
    return reader_for(tuple(data))(tuple(data.values()))
