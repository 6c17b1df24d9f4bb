-- What retrying a dead or cancelled job is, written once for both ways in (job_retry,
-- POST /jobs/{id}/retry, and job_retry_dead_many, the bulk dead-letter replay): back
-- to 'queued', due now, with a fresh set of attempts, or to 'waiting' while p_pending
-- of its dependencies have not succeeded. Its attempt history and last_error stay. A
-- start_by or deadline that has passed is cleared: retrying a job that expired must
-- run it, not expire it again at the rescuer's next look; one still ahead is kept.
-- The caller has locked its dependencies FOR SHARE, counted p_pending from their
-- latest committed states, and refused the job if one is dead or cancelled. No row:
-- the job is not dead or cancelled (the state test is rechecked under the row lock).
CREATE FUNCTION deadman.job_rerun(p_id bigint, p_pending bigint)
RETURNS SETOF deadman.jobs
LANGUAGE sql VOLATILE AS $$
    UPDATE deadman.jobs
    SET state = CASE WHEN p_pending > 0 THEN 'waiting' ELSE 'queued' END,
        pending_deps = p_pending, upstream_cancelled = false,
        attempt = 0, rescues = 0, run_at = now(), finished_at = NULL,
        cancel_requested = false, result = NULL,
        start_by = CASE WHEN start_by > now() THEN start_by END,
        deadline = CASE WHEN deadline > now() THEN deadline END
    WHERE id = p_id AND state IN ('dead', 'cancelled')
    RETURNING *
$$;
