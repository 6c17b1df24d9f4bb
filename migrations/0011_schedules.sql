-- Schedules (cron): each tick of a schedule enqueues one job, with the idempotency key
-- schedule:<name>:<tick>; the scheduler (a maintenance service) fires due ticks under
-- the schedule's row lock and moves next_fire_at on in the same transaction.
-- DECISIONS 39 says how a tick is enqueued exactly once across a fleet.

CREATE TABLE deadman.schedules (
    name          text        PRIMARY KEY,
    cron          text,
    every_ms      bigint,
    timezone      text        NOT NULL DEFAULT 'UTC',
    job           jsonb       NOT NULL,
    catch_up      text        NOT NULL DEFAULT 'latest',
    paused        boolean     NOT NULL DEFAULT false,
    next_fire_at  timestamptz NOT NULL,
    last_fire_at  timestamptz,
    last_job_id   bigint,
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT schedules_name_valid
        CHECK (length(name) BETWEEN 1 AND 128 AND name ~ '^[A-Za-z0-9_.:-]+$'),
    CONSTRAINT schedules_one_rule CHECK ((cron IS NULL) <> (every_ms IS NULL)),
    CONSTRAINT schedules_every_range CHECK (every_ms IS NULL OR every_ms BETWEEN 100 AND 2678400000),
    CONSTRAINT schedules_cron_length CHECK (cron IS NULL OR length(cron) BETWEEN 1 AND 256),
    CONSTRAINT schedules_catch_up_valid CHECK (catch_up IN ('none', 'latest'))
);

-- The scheduler's question: which schedules are due.
CREATE INDEX schedules_due_idx ON deadman.schedules (next_fire_at) WHERE NOT paused;

GRANT SELECT, INSERT, UPDATE, DELETE ON deadman.schedules TO deadman_api;
