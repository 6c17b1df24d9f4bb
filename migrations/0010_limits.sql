-- Flow control: a job may carry a limit key; a key may have a limit (concurrency
-- across the fleet, and a rate of starts). DECISIONS 38 says why this design cannot
-- exceed a limit.

ALTER TABLE deadman.jobs ADD COLUMN limit_key text;
ALTER TABLE deadman.jobs ADD CONSTRAINT jobs_limit_key_valid
    CHECK (limit_key IS NULL
           OR (length(limit_key) BETWEEN 1 AND 128 AND limit_key ~ '^[A-Za-z0-9_.:-]+$'));

-- The unkeyed claim walks only unkeyed jobs: keyed jobs waiting for their limit sit
-- under the other branch of this index, never in front of unkeyed ones (no
-- head-of-line blocking). Same key columns and size as before for unkeyed work.
DROP INDEX deadman.jobs_claim_idx;
CREATE INDEX jobs_claim_idx ON deadman.jobs (queue, (limit_key IS NULL), priority DESC, run_at, id)
    WHERE state IN ('queued', 'scheduled', 'retrying');

-- The keyed claim: due jobs of one queue by key (a skip scan finds the keys), and
-- within a key in claim order. Holds keyed rows only.
CREATE INDEX jobs_claim_keyed_idx ON deadman.jobs (queue, limit_key, priority DESC, run_at, id)
    WHERE state IN ('queued', 'scheduled', 'retrying') AND limit_key IS NOT NULL;

-- Running jobs per key: the slots a key's jobs hold now. A slot is a running job,
-- so it is held exactly as long as its lease: freed by the finish, by the rescue of
-- a lapsed lease, by a release; never by a counter that could drift.
CREATE INDEX jobs_keyed_running_idx ON deadman.jobs (limit_key)
    WHERE state = 'running' AND limit_key IS NOT NULL;

CREATE TABLE deadman.limits (
    key          text        PRIMARY KEY,
    concurrency  integer,
    rate_count   integer,
    rate_per_ms  integer,
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT limits_key_valid
        CHECK (length(key) BETWEEN 1 AND 128 AND key ~ '^[A-Za-z0-9_.:-]+$'),
    CONSTRAINT limits_concurrency_range
        CHECK (concurrency IS NULL OR concurrency BETWEEN 1 AND 100000),
    CONSTRAINT limits_rate_whole CHECK ((rate_count IS NULL) = (rate_per_ms IS NULL)),
    CONSTRAINT limits_rate_count_range CHECK (rate_count IS NULL OR rate_count BETWEEN 1 AND 1000000),
    CONSTRAINT limits_rate_per_range CHECK (rate_per_ms IS NULL OR rate_per_ms BETWEEN 1 AND 86400000),
    CONSTRAINT limits_something CHECK (concurrency IS NOT NULL OR rate_count IS NOT NULL)
);

-- The starts of a rate-limited key within its window (and a minute more): a sliding
-- log, so that no window of rate_per_ms holds more than rate_count starts. Written
-- by the keyed claim under the limit's row lock; pruned by it.
CREATE TABLE deadman.limit_starts (
    key  text        NOT NULL REFERENCES deadman.limits (key) ON DELETE CASCADE,
    at   timestamptz NOT NULL
);
CREATE INDEX limit_starts_key_at_idx ON deadman.limit_starts (key, at);

-- A limit's live state: the slots its key's jobs hold now, and the starts its rate
-- still allows now (NULL without a rate). The claim decides with the same two.
CREATE FUNCTION deadman.limit_running(p_key text) RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT count(*) FROM deadman.jobs WHERE limit_key = p_key AND state = 'running'
$$;

-- The starts the rate allows at p_at: its count less the starts in the window that
-- ends at p_at, (p_at - per_ms, p_at]. Starts are stamped by the claim with the
-- clock read inside the claim that takes them, after its snapshot: they grow in lock order.
CREATE FUNCTION deadman.limit_available(
    p_key text, p_count integer, p_per_ms integer, p_at timestamptz
) RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN p_count IS NULL THEN NULL ELSE GREATEST(0, p_count - (
        SELECT count(*) FROM deadman.limit_starts
        WHERE key = p_key AND at > p_at - p_per_ms::bigint * interval '1 millisecond'))
    END
$$;

CREATE VIEW deadman.limit_state AS
SELECT key, concurrency, rate_count, rate_per_ms,
       deadman.limit_running(key) AS running,
       deadman.limit_available(key, rate_count, rate_per_ms, clock_timestamp()) AS available
FROM deadman.limits;

-- What claiming a job is, written once for every claim (job_claim,
-- job_claim_quarantined, job_claim_keyed): a running attempt under a new fencing
-- token, leased to p_worker until p_at + p_ttl_ms. The caller has locked the rows
-- (FOR UPDATE SKIP LOCKED) and checked they are due; p_at is its clock.
CREATE FUNCTION deadman.job_start(
    p_ids bigint[], p_worker text, p_ttl_ms bigint, p_at timestamptz
) RETURNS SETOF deadman.jobs
LANGUAGE sql VOLATILE AS $$
    UPDATE deadman.jobs j
    SET state = 'running',
        attempt = j.attempt + 1,
        lease_token = nextval('deadman.lease_token_seq'),
        lease_worker = p_worker,
        lease_expires_at = p_at + p_ttl_ms * interval '1 millisecond',
        started_at = p_at
    WHERE j.id = ANY (p_ids)
    RETURNING j.*
