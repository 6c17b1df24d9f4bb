-- Statements the chaos harness and its handler run (not the verifier: see verify.sql).
-- Loaded with deadman.db.queries.parse, like the core's queries.sql.

-- name: invocation_record
-- One row per handler invocation, in autocommit, BEFORE the fenced transaction: it
-- survives the attempt's rollback, so duplicate executions can be counted.
INSERT INTO deadman.chaos_invocations (job_id, lease_token, worker)
VALUES (%(job_id)s, %(lease_token)s, %(worker)s);

-- name: database_is_empty
-- The verifier counts whole tables, so a run needs a database of its own.
SELECT NOT EXISTS (SELECT 1 FROM deadman.jobs)
   AND NOT EXISTS (SELECT 1 FROM deadman.effects)
   AND NOT EXISTS (SELECT 1 FROM deadman.chaos_invocations) AS empty;

-- name: progress
-- Sampled every tick: how far the run is, and how deep the queue is right now.
SELECT count(*) AS jobs,
       count(*) FILTER (WHERE state = 'succeeded') AS succeeded,
       count(*) FILTER (WHERE state NOT IN ('succeeded', 'dead', 'cancelled')) AS outstanding,
       count(*) FILTER (WHERE state IN ('queued', 'scheduled', 'retrying')) AS depth,
       count(*) FILTER (WHERE state = 'running') AS running
FROM deadman.jobs;

-- name: worker_backends
-- Server processes serving chaos workers (the harness sets application_name per slot).
SELECT pid, application_name
FROM pg_stat_activity
WHERE datname = current_database()
  AND application_name LIKE 'deadman-chaos-w%%'
  AND pid <> pg_backend_pid()
ORDER BY pid;

-- name: backend_terminate
SELECT pg_terminate_backend(%(pid)s) AS terminated;

-- name: leases_held
-- How many leases one worker process still holds in time, and how many of those its
-- handler has begun: recorded an invocation under that lease. A cut that meets only
-- leases not yet begun runs nothing twice (the handler cannot record while cut off,
-- and is abandoned once its lease is gone).
SELECT count(*) FILTER (WHERE j.lease_expires_at >= now()) AS live,
       count(*) FILTER (
           WHERE j.lease_expires_at >= now()
             AND EXISTS (SELECT 1 FROM deadman.chaos_invocations i
                         WHERE i.job_id = j.id AND i.lease_token = j.lease_token)
       ) AS begun
FROM deadman.jobs j
WHERE j.state = 'running' AND j.lease_worker = %(worker)s;

-- name: worker_id_of_pid
-- Worker ids are hostname:pid:suffix; find the one a process registered.
SELECT id FROM deadman.workers WHERE pid = %(pid)s ORDER BY started_at DESC LIMIT 1;

-- name: rescued_from
SELECT count(*) AS rescued FROM deadman.attempts
WHERE worker = %(worker)s AND outcome = 'lease_expired';

-- name: refused_of
SELECT count(*) AS refused FROM deadman.lease_refusals WHERE worker = %(worker)s;

-- name: workers_registered
-- How many of these worker processes have registered (sent their first heartbeat).
SELECT count(*) AS registered FROM deadman.workers WHERE pid = ANY(%(pids)s);

-- name: registered_pids
-- Which of these processes have registered: a kill only counts if it lands on a
-- worker that got as far as claiming (killing a process still importing proves nothing).
SELECT pid FROM deadman.workers WHERE pid = ANY(%(pids)s);

-- name: outstanding_sample
-- Diagnostics when a run does not drain: what the stuck jobs look like.
SELECT id, state, attempt, rescues, lease_token, lease_worker,
       round(extract(epoch FROM lease_expires_at - now())::numeric, 2) AS lease_left_s,
       round(extract(epoch FROM run_at - now())::numeric, 2) AS due_in_s,
       left(last_error, 300) AS last_error
FROM deadman.jobs
WHERE state NOT IN ('succeeded', 'dead', 'cancelled')
ORDER BY id
LIMIT 20;

-- name: backends_snapshot
-- Diagnostics: what every chaos process's server backend is doing right now.
SELECT pid, application_name, state, wait_event_type, wait_event,
       round(extract(epoch FROM now() - xact_start)::numeric, 2) AS xact_age_s,
       left(query, 120) AS query
FROM pg_stat_activity
WHERE datname = current_database() AND application_name LIKE 'deadman-chaos-%%'
ORDER BY xact_start NULLS LAST;

-- name: db_now
SELECT now() AS now;

-- name: heartbeats_since
-- How many of these worker processes sent a heartbeat after a moment (the restart).
SELECT count(*) AS beat FROM deadman.workers
WHERE pid = ANY(%(pids)s) AND last_heartbeat_at > %(since)s;

-- ===== The operators scenario (deadman/chaos/operators.py) =====

