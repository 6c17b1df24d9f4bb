-- Handoff at enqueue (DECISIONS 83). A worker whose queues ran dry parks a few of its
-- free slots here, one row each; an enqueue that finds a parked slot of its queue (and
-- nothing older due in that queue) inserts its job already running under that
-- worker's lease, writes the job into the slot's row and NOTIFYs the worker on its own
-- channel. The worker then takes the row (job_adopt) and runs the job: no claim round
-- trip and no claim commit between the enqueue and the handler.
--
-- UNLOGGED: a park or an unpark commits without a WAL flush, and a crash of Postgres
-- empties the table (no handoff then goes to a worker that may not exist any more; a
-- job handed off just before the crash is still running under its lease in
-- deadman.jobs, which lapses and the rescuer hands it on).
CREATE UNLOGGED TABLE deadman.parked (
    worker      text        NOT NULL,
    slot        integer     NOT NULL,
    -- the queues this slot takes jobs of (the worker's queues)
    queues      text[]      NOT NULL,
    -- where the enqueue sends the job's id: the worker LISTENs on it
    channel     text        NOT NULL CHECK (length(channel) BETWEEN 1 AND 63),
    ttl_ms      integer     NOT NULL CHECK (ttl_ms > 0),
    -- a worker that stops renewing (its heartbeat) stops getting jobs after this
    expires_at  timestamptz NOT NULL,
    -- the job handed off into this slot, and its lease token; NULL: still free
    job_id      bigint,
    lease_token bigint,
    PRIMARY KEY (worker, slot)
);

-- job_insert reads (and may lock) this table for every role that enqueues. deadman_api
-- may not mint lease tokens (tests/integration/test_api_role.py), so it never hands
-- off: job_insert checks has_sequence_privilege first, and its jobs are queued.
GRANT SELECT, UPDATE ON deadman.parked TO deadman_api;
