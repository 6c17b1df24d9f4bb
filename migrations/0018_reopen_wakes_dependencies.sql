-- deadman.reopen_downstream wakes the queues of the dependencies it locks. A retry
-- that reopens cascaded dependents locks their other dependencies FOR SHARE until
-- the retry commits, and a claim meanwhile steps past such a one when it is due (SKIP
-- LOCKED): that claim comes back empty, its producer sleeps until its next poll, and
-- nothing else would wake it. So a due dependency's queue is notified; the NOTIFY is
-- sent at the commit, when the lock is gone (the race matrix's claim wake-up check:
-- tests/integration/test_race_matrix.py). Otherwise the body is 0006's.
CREATE OR REPLACE FUNCTION deadman.reopen_downstream(root bigint) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    first  bigint[] := deadman.reopen_candidates(root);
    second bigint[];
BEGIN
    IF cardinality(first) = 0 THEN
        RETURN;
    END IF;
    PERFORM CASE WHEN u.state IN ('queued', 'scheduled', 'retrying') AND u.run_at <= now()
                 THEN pg_notify('deadman_jobs', u.queue) END
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
