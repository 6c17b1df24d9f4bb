-- deadman.job_start in PL/pgSQL (DECISIONS 61). It was a SQL function that cannot be
-- inlined (it updates), and Postgres 15 plans such a function's body again at every
-- call of the statement that calls it: every claim (job_claim, job_claim_keyed)
-- parsed and planned this UPDATE afresh. PL/pgSQL keeps the plan for the session.
-- Measured on one connection, a finish and a claim in one transaction (the
-- completer's refill), generic plans as a worker's sessions use them, alternating
-- the two definitions: Postgres CPU per cycle of one job 755-790 -> 640-695 us,
-- cycle 1.33-1.37 -> 1.19-1.27 ms; per job in cycles of 50: 50 -> 44-48 us.
-- A kept plan is only as good as the statistics it was made with: made on a table
-- analyzed empty, it was a sequential scan (a burn-down ran 8,084 jobs/s instead of
-- 11,643), which the worker's sessions now rule out (enable_seqscan=off, DECISIONS
-- 60). The same statement, the same rows returned, the same locks (its rows are the
-- ones the caller's candidates locked FOR UPDATE).
CREATE OR REPLACE FUNCTION deadman.job_start(
    p_ids bigint[], p_worker text, p_ttl_ms bigint, p_at timestamptz
) RETURNS SETOF deadman.jobs
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RETURN QUERY
    UPDATE deadman.jobs j
    SET state = 'running',
        attempt = j.attempt + 1,
        lease_token = nextval('deadman.lease_token_seq'),
        lease_worker = p_worker,
        lease_expires_at = p_at + p_ttl_ms * interval '1 millisecond',
        started_at = p_at
    WHERE j.id = ANY (p_ids)
    RETURNING j.*;
END
$$;
