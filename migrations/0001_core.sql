-- Deadman core schema: jobs, attempt history, queues, workers, effects.
-- Everything lives in schema "deadman". Invariants Postgres can hold are constraints.

CREATE SEQUENCE deadman.lease_token_seq AS bigint;

CREATE TABLE deadman.jobs (
    id                bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    type              text        NOT NULL,
    queue             text        NOT NULL DEFAULT 'default',
    priority          integer     NOT NULL DEFAULT 0,
    payload           jsonb,
    state             text        NOT NULL DEFAULT 'queued',
    attempt           integer     NOT NULL DEFAULT 0,
    max_attempts      integer     NOT NULL DEFAULT 5,
    rescues           integer     NOT NULL DEFAULT 0,
    backoff           jsonb       NOT NULL DEFAULT '{}'::jsonb,
    timeout_ms        integer,
    run_at            timestamptz NOT NULL DEFAULT now(),
    created_at        timestamptz NOT NULL DEFAULT now(),
    started_at        timestamptz,
    finished_at       timestamptz,
    idempotency_key   text,
    request_hash      text,
    -- The lease. lease_token is the fencing token: new on every claim, from one
    -- global sequence; every write a worker makes is guarded by it.
    lease_token       bigint,
    lease_worker      text,
    lease_expires_at  timestamptz,
    cancel_requested  boolean     NOT NULL DEFAULT false,
    last_error        text,
    result            jsonb,

    CONSTRAINT jobs_state_valid CHECK (state IN
        ('waiting', 'scheduled', 'queued', 'running', 'retrying', 'succeeded', 'dead', 'cancelled')),
    -- Written as `+` plus a length check: the bounded form {1,128} compiles to a large
    -- automaton and costs ~20 us per row on every INSERT and UPDATE.
    CONSTRAINT jobs_type_valid
        CHECK (length(type) BETWEEN 1 AND 128 AND type ~ '^[A-Za-z0-9_.:-]+$'),
    CONSTRAINT jobs_queue_valid
        CHECK (length(queue) BETWEEN 1 AND 128 AND queue ~ '^[A-Za-z0-9_.:-]+$'),
    CONSTRAINT jobs_priority_range CHECK (priority BETWEEN -100 AND 100),
    CONSTRAINT jobs_max_attempts_range CHECK (max_attempts BETWEEN 1 AND 1000),
    CONSTRAINT jobs_attempt_range CHECK (attempt BETWEEN 0 AND max_attempts),
    CONSTRAINT jobs_rescues_nonnegative CHECK (rescues >= 0),
    CONSTRAINT jobs_timeout_positive CHECK (timeout_ms IS NULL OR timeout_ms > 0),
    CONSTRAINT jobs_idempotency_key_length
        CHECK (idempotency_key IS NULL OR length(idempotency_key) BETWEEN 1 AND 255),
    -- A job is running exactly when it holds a lease.
    CONSTRAINT jobs_lease_iff_running CHECK ((state = 'running') = (lease_token IS NOT NULL)),
    CONSTRAINT jobs_lease_expiry_iff_running
        CHECK ((state = 'running') = (lease_expires_at IS NOT NULL)),
    -- A job has finished exactly when it is in a terminal state.
    CONSTRAINT jobs_finished_iff_terminal
        CHECK ((state IN ('succeeded', 'dead', 'cancelled')) = (finished_at IS NOT NULL))
) WITH (
    -- A hot queue table: leave room on each page so lease renewals stay HOT updates,
    -- and vacuum early and often instead of letting dead tuples pile up.
    fillfactor = 80,
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_vacuum_cost_delay = 0
);

-- One job per idempotency key, for as long as the job row lives.
CREATE UNIQUE INDEX jobs_idempotency_key_uq ON deadman.jobs (idempotency_key)
    WHERE idempotency_key IS NOT NULL;

-- The claim: exactly the claim query's predicate and ORDER BY, one queue at a time.
CREATE INDEX jobs_claim_idx ON deadman.jobs (queue, priority DESC, run_at, id)
    WHERE state IN ('queued', 'scheduled', 'retrying');

