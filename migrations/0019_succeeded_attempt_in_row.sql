-- A job's succeeded attempt is kept in its own row, not in a row of its own (issue 16;
-- DECISIONS 76). Every finish inserted an attempt row: a heap tuple, two index
-- entries and a foreign-key check, about a fifth of what Postgres spends per job, for
-- the attempt that is, for nearly every job, its only one. A succeeded job is final
-- (nothing moves a job out of 'succeeded'), and its row already holds what the attempt
-- row held: the attempt number, the worker (lease_worker), started_at and
-- finished_at. Only the fencing token is lost at the finish (lease_token must be NULL
-- off 'running'): `finished_token` keeps it.
--
-- The table of ended attempts is now deadman.attempt_log (every other outcome:
-- failed, timed_out, cancelled, released, lease_expired; and the succeeded attempts
-- written before this migration). deadman.attempts, which every reader uses, is a view
-- of both: the whole history, as before.
ALTER TABLE deadman.attempts RENAME TO attempt_log;
ALTER INDEX deadman.attempts_pkey RENAME TO attempt_log_pkey;
ALTER INDEX deadman.attempts_job_idx RENAME TO attempt_log_job_idx;
ALTER TABLE deadman.attempt_log RENAME CONSTRAINT attempts_job_id_fkey TO attempt_log_job_id_fkey;
ALTER TABLE deadman.attempt_log
    RENAME CONSTRAINT attempts_outcome_valid TO attempt_log_outcome_valid;
ALTER TABLE deadman.jobs ADD COLUMN finished_token bigint;

CREATE VIEW deadman.attempts AS
SELECT lease_token, job_id, attempt, worker, started_at, finished_at, outcome, error
FROM deadman.attempt_log
UNION ALL
SELECT finished_token, id, attempt, lease_worker, started_at, finished_at,
       'succeeded'::text, NULL::text
FROM deadman.jobs
WHERE finished_token IS NOT NULL;

GRANT SELECT ON deadman.attempts TO deadman_api;
