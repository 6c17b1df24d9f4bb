-- Once a cancel is acknowledged, no new attempt starts (ARCHITECTURE.md, the job
-- lifecycle). cancel_requested is set only on a running job (job_cancel,
-- workflow_cancel); from there the job may only end: succeeded (the attempt in
-- flight won), or cancelled (every other outcome, job_finish_many; a lapsed lease,
-- job_rescue_expired). Before this migration an attempt that ended 'retrying' or was
-- released kept the flag and went back in line, and the job ran again after its
-- cancel's 202. The constraint makes that state impossible to write.
--
-- Rows already in it (written by an older worker) end as their cancel asked.
UPDATE deadman.jobs
SET state = 'cancelled',
    finished_at = now(),
    last_error = COALESCE(last_error || E'\n', '') || 'cancelled on request'
WHERE cancel_requested AND state NOT IN ('running', 'succeeded', 'dead', 'cancelled');

-- One scan of the table under ACCESS EXCLUSIVE (migrations run in one transaction
-- each, so NOT VALID + VALIDATE would not shorten the lock): claims wait for it.
ALTER TABLE deadman.jobs
    ADD CONSTRAINT jobs_cancel_requested_only_running_or_final
    CHECK (NOT cancel_requested OR state IN ('running', 'succeeded', 'dead', 'cancelled'));
