-- Wake-ups from whoever holds a due job's row without taking it (DECISIONS 63). A
-- statement that locks such a row (a waiter's flag, a dependency locked by an enqueue
-- or a retry) makes a claim meanwhile step past it (SKIP LOCKED): that claim comes
-- back empty, its producer sleeps until its next poll, and nothing else would wake
-- it. So the holder notifies the row's queue; the NOTIFY is sent at the holder's
-- commit, when the lock is gone (the race matrix's claim wake-up check:
-- tests/integration/test_race_matrix.py).
--
-- deadman.wake_if_due: the one definition of "a claim would take this row now"
-- (job_claim's state and run_at test) and of the wake-up it gets; queries.sql calls
-- it from job_wait_flag, job_deps_lock, job_retry and job_retry_dead_many.
CREATE FUNCTION deadman.wake_if_due(p_state text, p_run_at timestamptz, p_queue text)
RETURNS void
LANGUAGE sql VOLATILE AS $$
    SELECT pg_notify('deadman_jobs', p_queue)
    WHERE p_state IN ('queued', 'scheduled', 'retrying') AND p_run_at <= now();
$$;

-- deadman.reopen_downstream wakes the queues of the dependencies it locks: a retry
-- that reopens cascaded dependents locks their other dependencies FOR SHARE until it
-- commits. Otherwise the body is 0006's.
CREATE OR REPLACE FUNCTION deadman.reopen_downstream(root bigint) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    first  bigint[] := deadman.reopen_candidates(root);
    second bigint[];
BEGIN
    IF cardinality(first) = 0 THEN
        RETURN;
    END IF;
    PERFORM deadman.wake_if_due(u.state, u.run_at, u.queue)
    FROM deadman.jobs u
    WHERE u.id IN (SELECT d.depends_on FROM deadman.job_deps d
                   WHERE d.job_id = ANY(first))
      AND NOT u.id = ANY(first)
    ORDER BY u.id
    FOR SHARE OF u;
    second := deadman.reopen_candidates(root);
    UPDATE deadman.jobs j
    SET state = 'waiting',
        upstream_cancelled = false,
        finished_at = NULL,
        attempt = 0,
        rescues = 0,
        cancel_requested = false,
        result = NULL,
        pending_deps = (SELECT count(*) FROM deadman.job_deps d
                        JOIN deadman.jobs u ON u.id = d.depends_on
                        WHERE d.job_id = j.id AND u.state <> 'succeeded')
    WHERE j.id = ANY(first)
      AND j.id = ANY(second)
      AND j.state = 'cancelled' AND j.upstream_cancelled;
END
$$;
