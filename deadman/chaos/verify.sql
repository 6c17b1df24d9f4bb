-- The chaos verifier: plain SQL, run after the fleet has drained. Paste any of these
-- into psql against a chaos database (`deadman chaos --keep` prints its URL); the
-- two parameters are the key prefix and the number of acknowledged submissions,
-- e.g. replace %(prefix)s with 'chaos-1-' and %(acked)s with 100000.

-- name: submissions
-- Acknowledged submissions = jobs in the database, one job per idempotency key.
-- Keys are <prefix><n> for n in 0..acked-1 (batches are acknowledged in order).
SELECT (SELECT count(*) FROM deadman.jobs) AS jobs,
       (SELECT count(DISTINCT idempotency_key) FROM deadman.jobs) AS distinct_keys,
       (SELECT count(*) FROM deadman.jobs WHERE idempotency_key IS NULL) AS jobs_without_key,
       (SELECT count(*) FROM generate_series(0, %(acked)s::bigint - 1) AS n
        WHERE NOT EXISTS (SELECT 1 FROM deadman.jobs j
                          WHERE j.idempotency_key = %(prefix)s || n)) AS acknowledged_missing;

-- name: states
-- Every job succeeded; none outstanding, none dead or cancelled.
SELECT count(*) FILTER (WHERE state = 'succeeded') AS succeeded,
       count(*) FILTER (WHERE state NOT IN ('succeeded', 'dead', 'cancelled')) AS outstanding,
       count(*) FILTER (WHERE state = 'dead') AS dead,
       count(*) FILTER (WHERE state = 'cancelled') AS cancelled
FROM deadman.jobs;

-- name: effects
-- deadman.effects has no unique constraint, so counting rows per job is a real
-- exactly-once check: none missing, none doubled, none for a job that does not exist.
WITH per_job AS (
    SELECT j.id, count(e.id) AS n
    FROM deadman.jobs j LEFT JOIN deadman.effects e ON e.job_id = j.id
    GROUP BY j.id
)
SELECT count(*) FILTER (WHERE n = 1) AS exactly_once,
       count(*) FILTER (WHERE n = 0) AS missing,
       count(*) FILTER (WHERE n > 1) AS doubled_jobs,
       COALESCE(sum(n - 1) FILTER (WHERE n > 1), 0) AS extra_rows,
       (SELECT count(*) FROM deadman.effects) AS effect_rows,
       (SELECT count(*) FROM deadman.effects e
        WHERE NOT EXISTS (SELECT 1 FROM deadman.jobs j WHERE j.id = e.job_id)) AS orphaned
FROM per_job;

-- name: effects_fenced
-- Every effect was written under the lease token of the attempt that succeeded:
-- an effect from any other attempt escaped its fence.
SELECT count(*) AS outside_fence
FROM deadman.effects e
WHERE NOT EXISTS (SELECT 1 FROM deadman.attempts a
                  WHERE a.lease_token = e.lease_token AND a.job_id = e.job_id
                    AND a.outcome = 'succeeded');

-- name: invocations
-- Handler invocations, logged in autocommit before the fenced transaction. Jobs run
-- more than once are the duplicate executions at-least-once delivery allows; in a
-- run with faults there must be some, or the faults never hit a running job.
WITH per_job AS (
    SELECT job_id, count(*) AS n FROM deadman.chaos_invocations GROUP BY job_id
)
SELECT COALESCE(sum(n), 0) AS invocations,
       count(*) AS jobs_invoked,
       count(*) FILTER (WHERE n > 1) AS jobs_run_more_than_once,
       COALESCE(sum(n - 1), 0) AS duplicate_invocations,
       COALESCE(max(n), 0) AS most_runs_of_one_job,
       (SELECT count(*) FROM deadman.jobs j WHERE j.state = 'succeeded'
          AND NOT EXISTS (SELECT 1 FROM deadman.chaos_invocations i WHERE i.job_id = j.id))
         AS succeeded_never_invoked
FROM per_job;

-- name: refusals
-- Fenced writes the database refused (zombie and partitioned workers writing late),
-- and leases a late worker gave up on its own before writing ('abandoned').
SELECT count(*) AS refused,
       count(*) FILTER (WHERE action = 'abandoned') AS abandoned,
       count(*) FILTER (WHERE action = 'transaction') AS in_transaction,
       count(*) FILTER (WHERE action = 'finish') AS finish,
       count(*) FILTER (WHERE action = 'heartbeat') AS heartbeat,
       count(DISTINCT worker) AS workers
FROM deadman.lease_refusals;

-- name: attempts
-- How attempts ended; lease_expired rows are rescues.
SELECT count(*) FILTER (WHERE outcome = 'lease_expired') AS rescues,
       count(DISTINCT job_id) FILTER (WHERE outcome = 'lease_expired') AS jobs_rescued,
       count(*) FILTER (WHERE outcome = 'succeeded') AS succeeded,
       count(*) FILTER (WHERE outcome = 'failed') AS failed,
       count(*) FILTER (WHERE outcome = 'released') AS released,
       (SELECT count(*) FROM (SELECT job_id FROM deadman.attempts WHERE outcome = 'succeeded'
                              GROUP BY job_id HAVING count(*) > 1) AS s) AS succeeded_twice
FROM deadman.attempts;

-- name: vacuums
-- How often deadman.jobs was vacuumed during the run: by the workers' vacuumer
-- (DECISIONS 72; the count covers manual vacuums, and a run makes no other) and by
-- autovacuum. A figure, not a check: the server's statistics, reset with the cluster.
SELECT vacuum_count AS vacuumer, autovacuum_count AS autovacuum
FROM pg_stat_user_tables WHERE relid = 'deadman.jobs'::regclass;