-- name: operators_instrument
-- Installed in the scenario's own database before the run. Retention deletes jobs
-- (their logged attempts go with them, ON DELETE CASCADE) and workflows: each deleted row
-- is first copied into chaos.pruned_<table>, as it was when deleted, so the verifier
-- can tell a job deleted after it finished from one deleted while it was queued or
-- running (what a prune racing a retry does), and still sees every attempt. An AFTER
-- DELETE row trigger sees the version the DELETE removed: the newest one, also when
-- the DELETE waited on a row lock. chaos.acks receives, at verification, every
-- operator action the harness saw acknowledged.
CREATE SCHEMA chaos;
CREATE TABLE chaos.pruned_jobs (LIKE deadman.jobs, deleted_at timestamptz NOT NULL);
CREATE TABLE chaos.pruned_attempt_log (LIKE deadman.attempt_log, deleted_at timestamptz NOT NULL);
CREATE TABLE chaos.pruned_workflows (LIKE deadman.workflows, deleted_at timestamptz NOT NULL);
CREATE INDEX ON chaos.pruned_jobs (id);
CREATE INDEX ON chaos.pruned_attempt_log (job_id);
-- A deleted job's attempts, as deadman.attempts shows a live one's: the logged ones,
-- and the succeeded one its row kept (migration 0019).
CREATE VIEW chaos.pruned_attempts AS
SELECT lease_token, job_id, attempt, worker, started_at, finished_at, outcome, error, deleted_at
FROM chaos.pruned_attempt_log
UNION ALL
SELECT finished_token, id, attempt, lease_worker, started_at, finished_at, 'succeeded', NULL,
       deleted_at
FROM chaos.pruned_jobs
WHERE finished_token IS NOT NULL;
CREATE FUNCTION chaos.keep_deleted() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('INSERT INTO chaos.%I SELECT ($1).*, clock_timestamp()',
                   'pruned_' || TG_TABLE_NAME)
    USING OLD;
    RETURN NULL;
END
$$;
CREATE TRIGGER chaos_keep_deleted AFTER DELETE ON deadman.jobs
    FOR EACH ROW EXECUTE FUNCTION chaos.keep_deleted();
CREATE TRIGGER chaos_keep_deleted AFTER DELETE ON deadman.attempt_log
    FOR EACH ROW EXECUTE FUNCTION chaos.keep_deleted();
CREATE TRIGGER chaos_keep_deleted AFTER DELETE ON deadman.workflows
    FOR EACH ROW EXECUTE FUNCTION chaos.keep_deleted();
-- seq: the order the harness sent the actions in (one operator, one at a time).
-- db_lo/db_hi: the database clock read just before the request and just after its
-- acknowledgement, so lo <= the action's commit <= hi; token_lo: the lease token
-- sequence's last value, read with db_lo (verify_ops.sql says why). acked = false:
-- a retry or resume that was refused or got no answer; one of those may have
-- committed, so it still ends a cancel's or a pause's window (never a false alarm),
-- but nobody was promised anything.
CREATE TABLE chaos.acks (
    seq       bigint PRIMARY KEY,
    kind      text   NOT NULL CHECK (kind IN ('cancel', 'retry', 'pause', 'resume')),
    acked     boolean NOT NULL,
    via       text   NOT NULL,
    job_id    bigint,
    queue     text,
    state     text,
    token     bigint,
    db_lo     timestamptz NOT NULL,
    token_lo  bigint NOT NULL,
    db_hi     timestamptz,
    at_s      double precision NOT NULL
);
CREATE INDEX ON chaos.acks (job_id, seq);

-- name: operators_acks_copy
-- The journal, at verification: the columns of verify_ops.Ack, in its field order.
COPY chaos.acks (seq, kind, acked, via, job_id, queue, state, token, db_lo, token_lo, db_hi,
                 at_s)
FROM STDIN;

-- name: operators_clock
-- Read just before and just after every operator action: the database clock, and the
-- last lease token handed out (a sequence's last_value is read outside any snapshot:
-- every claim that drew a token before this read drew one no larger). Before the first
-- claim, last_value is already the start value (1) with is_called false: no token was
-- handed out yet, so the answer is 0 (else the first claim, token 1, would look older
-- than an action taken before it).
SELECT now() AS now, CASE WHEN is_called THEN last_value ELSE 0 END AS token
FROM deadman.lease_token_seq;

-- name: operators_unfinished
-- The operators scenario drains until no job and no workflow is unfinished.
SELECT (SELECT count(*) FROM deadman.jobs
        WHERE state NOT IN ('succeeded', 'dead', 'cancelled')) AS jobs,
       (SELECT count(*) FROM deadman.workflows WHERE state = 'running') AS workflows,
       (SELECT count(*) FROM deadman.jobs WHERE state = 'running') AS running,
       (SELECT count(*) FROM deadman.jobs WHERE state = 'dead') AS dead;

-- name: operators_analyze
-- Fresh statistics before the verifier's joins (chaos.acks was loaded just now).
ANALYZE chaos.acks, chaos.pruned_jobs, chaos.pruned_attempt_log, chaos.pruned_workflows,
        deadman.jobs, deadman.attempts, deadman.effects, deadman.chaos_invocations;

-- name: handoffs_due
-- The handoffs scenario's trickle pauses until no job is due: an enqueue hands nothing
-- off behind an older due job (job_insert_handoff).
SELECT COALESCE(sum(due), 0)::bigint AS due FROM deadman.queue_summary;