-- Rescued jobs waiting to run again; quarantined suspects are found here.
CREATE INDEX jobs_quarantine_idx ON deadman.jobs (queue, run_at, id)
    WHERE state IN ('queued', 'scheduled', 'retrying') AND rescues > 0;

-- The rescue and the heartbeat's worker view: only running jobs, a small set.
-- lease_expires_at is deliberately NOT indexed: renewals then stay HOT updates.
CREATE INDEX jobs_running_idx ON deadman.jobs (lease_worker)
    WHERE state = 'running';

-- Retention pruning of finished jobs.
CREATE INDEX jobs_finished_idx ON deadman.jobs (finished_at)
    WHERE state IN ('succeeded', 'dead', 'cancelled');

-- One row per attempt, written when the attempt ends (a running attempt is visible
-- on the job row itself). Keyed by the fencing token: one claim, one row.
CREATE TABLE deadman.attempts (
    lease_token  bigint PRIMARY KEY,
    job_id       bigint      NOT NULL REFERENCES deadman.jobs (id) ON DELETE CASCADE,
    attempt      integer     NOT NULL,
    worker       text        NOT NULL,
    started_at   timestamptz NOT NULL,
    finished_at  timestamptz NOT NULL DEFAULT now(),
    outcome      text        NOT NULL,
    error        text,
    CONSTRAINT attempts_outcome_valid CHECK (outcome IN
        ('succeeded', 'failed', 'lease_expired', 'released', 'cancelled', 'timed_out'))
);
CREATE INDEX attempts_job_idx ON deadman.attempts (job_id, lease_token);

-- Queues exist implicitly (any name a job uses); a row here only carries settings.
CREATE TABLE deadman.queues (
    name        text PRIMARY KEY
                CHECK (length(name) BETWEEN 1 AND 128 AND name ~ '^[A-Za-z0-9_.:-]+$'),
    paused      boolean     NOT NULL DEFAULT false,
    updated_at  timestamptz NOT NULL DEFAULT now()
);

-- Live worker processes; last_heartbeat_at is renewed by the same statement that
-- renews the worker's leases.
CREATE TABLE deadman.workers (
    id                 text PRIMARY KEY,
    hostname           text        NOT NULL,
    pid                integer     NOT NULL,
    queues             text[]      NOT NULL,
    concurrency        integer     NOT NULL,
    started_at         timestamptz NOT NULL DEFAULT now(),
    last_heartbeat_at  timestamptz NOT NULL DEFAULT now()
);

-- Side effects of the built-in side-effect handler. Deliberately NO unique
-- constraint on job_id: counting rows per job is then a real exactly-once check.
CREATE TABLE deadman.effects (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id       bigint      NOT NULL,
    lease_token  bigint      NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX effects_job_idx ON deadman.effects (job_id);

-- Wake idle workers: one notification per queue per inserting transaction
-- (Postgres folds identical notifications within a transaction). Statement-level,
-- so COPY and multi-row inserts pay once; it also covers transactional enqueue.
CREATE FUNCTION deadman.notify_jobs_inserted() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('deadman_jobs', q.queue)
    FROM (SELECT DISTINCT queue FROM inserted
          WHERE state IN ('queued', 'scheduled', 'retrying')) AS q;
    RETURN NULL;
END
$$;

CREATE TRIGGER jobs_notify_inserted
    AFTER INSERT ON deadman.jobs
    REFERENCING NEW TABLE AS inserted
    FOR EACH STATEMENT EXECUTE FUNCTION deadman.notify_jobs_inserted();

-- Every fenced write that the database refused (a zombie worker writing about a job
-- it no longer holds). Written in autocommit after the refusal, so the evidence
-- survives the rolled-back transaction.
CREATE TABLE deadman.lease_refusals (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id       bigint      NOT NULL,
    lease_token  bigint      NOT NULL,
    worker       text        NOT NULL,
    action       text        NOT NULL,
    refused_at   timestamptz NOT NULL DEFAULT now()
);