$$;

-- The keyed claim, in one call: find the keys with due jobs (up to 512, a skip
-- scan), lock their limit rows in key order (so claimers of a key run one after
-- another and never deadlock), then, in a fresh snapshot that sees every claim
-- committed before the lock was ours, give each key what its limit leaves free and
-- take jobs round-robin across keys within a priority. VOLATILE on purpose: each
-- statement below takes a new snapshot (READ COMMITTED).
CREATE FUNCTION deadman.job_claim_keyed(
    p_queue text, p_worker text, p_ttl_ms bigint, p_limit integer
) RETURNS SETOF deadman.jobs
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    keys text[];
    v_now timestamptz;  -- read after the lock: what the start log is pruned against
BEGIN
    IF p_limit <= 0 OR EXISTS (SELECT 1 FROM deadman.queues q
                               WHERE q.name = p_queue AND q.paused) THEN
        RETURN;
    END IF;
    WITH RECURSIVE k (key, n) AS (
        (SELECT limit_key, 1 FROM deadman.jobs
         WHERE queue = p_queue AND state IN ('queued', 'scheduled', 'retrying')
           AND limit_key IS NOT NULL
         ORDER BY limit_key LIMIT 1)
        UNION ALL
        SELECT (SELECT j.limit_key FROM deadman.jobs j
                WHERE j.queue = p_queue AND j.state IN ('queued', 'scheduled', 'retrying')
                  AND j.limit_key IS NOT NULL AND j.limit_key > k.key
                ORDER BY j.limit_key LIMIT 1), k.n + 1
        FROM k WHERE k.key IS NOT NULL AND k.n < 512
    )
    SELECT array_agg(key) INTO keys FROM k WHERE key IS NOT NULL;
    IF keys IS NULL THEN
        RETURN;
    END IF;

    PERFORM 1 FROM deadman.limits WHERE key = ANY (keys) ORDER BY key FOR UPDATE;
    v_now := clock_timestamp();

    DELETE FROM deadman.limit_starts s USING deadman.limits l
    WHERE s.key = l.key AND l.key = ANY (keys)
      AND s.at < v_now - (l.rate_per_ms::bigint * interval '1 millisecond') - interval '1 minute';

    -- The decisive statement. Its clock is read inside it, after its snapshot was
    -- taken: now() is the transaction's start, before the wait for the lock, and even a
    -- clock read between the statements could precede a finish this snapshot sees; a
    -- start stamped with either could look older than the finish that freed its slot.
    RETURN QUERY
    WITH clock AS MATERIALIZED (
        SELECT clock_timestamp() AS t
    ), allowance AS (
        SELECT u.k AS key, l.rate_count IS NOT NULL AS rated,
               LEAST(p_limit,  -- LEAST skips NULLs: no limit row, no bound
                     l.concurrency - deadman.limit_running(u.k),
                     deadman.limit_available(u.k, l.rate_count, l.rate_per_ms, clock.t)) AS n
        FROM unnest(keys) AS u (k)
        CROSS JOIN clock
        LEFT JOIN deadman.limits l ON l.key = u.k
    ), ranked AS (
        SELECT c.id, c.priority, c.run_at, a.n,
               row_number() OVER (PARTITION BY a.key ORDER BY c.priority DESC, c.run_at, c.id)
                   AS turn
        FROM allowance a
        CROSS JOIN LATERAL (
            SELECT j.id, j.priority, j.run_at FROM deadman.jobs j
            WHERE j.queue = p_queue AND j.limit_key = a.key
              AND j.state IN ('queued', 'scheduled', 'retrying')
              AND j.run_at <= now()
              AND (j.start_by IS NULL OR j.start_by > now())
              AND (j.deadline IS NULL OR j.deadline > now())
            ORDER BY j.priority DESC, j.run_at, j.id
            LIMIT GREATEST(a.n, 0)
            FOR UPDATE SKIP LOCKED
        ) c
        WHERE a.n > 0
    ), chosen AS (
        SELECT id FROM ranked ORDER BY priority DESC, turn, run_at, id LIMIT p_limit
    ), claimed AS (
        SELECT s.* FROM clock,
            deadman.job_start(ARRAY(SELECT id FROM chosen), p_worker, p_ttl_ms, clock.t) s
    ), logged AS (
        INSERT INTO deadman.limit_starts (key, at)
        SELECT c.limit_key, clock.t FROM claimed c CROSS JOIN clock
        JOIN allowance a ON a.key = c.limit_key AND a.rated
    )
    SELECT * FROM claimed;
END;
$$;

GRANT SELECT, INSERT, UPDATE, DELETE ON deadman.limits TO deadman_api;
GRANT SELECT ON deadman.limit_starts, deadman.limit_state TO deadman_api;
