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
-- Leases one worker process holds, and how many of them it still holds in time.
SELECT count(*) AS held,
       count(*) FILTER (WHERE lease_expires_at >= now()) AS live
FROM deadman.jobs
WHERE state = 'running' AND lease_worker = %(worker)s;

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
