-- Deadman's named queries. The loader (deadman/db/queries.py) reads this file into
-- a dict of name -> SQL; the store has exactly one method per query. Values are
-- always parameters (%(name)s); runtime code never builds SQL from strings.
--
-- Every write a worker makes about a job is fenced:
--     WHERE id = $id AND lease_token = $token AND state = 'running'
-- Zero rows means the lease is lost; the worker abandons the job.

-- name: migrations_prepare
-- The bookkeeping table for migrations; created before anything else.
CREATE SCHEMA IF NOT EXISTS deadman;
CREATE TABLE IF NOT EXISTS deadman.schema_migrations (
    version     integer PRIMARY KEY,
    name        text        NOT NULL,
    applied_at  timestamptz NOT NULL DEFAULT now()
);
-- the SHA-256 of the file as applied (NULL: applied before checksums were kept; the
-- next migrate records the file as it is then)
ALTER TABLE deadman.schema_migrations ADD COLUMN IF NOT EXISTS checksum text;

-- name: migrations_lock
-- Serialise concurrent `deadman migrate` runs (held to the end of the transaction).
SELECT pg_advisory_xact_lock(716341, 1);

-- name: migrations_applied
SELECT version, name, checksum FROM deadman.schema_migrations ORDER BY version;

-- name: migrations_record
INSERT INTO deadman.schema_migrations (version, name, checksum)
VALUES (%(version)s, %(name)s, %(checksum)s);

-- name: migrations_checksum_backfill
-- A migration applied before checksums were kept: trust the file as it is now.
UPDATE deadman.schema_migrations SET checksum = %(checksum)s
WHERE version = %(version)s AND checksum IS NULL;

-- name: schema_migrations_exists
-- False before the first `deadman migrate` (then schema_version_get would fail).
SELECT to_regclass('deadman.schema_migrations') IS NOT NULL AS present;

-- name: schema_version_get
-- The highest applied migration (NULL if none).
SELECT max(version) AS version FROM deadman.schema_migrations;

-- name: job_insert
-- One job. A due job is 'queued', a future one 'scheduled'; with %(pending_deps)s > 0
-- (dependencies not yet succeeded, see job_deps_lock) it is 'waiting', and with
-- %(upstream_error)s (a dependency already dead or cancelled) it is born 'cancelled'.
-- With an idempotency key that is already taken this inserts nothing and returns no
-- row; the caller then reads the existing job (ON CONFLICT waits for a concurrent
-- inserter to finish, so the existing row is visible to the next statement).
-- A job a claim could take (due or later) wakes its queue's idle workers at commit
-- (woke; DECISIONS 84: every statement that inserts jobs does, as 0001's trigger did).
-- An enqueue on its own that a parked worker could take runs job_insert_handoff.
INSERT INTO deadman.jobs (type, queue, priority, payload, state, max_attempts, backoff,
                          timeout_ms, run_at, idempotency_key, request_hash,
                          pending_deps, finished_at, last_error, upstream_cancelled,
                          start_by, deadline, heartbeat_timeout_ms, limit_key,
                          trace_context)
SELECT %(type)s, %(queue)s, %(priority)s, %(payload)s,
       CASE WHEN %(upstream_error)s::text IS NOT NULL THEN 'cancelled'
            WHEN %(pending_deps)s::integer > 0 THEN 'waiting'
            WHEN r.run_at > now() THEN 'scheduled'
            ELSE 'queued' END,
       %(max_attempts)s, %(backoff)s, %(timeout_ms)s, r.run_at,
       %(idempotency_key)s, %(request_hash)s,
       CASE WHEN %(upstream_error)s::text IS NULL THEN %(pending_deps)s::integer ELSE 0 END,
       CASE WHEN %(upstream_error)s::text IS NOT NULL THEN now() END,
       %(upstream_error)s::text, %(upstream_error)s::text IS NOT NULL,
       %(start_by)s::timestamptz, %(deadline)s::timestamptz,
       %(heartbeat_timeout_ms)s::integer, %(limit_key)s::text, %(trace_context)s::jsonb
FROM (SELECT COALESCE(%(run_at)s::timestamptz,
                      now() + %(delay_ms)s::bigint * interval '1 millisecond')) AS r(run_at)
ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING *,
    CASE WHEN state IN ('queued', 'scheduled', 'retrying')
         THEN pg_notify('deadman_jobs', queue) END AS woke;

-- name: job_insert_handoff
-- job_insert for an enqueue that is its own transaction (a caller's open transaction
-- would hold the slot and start the lease before its commit) of a job with no
-- dependencies (those run job_insert, after job_deps_lock). Handoff (DECISIONS 83,
-- migration 0021): a due job without a limit key, with nothing older due in its queue
-- and the queue not paused, is born 'running' under the lease of a worker that parked
-- a slot for its queue, exactly as deadman.job_start would have started it; the
-- slot's row records the job and the worker is told on its channel. A parked row
-- another enqueue holds is stepped past (SKIP LOCKED); with none free, or a key
-- conflict (no row inserted, no slot taken), it does what job_insert does.
WITH v AS (
    SELECT COALESCE(%(run_at)s::timestamptz,
                    now() + %(delay_ms)s::bigint * interval '1 millisecond') AS run_at
), slot AS (
    SELECT p.worker, p.slot, p.ttl_ms, p.channel, p.nonce
    FROM deadman.parked p, v
    -- a role that may not mint lease tokens (deadman_api) queues its jobs
    WHERE has_sequence_privilege('deadman.lease_token_seq', 'USAGE')
      AND p.open
      AND %(queue)s = ANY (p.queues)
      AND p.job_id IS NULL
      AND p.expires_at > now()
      AND %(limit_key)s::text IS NULL
      AND v.run_at <= now()
      AND (%(start_by)s::timestamptz IS NULL OR %(start_by)s::timestamptz > now())
      AND (%(deadline)s::timestamptz IS NULL OR %(deadline)s::timestamptz > now())
      AND NOT EXISTS (SELECT 1 FROM deadman.queues q WHERE q.name = %(queue)s AND q.paused)
      -- job_claim's order: nothing handed off ahead of an older due job
      AND NOT EXISTS (SELECT 1 FROM deadman.jobs o
                      WHERE o.queue = %(queue)s AND o.limit_key IS NULL
                        AND o.state IN ('queued', 'scheduled', 'retrying')
                        AND o.run_at <= now())
    LIMIT 1
    FOR UPDATE OF p SKIP LOCKED
), ins AS (
    INSERT INTO deadman.jobs (type, queue, priority, payload, state, max_attempts, backoff,
                              timeout_ms, run_at, idempotency_key, request_hash,
                              start_by, deadline, heartbeat_timeout_ms, limit_key,
                              trace_context, attempt, lease_token, lease_worker,
                              lease_expires_at, started_at)
    SELECT %(type)s, %(queue)s, %(priority)s, %(payload)s,
           CASE WHEN v.run_at > now() THEN 'scheduled'
                WHEN s.worker IS NOT NULL THEN 'running'
                ELSE 'queued' END,
           %(max_attempts)s, %(backoff)s, %(timeout_ms)s, v.run_at,
           %(idempotency_key)s, %(request_hash)s,
           %(start_by)s::timestamptz, %(deadline)s::timestamptz,
           %(heartbeat_timeout_ms)s::integer, %(limit_key)s::text, %(trace_context)s::jsonb,
           CASE WHEN s.worker IS NOT NULL THEN 1 ELSE 0 END,
           CASE WHEN s.worker IS NOT NULL THEN nextval('deadman.lease_token_seq') END,
           s.worker,
           now() + s.ttl_ms * interval '1 millisecond',
           CASE WHEN s.worker IS NOT NULL THEN now() END
    FROM v LEFT JOIN slot s ON true
    ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    -- not handed off: its queue's idle workers are woken, as job_insert wakes them
    RETURNING *,
        CASE WHEN state IN ('queued', 'scheduled', 'retrying')
             THEN pg_notify('deadman_jobs', queue) END AS woke
), handed AS (
    UPDATE deadman.parked p
    SET job_id = i.id, lease_token = i.lease_token
    FROM ins i, slot s,
         LATERAL (SELECT i.id || ' ' || s.nonce || ' ' || row_to_json(i)::text AS note) n
    WHERE i.state = 'running' AND p.worker = s.worker AND p.slot = s.slot
    -- the job itself, after the slot's nonce, so the worker starts it without reading
    -- it back (DECISIONS 86); the id alone when the row has no nonce or the job is too
    -- big for a notification (under 8,000 bytes), and the worker reads it (job_adopt)
    RETURNING pg_notify(s.channel, CASE WHEN octet_length(n.note) < 8000 THEN n.note
                                        ELSE i.id::text END)
)
SELECT * FROM ins;

-- name: job_ids_reserve
-- Ids for a bulk enqueue that COPYs straight into the jobs table (job_copy_direct),
-- taken in order from the table's own sequence (a shard's range, DECISIONS 54). The
-- COPY cannot notify, so this statement wakes the %(queues)s it will fill (every row
-- COPYed is queued, due now): NOTIFY is sent at commit, so only if the COPY commits
-- with it (DECISIONS 84).
-- The ids come as one array, in the order they were taken (a thousand rows cost the
-- client ~0.4 ms more to read than one array of a thousand): ARRAY(...) appends each
-- id as its row is made, so the array ascends by construction. (It replaced
-- array_agg(... ORDER BY g), whose sort of the thousand rows made the statement
-- 0.91 ms a call of 1,000 against 0.73; DECISIONS 89.)
WITH woke AS (
    SELECT pg_notify('deadman_jobs', q) FROM unnest(%(queues)s::text[]) AS q GROUP BY q
)
SELECT ARRAY(SELECT nextval('deadman.jobs_id_seq') FROM generate_series(1, %(n)s::integer))
       AS ids
WHERE (SELECT count(*) FROM woke) >= 0;

-- name: job_copy_direct
-- A bulk enqueue in which no job has an idempotency key, a run_at or a delay (DECISIONS
-- 68): COPY the rows into the jobs table with the ids job_ids_reserve gave. Every
-- column left out takes the table's default: state 'queued', run_at and created_at
-- now(), as job_insert_staged would have written them. Its queues were woken by
-- job_ids_reserve, in the same transaction.
COPY deadman.jobs (id, type, queue, priority, payload, max_attempts, backoff, timeout_ms,
                   start_by, deadline, heartbeat_timeout_ms, limit_key, trace_context)
FROM STDIN;

-- name: job_ids_reserve_keyed
-- job_ids_reserve for a bulk enqueue whose jobs carry idempotency keys (and no run_at
-- or delay), and which of those %(keys)s a job already holds: none, and the batch is
-- COPYed straight in (job_copy_direct_keyed) under a savepoint; one, and it takes the
-- staged path (ON CONFLICT skips it), as it would have without this look. A key a
-- transaction takes after this snapshot makes the COPY wait for that transaction and
-- then fail (unique violation): rolled back to its savepoint, the batch is staged
-- then (DECISIONS 92). The ids wasted so are gaps, as any rolled-back insert leaves.
-- The keys come as one text, a line each (a key has no control character: 1.0 ms a
-- call of 1,000, against 2.4 for a text[] parameter, which psycopg adapts key by key).
WITH woke AS (
    SELECT pg_notify('deadman_jobs', q) FROM unnest(%(queues)s::text[]) AS q GROUP BY q
)
SELECT ARRAY(SELECT nextval('deadman.jobs_id_seq') FROM generate_series(1, %(n)s::integer))
       AS ids,
       ARRAY(SELECT j.idempotency_key FROM deadman.jobs j
             WHERE j.idempotency_key = ANY(string_to_array(%(keys)s::text, E'\n'))) AS taken
WHERE (SELECT count(*) FROM woke) >= 0;

-- name: job_copy_direct_keyed
-- job_copy_direct with each job's idempotency key and request hash (DECISIONS 92). Rows
-- come in key order, whatever the batch's: two such COPYs sharing keys take them in
-- the same order, so one waits for the other rather than deadlocking.
COPY deadman.jobs (id, type, queue, priority, payload, max_attempts, backoff, timeout_ms,
                   idempotency_key, request_hash,
                   start_by, deadline, heartbeat_timeout_ms, limit_key, trace_context)
FROM STDIN;

-- name: job_stage_prepare
-- A per-session staging table for COPY-based bulk enqueue; emptied at commit.
CREATE TEMP TABLE IF NOT EXISTS deadman_stage (
    ord bigint, type text, queue text, priority integer, payload jsonb, max_attempts integer,
    backoff jsonb, timeout_ms integer, run_at timestamptz, delay_ms bigint,
    idempotency_key text, request_hash text, start_by timestamptz, deadline timestamptz,
    heartbeat_timeout_ms integer, limit_key text, trace_context jsonb
) ON COMMIT DELETE ROWS;

-- name: job_stage_clear
-- Two bulk enqueues in one transaction must not see each other's staged rows.
DELETE FROM pg_temp.deadman_stage;

-- name: job_stage_copy
COPY pg_temp.deadman_stage (ord, type, queue, priority, payload, max_attempts, backoff,
                            timeout_ms, run_at, delay_ms, idempotency_key,
                            request_hash, start_by, deadline, heartbeat_timeout_ms,
                            limit_key, trace_context) FROM STDIN;

-- name: job_insert_staged
-- Move the COPYed rows into the jobs table in one statement. Rows whose idempotency
-- key is taken are skipped; the caller learns which by id. Every staged job is queued
-- or scheduled: woke wakes each queue of the batch once (DECISIONS 84), read from the
-- staged rows rather than from the inserted ones (which would have to be kept for
-- it), so a batch whose every key was taken wakes its queues for nothing.
WITH woke AS (
    SELECT pg_notify('deadman_jobs', queue) FROM pg_temp.deadman_stage GROUP BY queue
)
INSERT INTO deadman.jobs (type, queue, priority, payload, state, max_attempts, backoff,
                          timeout_ms, run_at, idempotency_key, request_hash, start_by,
                          deadline, heartbeat_timeout_ms, limit_key, trace_context)
SELECT s.type, s.queue, s.priority, s.payload,
       CASE WHEN r.run_at > now() THEN 'scheduled' ELSE 'queued' END,
       s.max_attempts, s.backoff, s.timeout_ms, r.run_at, s.idempotency_key, s.request_hash,
       s.start_by, s.deadline, s.heartbeat_timeout_ms, s.limit_key, s.trace_context
FROM pg_temp.deadman_stage s
CROSS JOIN LATERAL (
    SELECT COALESCE(s.run_at, now() + COALESCE(s.delay_ms, 0) * interval '1 millisecond')
) AS r(run_at)
-- (the count makes woke run once: a CTE nothing reads is never run)
WHERE (SELECT count(*) FROM woke) >= 0
ORDER BY s.ord
ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING id;

-- name: job_deps_lock
-- `depends_on` of a new job: mark its dependencies as having dependents and return
-- their state. The UPDATE locks those rows until our commit and reads their latest
-- committed state, so a dependency finishing at the same moment either finished
-- first (we see it) or waits for our commit and then releases (or cancels) the new
-- job through the jobs_state_changed trigger, which sees our job_deps rows.
-- A dependency that is due stays locked until our commit (a transactional enqueue:
-- the caller's transaction), and claims meanwhile step past it (SKIP LOCKED): so its
-- queue is woken, the NOTIFY sent at our commit (the race matrix's claim wake-up).
UPDATE deadman.jobs
SET has_dependents = true
WHERE id = ANY(%(ids)s::bigint[])
RETURNING id, state, COALESCE(node, 'job ' || id) AS name,
    deadman.wake_if_due(state, run_at, queue) AS notified;  -- migrations/0018

-- name: job_deps_insert
-- The edges of a job inserted with depends_on (after job_deps_lock, same transaction).
INSERT INTO deadman.job_deps (job_id, depends_on)
SELECT %(job_id)s, d FROM unnest(%(depends_on)s::bigint[]) AS d
ON CONFLICT DO NOTHING;

-- name: job_get
SELECT * FROM deadman.jobs WHERE id = %(id)s;

-- name: job_get_by_idempotency_key
SELECT * FROM deadman.jobs WHERE idempotency_key = %(idempotency_key)s;

-- name: job_claim
-- Claim up to %(limit)s due jobs of one queue for one worker: first the keyed ones
-- their limits allow (deadman.job_claim_keyed, migration 0010), then unkeyed ones for
-- the rest. The keyed claim is only called when the queue has a keyed job waiting
-- (an uncorrelated EXISTS: a one-time filter, so the function is not run at all
-- otherwise): entering the PL/pgSQL function cost 0.3 ms of a 0.8 ms claim of one
-- job even when it found nothing (EXPLAIN ANALYZE). A keyed job committed after this
-- statement's snapshot waits for the next claim, as it would have anyway.
-- %(keyed)s false: unkeyed jobs only (the completer's refill, DECISIONS 45: a keyed
-- slot freed by a write is then contended for by the whole fleet, not retaken by the
-- writer in the same transaction, and the write never waits for limit rows).
-- The candidates CTE locks exactly the rows it returns (never
-- `WHERE id IN (SELECT ... LIMIT n FOR UPDATE)`: the planner may re-run that
-- subquery and claim more than n). SKIP LOCKED lets concurrent claimers take
-- disjoint sets; a short batch therefore does not mean an empty queue.
-- Claiming a due 'scheduled' or 'retrying' job is its promotion.
WITH keyed AS (
    SELECT * FROM deadman.job_claim_keyed(%(queue)s, %(worker)s, %(ttl_ms)s, %(limit)s)
    WHERE %(keyed)s::boolean
      AND EXISTS (SELECT 1 FROM deadman.jobs k  -- jobs_claim_keyed_idx's predicate
                  WHERE k.queue = %(queue)s AND k.limit_key IS NOT NULL
                    AND k.state IN ('queued', 'scheduled', 'retrying'))
), candidates AS (
    SELECT id, priority, run_at
    FROM deadman.jobs
    WHERE queue = %(queue)s
      AND limit_key IS NULL  -- jobs_claim_idx's second column: keyed jobs are elsewhere
      AND state IN ('queued', 'scheduled', 'retrying')
      AND run_at <= now()
      AND NOT EXISTS (SELECT 1 FROM deadman.queues q WHERE q.name = %(queue)s AND q.paused)
      AND rescues < %(quarantine_at)s  -- quarantined suspects run alone (below)
      -- past start_by or deadline: never started; the rescuer ends them dead
      AND (start_by IS NULL OR start_by > now())
      AND (deadline IS NULL OR deadline > now())
    ORDER BY priority DESC, run_at, id
    -- a constant: with the room left after the keyed claim here instead, the planner
    -- could not count on a small LIMIT and sorted the whole queue (measured)
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), claimed AS (
    SELECT * FROM deadman.job_start(
        ARRAY(SELECT id FROM candidates ORDER BY priority DESC, run_at, id
              LIMIT %(limit)s - (SELECT count(*) FROM keyed)),
        %(worker)s, %(ttl_ms)s, now())
)
SELECT * FROM keyed
UNION ALL
SELECT * FROM claimed;

-- name: job_claim_quarantined
-- One suspected poison pill (rescued %(quarantine_at)s times or more), for a worker
-- that holds nothing else: if it crashes again, nothing else dies with it and the
-- rescuer knows whom to blame. Uses jobs_quarantine_idx (rescued jobs only).
WITH candidates AS (
    SELECT id
    FROM deadman.jobs
    WHERE queue = %(queue)s
      AND state IN ('queued', 'scheduled', 'retrying')
      AND rescues > 0
      AND rescues >= %(quarantine_at)s
      AND limit_key IS NULL  -- keyed jobs run under their limit (job_claim_keyed)
      AND run_at <= now()
      AND NOT EXISTS (SELECT 1 FROM deadman.queues q WHERE q.name = %(queue)s AND q.paused)
      AND (start_by IS NULL OR start_by > now())
      AND (deadline IS NULL OR deadline > now())
    ORDER BY run_at, id
    LIMIT 1
    FOR UPDATE SKIP LOCKED
)
SELECT * FROM deadman.job_start(ARRAY(SELECT id FROM candidates), %(worker)s, %(ttl_ms)s, now());

-- name: job_quarantine_pending
-- Is a quarantined job due in one of these queues that job_claim_quarantined could
-- claim? (jobs_quarantine_idx) The same tests as that claim, paused queue and
-- start_by/deadline included: a suspect this says is pending but the claim can
-- never take makes the producer drain for nothing every time it asks (a poison
-- pill in a paused queue throttled every worker serving that queue).
SELECT EXISTS (
    SELECT 1 FROM deadman.jobs j
    WHERE j.queue = ANY(%(queues)s::text[])
      AND j.state IN ('queued', 'scheduled', 'retrying')
      AND j.rescues > 0
      AND j.rescues >= %(quarantine_at)s
      AND j.run_at <= now()
      AND NOT EXISTS (SELECT 1 FROM deadman.queues q WHERE q.name = j.queue AND q.paused)
      AND (j.start_by IS NULL OR j.start_by > now())
      AND (j.deadline IS NULL OR j.deadline > now())
) AS pending;

-- name: job_claim_left
-- What a claim that was not full left (DECISIONS 66), asked by the producer in the
-- statement after it: the jobs it took are running by now.
-- `more`: is a due job of the queue left that a claim could take (the queue not
-- paused, the job not quarantined, not past its start_by or deadline)? One another
-- claimer was taking when SKIP LOCKED stepped over it counts (it is still due in
-- this snapshot): then the producer claims again at once, as it always did after a
-- short claim. None left: it goes idle without the empty claim that used to follow.
-- A job committed later sends its NOTIFY at its commit; a holder that takes a due
-- row without claiming it wakes the queue at its own (DECISIONS 63). Keyed jobs
-- count too: one held back by its limit makes the producer claim once more, and
-- that claim comes back empty, as before.
-- `wait`: how long an idle producer should sleep, so that it wakes exactly when it
-- must instead of at its poll: the next not-yet-due job of the queue becomes due,
-- or a rate token frees for a key with a job the keyed claim would take (when its
-- rate_count-th newest start leaves the window: its stamp + per_ms). Not sooner than
-- 10 ms (the least gap between empty claims, EMPTY_CLAIM_GAP_S). A token that freed
-- in the last second counts too, and means "claim again in 10 ms" (DECISIONS 96): a
-- producer whose idle wait ended just before a token freed (a wake-up, parked slots
-- gone stale) finds the window still full, and by this look the token is free; the
-- look used to say NULL then, and the producer slept its whole poll with a token
-- free and a job due. A token free for
-- longer than that did not hold this claim back (a row another transaction held did,
-- and its holder wakes the queue: DECISIONS 63). A key at its concurrency, or in a
-- paused queue, waits for a finish or a resume (and the poll), not for a token.
-- NULL: nothing to wait for but a NOTIFY or the poll.
-- Every look is ordered as its claim index is, so that every plan reads that index:
-- unordered, a generic plan made on a table never analyzed read the queue's listing
-- index, which holds every finished job too, and walked all of them at each idle
-- cycle (DECISIONS 65, "Not adopted: planning job_next_run_at at each call");
-- OFFSET 0 keeps the order of the two min() looks from being planned away.
SELECT NOT EXISTS (SELECT 1 FROM deadman.queues q WHERE q.name = %(queue)s AND q.paused)
       AND ((SELECT true FROM deadman.jobs j  -- jobs_claim_idx
        WHERE j.queue = %(queue)s AND j.limit_key IS NULL
          AND j.state IN ('queued', 'scheduled', 'retrying')
          AND j.run_at <= now()
          AND j.rescues < %(quarantine_at)s
          AND (j.start_by IS NULL OR j.start_by > now())
          AND (j.deadline IS NULL OR j.deadline > now())
        ORDER BY j.priority DESC, j.run_at, j.id LIMIT 1) IS NOT NULL
       OR (SELECT true FROM deadman.jobs j  -- jobs_claim_keyed_idx
           WHERE j.queue = %(queue)s AND j.limit_key IS NOT NULL
             AND j.state IN ('queued', 'scheduled', 'retrying')
             AND j.run_at <= now()
             AND j.rescues < %(quarantine_at)s
             AND (j.start_by IS NULL OR j.start_by > now())
             AND (j.deadline IS NULL OR j.deadline > now())
           ORDER BY j.limit_key, j.priority DESC, j.run_at, j.id LIMIT 1) IS NOT NULL)
       AS more,
       LEAST(
           (SELECT min(run_at) FROM (
                SELECT run_at FROM deadman.jobs  -- jobs_claim_idx
                WHERE queue = %(queue)s AND limit_key IS NULL
                  AND state IN ('queued', 'scheduled', 'retrying')
                  AND run_at > now()
                ORDER BY priority DESC, run_at, id OFFSET 0) u),
           (SELECT min(run_at) FROM (
                SELECT run_at FROM deadman.jobs  -- jobs_claim_keyed_idx
                WHERE queue = %(queue)s AND limit_key IS NOT NULL
                  AND state IN ('queued', 'scheduled', 'retrying')
                  AND run_at > now()
                ORDER BY limit_key, priority DESC, run_at, id OFFSET 0) k),
           (SELECT min(GREATEST(f.frees, now() + interval '10 milliseconds'))  -- no key: NULL
            FROM deadman.limits l
            CROSS JOIN LATERAL (
                -- a token frees when the rate_count-th newest start leaves the window
                SELECT s.at + l.rate_per_ms::bigint * interval '1 millisecond' AS frees
                FROM deadman.limit_starts s
                WHERE s.key = l.key
                ORDER BY s.at DESC
                OFFSET l.rate_count - 1 LIMIT 1
            ) f
            WHERE l.rate_count IS NOT NULL
              AND f.frees > now() - interval '1 second'  -- to come, or just freed
              AND NOT EXISTS (SELECT 1 FROM deadman.queues q
                              WHERE q.name = %(queue)s AND q.paused)
              AND (l.concurrency IS NULL OR deadman.limit_running(l.key) < l.concurrency)
              AND EXISTS (SELECT 1 FROM deadman.jobs k  -- one the keyed claim would take
                          WHERE k.queue = %(queue)s AND k.limit_key = l.key
                            AND k.state IN ('queued', 'scheduled', 'retrying')
                            AND k.run_at <= now()
                            AND k.rescues < %(quarantine_at)s
                            AND (k.start_by IS NULL OR k.start_by > now())
                            AND (k.deadline IS NULL OR k.deadline > now())))
       ) - now() AS wait;

-- name: job_finish_many
-- End many attempts in one statement: success, retry, dead, cancelled or released.
-- Fenced: only rows still running under the caller's token change (a lease token
-- is set exactly while a job runs: jobs_lease_iff_running). Each ended attempt gets
-- its history row in the same statement. Returns the ids that changed; an id
-- missing from the result is a lost lease.
-- An acknowledged cancel wins over every outcome but success: a job whose
-- cancel_requested is set (read under the row lock, so a cancel that committed while
-- we waited for the lock counts) ends 'cancelled' instead of 'retrying', 'queued'
-- (released) or 'dead', so no new attempt starts after the cancel's 202. The
-- attempt's own outcome still goes to its history row.
-- Plan: every step finds its rows through the primary key, so the cost follows the
-- batch and nothing else. No `state = 'running'` test on purpose: it would let the
-- planner pick jobs_running_idx (statistics often say "no job is running") and
-- scan every running job once per row of the batch.
WITH locked AS (
    -- Lock in id order: the heartbeat locks the same worker's rows in id order too,
    -- so the two multi-row statements can never deadlock each other.
    -- The batch is one JSON array of objects (one json.dumps in the worker: a tenth
    -- of its CPU went into adapting seven parameter arrays element by element).
    SELECT j.id, i.token, i.outcome, i.delay_ms, i.error, i.result,
           CASE WHEN j.cancel_requested AND i.state <> 'succeeded' THEN 'cancelled'
                ELSE i.state END AS state,
           j.cancel_requested AND i.state NOT IN ('succeeded', 'cancelled')
               AS cancelled_on_request
    FROM deadman.jobs j
    JOIN json_to_recordset(%(batch)s::json)
         AS i(id bigint, token bigint, state text, outcome text, delay_ms bigint,
              error text, result jsonb)
      ON i.id = j.id AND i.token = j.lease_token
    WHERE j.id = ANY(%(ids)s::bigint[])
    ORDER BY j.id
    FOR UPDATE OF j
), done AS (
    UPDATE deadman.jobs j
    SET state = l.state,
        lease_token = NULL,
        lease_expires_at = NULL,
        finished_at = CASE WHEN l.state IN ('succeeded', 'dead', 'cancelled') THEN now() END,
        run_at = CASE WHEN l.state IN ('retrying', 'queued')
                      THEN now() + l.delay_ms * interval '1 millisecond'
                      ELSE j.run_at END,
        -- a released attempt (graceful shutdown) does not use up an attempt
        attempt = CASE WHEN l.outcome = 'released' THEN j.attempt - 1 ELSE j.attempt END,
        last_error = CASE WHEN l.cancelled_on_request
                          THEN COALESCE(l.error || E'\n', '') || 'cancelled on request'
                          ELSE COALESCE(l.error, j.last_error) END,
        result = l.result,
        finished_token = CASE WHEN l.state = 'succeeded' THEN l.token END
    FROM locked l
    WHERE j.id = l.id AND j.lease_token = l.token
    RETURNING j.id, j.attempt, j.lease_worker, j.started_at, l.token, l.outcome, l.error,
              j.finished_token
), history AS (
    INSERT INTO deadman.attempt_log (lease_token, job_id, attempt, worker, started_at,
                                  outcome, error)
    SELECT token, id, CASE WHEN outcome = 'released' THEN attempt + 1 ELSE attempt END,
           lease_worker, started_at, outcome, error
    FROM done
    WHERE finished_token IS NULL  -- a succeeded attempt stays in its job's row
)
SELECT id FROM done;

-- name: job_succeed_in
-- ctx.transaction()'s fenced completion, on the handler's connection and inside its
-- transaction: the success job_finish_many writes for one attempt, as one UPDATE by
-- primary key (DECISIONS 113). Sent once per exactly-once job, it must be cheap
-- where job_finish_many's batch machinery (the row lock in id order, the JSON batch,
-- the history insert) was dear for a batch of one, and planned once: Postgres keeps
-- its generic plan here after five calls, where the batch statement was planned
-- afresh on every call on a connection that, being the handler's, cannot force
-- generic plans. tests/integration/test_succeed_in.py holds the rows it writes to
-- job_finish_many's, field by field. Fenced as job_finish_many is (the token is set
-- exactly while the job runs: jobs_lease_iff_running; no `state` test, for the same
-- plan reason); a cancel asked for meanwhile does not change a success.
-- From here on the transaction holds the job's row lock, and a worker paused or cut off
-- before its COMMIT would keep the job out of the rescuer's reach (SKIP LOCKED passes
-- over it) until TCP keepalive noticed, hours later by default; so the server ends
-- the session once the transaction has sat idle for %(idle_ms)s ms, armed here (local
-- to the transaction) with the row's update: one round trip, not a set_config of its
-- own before it (DECISIONS 105). A refused completion updates no row, takes no lock
-- and arms nothing: the caller rolls back at once.
UPDATE deadman.jobs
SET state = 'succeeded',
    lease_token = NULL,
    lease_expires_at = NULL,
    finished_at = now(),
    result = %(result)s::jsonb,
    finished_token = %(token)s::bigint
WHERE id = %(id)s::bigint AND lease_token = %(token)s::bigint
RETURNING id, set_config('idle_in_transaction_session_timeout', %(idle_ms)s::text, true);

-- name: job_finish_claim
-- job_finish_many and job_claim's unkeyed claim in ONE statement (DECISIONS 62): the
-- completer's refill (DECISIONS 45) writes a batch of outcomes and claims the slots
-- they free in one round trip, in autocommit, instead of BEGIN, two statements and
-- COMMIT. The CTEs are those two statements' own, word for word
-- (tests/unit/test_finish_claim_query.py fails if they drift apart). One snapshot for
-- both: the claim cannot see this statement's own finishes, so a retry with no
-- backoff is not claimed again by the worker that just failed it; it waits for the
-- next claim. Keyed jobs are not claimed here (the refill never claims them: see
-- job_claim). Rows: one per finished attempt (finished = its job id, the rest NULL),
-- then the claimed jobs (finished NULL).
WITH locked AS (
    -- Lock in id order: the heartbeat locks the same worker's rows in id order too,
    -- so the two multi-row statements can never deadlock each other.
    -- The batch is one JSON array of objects (one json.dumps in the worker: a tenth
    -- of its CPU went into adapting seven parameter arrays element by element).
    SELECT j.id, i.token, i.outcome, i.delay_ms, i.error, i.result,
           CASE WHEN j.cancel_requested AND i.state <> 'succeeded' THEN 'cancelled'
                ELSE i.state END AS state,
           j.cancel_requested AND i.state NOT IN ('succeeded', 'cancelled')
               AS cancelled_on_request
    FROM deadman.jobs j
    JOIN json_to_recordset(%(batch)s::json)
         AS i(id bigint, token bigint, state text, outcome text, delay_ms bigint,
              error text, result jsonb)
      ON i.id = j.id AND i.token = j.lease_token
    WHERE j.id = ANY(%(ids)s::bigint[])
    ORDER BY j.id
    FOR UPDATE OF j
), done AS (
    UPDATE deadman.jobs j
    SET state = l.state,
        lease_token = NULL,
        lease_expires_at = NULL,
        finished_at = CASE WHEN l.state IN ('succeeded', 'dead', 'cancelled') THEN now() END,
        run_at = CASE WHEN l.state IN ('retrying', 'queued')
                      THEN now() + l.delay_ms * interval '1 millisecond'
                      ELSE j.run_at END,
        -- a released attempt (graceful shutdown) does not use up an attempt
        attempt = CASE WHEN l.outcome = 'released' THEN j.attempt - 1 ELSE j.attempt END,
        last_error = CASE WHEN l.cancelled_on_request
                          THEN COALESCE(l.error || E'\n', '') || 'cancelled on request'
                          ELSE COALESCE(l.error, j.last_error) END,
        result = l.result,
        finished_token = CASE WHEN l.state = 'succeeded' THEN l.token END
    FROM locked l
    WHERE j.id = l.id AND j.lease_token = l.token
    RETURNING j.id, j.attempt, j.lease_worker, j.started_at, l.token, l.outcome, l.error,
              j.finished_token
), history AS (
    INSERT INTO deadman.attempt_log (lease_token, job_id, attempt, worker, started_at,
                                  outcome, error)
    SELECT token, id, CASE WHEN outcome = 'released' THEN attempt + 1 ELSE attempt END,
           lease_worker, started_at, outcome, error
    FROM done
    WHERE finished_token IS NULL  -- a succeeded attempt stays in its job's row
),
candidates AS (
    SELECT id, priority, run_at
    FROM deadman.jobs
    WHERE queue = %(queue)s
      AND limit_key IS NULL  -- jobs_claim_idx's second column: keyed jobs are elsewhere
      AND state IN ('queued', 'scheduled', 'retrying')
      AND run_at <= now()
      AND NOT EXISTS (SELECT 1 FROM deadman.queues q WHERE q.name = %(queue)s AND q.paused)
      AND rescues < %(quarantine_at)s  -- quarantined suspects run alone (below)
      -- past start_by or deadline: never started; the rescuer ends them dead
      AND (start_by IS NULL OR start_by > now())
      AND (deadline IS NULL OR deadline > now())
    ORDER BY priority DESC, run_at, id
    -- a constant: with the room left after the keyed claim here instead, the planner
    -- could not count on a small LIMIT and sorted the whole queue (measured)
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), claimed AS (
    SELECT * FROM deadman.job_start(
        ARRAY(SELECT id FROM candidates ORDER BY priority DESC, run_at, id),
        %(worker)s, %(ttl_ms)s, now())
)
-- The claim first, then the finishes (DECISIONS 75): the main query reads `claimed`
-- before `done`, and a CTE runs when it is first read. A claim locks rows it then
-- skips: the old index entry of a job another worker claimed after this statement's
-- snapshot leads it to that job's newest version, which it locks before the recheck
-- fails, and holds to the end of the statement. Run last, the claim saw ms of such
-- jobs, and their owners' finishes waited on it (0.27 backends on average in
-- Lock:transactionid at 2 x 200 slots; 0.06 claim first). Refills cannot deadlock
-- one another: one waits only in its finishes, on a refill whose snapshot is older
-- (the job it waits for was claimed before it was sent and after the other's
-- snapshot). With a heartbeat of the same worker between two refills a cycle is
-- possible in principle; Postgres then cancels one statement after deadlock_timeout,
-- and a refill or beat that fails is written again the usual way (DECISIONS 75).
SELECT NULL::bigint AS finished, c.* FROM claimed c
UNION ALL
SELECT d.id, (NULL::deadman.jobs).* FROM done d;

-- name: job_heartbeat_many
-- The one statement a worker sends per heartbeat interval: it renews every lease the
-- worker holds (fenced) and its own liveness row. lease_expires_at is not indexed,
-- so these updates stay HOT. Returns the renewed jobs and whether a cancel was asked.
WITH alive AS (
    INSERT INTO deadman.workers (id, hostname, pid, queues, concurrency)
    VALUES (%(worker)s, %(hostname)s, %(pid)s, %(queues)s, %(concurrency)s)
    ON CONFLICT (id) DO UPDATE SET last_heartbeat_at = now()
), parked AS (
    -- its parked slots stay open to handoffs (DECISIONS 83) while it beats
    UPDATE deadman.parked SET expires_at = now() + ttl_ms * interval '1 millisecond'
    WHERE worker = %(worker)s
), locked AS (
    -- Lock in id order (see job_finish_many): no deadlock with the completer. Found
    -- through the primary key; a matching token means running (see job_finish_many).
    SELECT j.id
    FROM deadman.jobs j
    JOIN unnest(%(ids)s::bigint[], %(tokens)s::bigint[]) AS h(id, token)
      ON j.id = h.id AND j.lease_token = h.token
    WHERE j.id = ANY(%(ids)s::bigint[])
    ORDER BY j.id
    FOR UPDATE OF j
)
UPDATE deadman.jobs j
SET lease_expires_at = now() + %(ttl_ms)s::bigint * interval '1 millisecond'
FROM locked l
WHERE j.id = l.id
RETURNING j.id, j.cancel_requested;

-- name: worker_deregister
-- A worker's clean exit; its parked slots go with it (it unparked them first, so only
-- a slot an unpark could not take back is left).
WITH parked AS (DELETE FROM deadman.parked WHERE worker = %(worker)s)
DELETE FROM deadman.workers WHERE id = %(worker)s;

-- name: worker_park
-- Park free slots of an idle worker for handoffs (DECISIONS 83, migration
-- 0021), numbered from %(first)s. The worker has reserved them: nothing else it runs
-- takes them until it unparks (job_unpark) or a job is handed into one (job_adopt).
-- A slot's row is kept once taken back (closed) and reopened here (DECISIONS 85:
-- updates in place, no dead rows for VACUUM); a row that is still open is left as it
-- is (it may hold a handed job, which only an unpark or an adoption may take).
-- %(nonces)s: one per slot, in slot order, written into its row (DECISIONS 86): the
-- worker starts a job carried in a notification only if it carries that nonce.
INSERT INTO deadman.parked AS p (worker, slot, queues, channel, ttl_ms, expires_at, nonce)
SELECT %(worker)s, %(first)s::integer + k.n - 1, %(queues)s::text[], %(channel)s,
       %(ttl_ms)s::integer, now() + %(ttl_ms)s::bigint * interval '1 millisecond', k.nonce
FROM unnest(%(nonces)s::bigint[]) WITH ORDINALITY AS k(nonce, n)
ON CONFLICT (worker, slot) DO UPDATE
SET open = true, job_id = NULL, lease_token = NULL, queues = excluded.queues,
    channel = excluded.channel, ttl_ms = excluded.ttl_ms, expires_at = excluded.expires_at,
    nonce = excluded.nonce
WHERE NOT p.open;

-- name: job_unpark
-- Take back every slot this worker parked: each open row, with the job an enqueue
-- handed into it (NULL: none), closed in place (DECISIONS 85). A row an enqueue holds
-- right now is waited for (FOR UPDATE reads the row as that enqueue left it), so what
-- this returns is final: a slot is either back or holds its job. The jobs are read by
-- job_adopt_read, in a statement of their own: this one's snapshot predates the
-- enqueues it waited for.
WITH taken AS (
    SELECT slot, job_id, lease_token FROM deadman.parked
    WHERE worker = %(worker)s AND open
    FOR UPDATE
), closed AS (
    UPDATE deadman.parked p SET open = false, job_id = NULL, lease_token = NULL
    FROM taken t
    WHERE p.worker = %(worker)s AND p.slot = t.slot
)
SELECT slot, job_id, lease_token FROM taken;

-- name: job_adopt
-- A handoff's notification named %(job_id)s: take its slot's row, closing it (so each
-- handed job is adopted once, whatever is replayed or forged on the channel; a second
-- adoption or an unpark waits for the row, then finds it closed) and read the job,
-- if it is still running under the lease that enqueue gave us. lease_left_ms: what
-- is left of that lease now (the worker trusts it from this statement's send time
-- for that long, less its margin). No row: not ours, or already taken.
WITH m AS (
    SELECT slot, job_id, lease_token FROM deadman.parked
    WHERE worker = %(worker)s AND job_id = %(job_id)s AND open
    FOR UPDATE
), closed AS (
    UPDATE deadman.parked p SET open = false, job_id = NULL, lease_token = NULL
    FROM m
    WHERE p.worker = %(worker)s AND p.slot = m.slot
)
SELECT m.slot,
       (extract(epoch FROM j.lease_expires_at - now()) * 1000)::bigint AS lease_left_ms,
       j.*
FROM m
LEFT JOIN deadman.jobs j
  ON j.id = m.job_id AND j.lease_token = m.lease_token
 AND j.state = 'running' AND j.lease_worker = %(worker)s AND j.lease_expires_at > now();

-- name: job_handoff_close
-- A job the worker started from its handoff's notification (DECISIONS 86): close the
-- slot's row it was handed into, as job_adopt closes it, without reading the job back
-- (the notification carried it). A row an unpark holds is waited for and then found
-- closed: no row. Its slot, if this closed it.
UPDATE deadman.parked SET open = false, job_id = NULL, lease_token = NULL
WHERE worker = %(worker)s AND job_id = %(job_id)s AND open
RETURNING slot;

-- name: job_adopt_read
-- The jobs job_unpark found handed into this worker's slots, still running under the
-- leases those enqueues gave it; lease_left_ms as in job_adopt.
SELECT (extract(epoch FROM j.lease_expires_at - now()) * 1000)::bigint AS lease_left_ms, j.*
FROM deadman.jobs j
JOIN unnest(%(ids)s::bigint[], %(tokens)s::bigint[]) AS h(id, token)
  ON j.id = h.id AND j.lease_token = h.token
WHERE j.id = ANY (%(ids)s::bigint[])
  AND j.state = 'running' AND j.lease_worker = %(worker)s AND j.lease_expires_at > now();

-- name: worker_prune_stale
-- Forget workers that have not sent a heartbeat for a long time (they are gone), and
-- the slots they parked (DECISIONS 83): no handoff takes those once expired (job_insert
-- reads expires_at), and a job handed into one is still running under its lease in
-- deadman.jobs, which the rescuer handles.
WITH parked AS (
    DELETE FROM deadman.parked
    WHERE expires_at < now() - %(older_than_ms)s::bigint * interval '1 millisecond'
)
DELETE FROM deadman.workers
WHERE last_heartbeat_at < now() - %(older_than_ms)s::bigint * interval '1 millisecond';

-- name: listen_jobs
-- The channel the inserting statements (DECISIONS 84), rescues and releases notify
-- (payload: queue name).
LISTEN deadman_jobs;

-- name: listen_cancel
-- Cancels of running jobs (payload: the job id), sent by job_cancel and workflow_cancel.
LISTEN deadman_cancel;

-- name: ping
SELECT 1;

-- name: listen_done
-- Ends of jobs someone waits on (payload: the job id), sent by the jobs_notify_done
-- trigger (migration 0013) for rows with waited = true; deadman.waiting listens.
LISTEN deadman_done;

-- name: job_wait_flag
-- A waiter, already listening on deadman_done, marks the job as waited on: whatever
-- ends it after this commits sees waited = true and notifies (the trigger). The row
-- comes back as it stands after the update, so a job that already ended is answered
-- at once. Only a job not flagged yet is written (a second waiter, a repeated
-- long-poll, writes nothing): no row then means "already flagged, or no such job",
-- and the waiter reads the job with job_get, in a snapshot taken after whoever
-- flagged it committed.
-- The update holds the row until it commits, and a claim meanwhile steps past it (SKIP
-- LOCKED): when that was the queue's one due job, the claim comes back empty and an
-- idle producer sleeps until its poll. So a due job's flag wakes the queue, as an
-- insert does (the NOTIFY is sent at commit; the race matrix's claim wake-up check:
-- a job enqueued and waited on at once sat queued for a 30 s poll).
UPDATE deadman.jobs SET waited = true
WHERE id = %(id)s AND NOT waited
RETURNING *, deadman.wake_if_due(state, run_at, queue) AS notified;  -- migrations/0018

-- name: queue_notify
-- Wake idle producers of these queues (after a rescue or a release made jobs due).
SELECT pg_notify('deadman_jobs', q) FROM unnest(%(queues)s::text[]) AS q;

-- name: rescuer_try_lock
-- Leadership for one maintenance tick (deadman/maintenance/leadership.py): only the
-- holder of this transaction-level lock acts; the others skip the tick. One key per
-- service (%(key)s: 2 the rescuer, 3 the expirer, 4 the cleaner), so a long prune
-- round never makes a rescue wait, and services ticking in step never starve each
-- other. Dies with the transaction, so a crashed leader never blocks the next one.
-- A *paused* leader (SIGSTOP, a VM freeze, a partition) would hold it for as long as
-- its transaction stays open, and no job would be rescued anywhere in the fleet (a
-- chaos run on a loaded machine caught exactly that): so the server ends the tick's
-- session once it sits idle in its transaction longer than %(idle_ms)s ms.
SELECT pg_try_advisory_xact_lock(716341, %(key)s::int) AS leader,
       set_config('idle_in_transaction_session_timeout', %(idle_ms)s::text, true)
           AS idle_limit_ms;

-- name: job_rescue_expired
-- Running jobs whose lease lapsed (by the database clock) go back to 'queued'
-- without using an attempt, with rescues + 1. A job whose cancel was requested ends
-- 'cancelled'.
-- Poison pills: a job that kills (or stalls) every worker that runs it must not take
-- the fleet down forever, but neither may the jobs that merely shared a worker with
-- it. So a job goes to 'dead' only when rescues exceeds %(max_rescues)s AND it was
-- its worker's *only* job. Once rescues reaches quarantine_at (RescueParams) a job is
-- quarantined (job_claim skips it; an idle worker claims it alone through
-- job_claim_quarantined), so a true poison pill soon gets its solo run.
-- SKIP LOCKED: a row being completed right now is left alone; that completion
-- either commits first (then the row is no longer running) or finds its token gone.
WITH expired AS (
    -- rescues and cancel_requested come from here, the locked row (its latest
    -- committed version), never from a second read of the table: that one sees the
    -- statement's snapshot, which misses a cancel that committed while we waited.
    SELECT id, lease_token, lease_worker, started_at, attempt, rescues, cancel_requested
    FROM deadman.jobs
    WHERE state = 'running' AND lease_expires_at < now()
    ORDER BY id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), held AS (
    -- how many jobs each of those workers was running (jobs_running_idx)
    SELECT lease_worker, count(*) AS n
    FROM deadman.jobs
    WHERE state = 'running' AND lease_worker IN (SELECT lease_worker FROM expired)
    GROUP BY lease_worker
), verdict AS (
    SELECT e.*,
           (e.rescues + 1 > %(max_rescues)s AND COALESCE(h.n, 1) = 1) AS poison,
           e.cancel_requested AS cancel
    FROM expired e
    LEFT JOIN held h ON h.lease_worker = e.lease_worker
), rescued AS (
    UPDATE deadman.jobs j
    SET state = CASE WHEN v.cancel THEN 'cancelled'
                     WHEN v.poison THEN 'dead'
                     ELSE 'queued' END,
        rescues = j.rescues + 1,
        attempt = CASE WHEN v.cancel OR v.poison THEN j.attempt ELSE j.attempt - 1 END,
        lease_token = NULL,
        lease_expires_at = NULL,
        finished_at = CASE WHEN v.cancel OR v.poison THEN now() END,
        last_error = CASE WHEN v.cancel THEN 'cancelled while its lease was lost'
                          WHEN v.poison
                          THEN format('lease expired %%s times, the last time while it ran '
                                      'alone (max_rescues %%s): it keeps killing or '
                                      'stalling its worker', j.rescues + 1, %(max_rescues)s)
                          ELSE j.last_error END
    FROM verdict v
    WHERE j.id = v.id
    RETURNING j.id, j.state, j.queue, j.type, v.lease_token, v.lease_worker, v.started_at,
              v.attempt
), history AS (
    INSERT INTO deadman.attempt_log (lease_token, job_id, attempt, worker, started_at,
                                  outcome, error)
    SELECT lease_token, id, attempt, lease_worker, started_at, 'lease_expired',
           'lease expired before the worker finished'
    FROM rescued
)
-- the lapsed lease's token, worker and attempt: what the rescue log line names
SELECT id, state, queue, type, lease_token, lease_worker, attempt FROM rescued;

-- name: job_expire
-- Expirer tick: jobs that never started by their start_by ('expired'), or whose
-- total deadline passed before their next attempt could start ('deadline'), end dead
-- without running. The claim already skips them, so this only makes the verdict
-- visible: at most one expirer tick after the moment. Index range scans on the small
-- partial indexes jobs_start_by_idx and jobs_deadline_idx.
WITH due AS (
    (SELECT id, 'expired' AS reason FROM deadman.jobs
     WHERE start_by IS NOT NULL AND start_by <= now()
       AND state IN ('waiting', 'scheduled', 'queued', 'retrying')
     ORDER BY start_by LIMIT %(limit)s)
    UNION ALL
    (SELECT id, 'deadline' AS reason FROM deadman.jobs
     WHERE deadline IS NOT NULL AND deadline <= now()
       AND state IN ('waiting', 'scheduled', 'queued', 'retrying')
     ORDER BY deadline LIMIT %(limit)s)
), one AS (
    SELECT DISTINCT ON (id) id, reason FROM due ORDER BY id, reason DESC
), locked AS (
    SELECT j.id, o.reason FROM deadman.jobs j JOIN one o ON o.id = j.id
    WHERE j.state IN ('waiting', 'scheduled', 'queued', 'retrying')
    ORDER BY j.id
    FOR UPDATE OF j SKIP LOCKED
)
UPDATE deadman.jobs j
SET state = 'dead', finished_at = now(), last_error = l.reason
FROM locked l
WHERE j.id = l.id
RETURNING j.id, j.state, j.queue;

-- name: jobs_vacuum_due
-- The vacuumer's look (deadman/maintenance/vacuumer.py), statistics only, no lock:
-- deadman.jobs's dead versions, the seconds since a vacuum (ours or autovacuum's)
-- last ended (NULL: never), whether one is under way, and whether this role may
-- vacuum the table at all (the table's or the database's owner, or a member of
-- either: a VACUUM by anyone else only warns and does nothing).
SELECT s.n_dead_tup::bigint AS dead_tuples,
       extract(epoch FROM now() - greatest(s.last_vacuum, s.last_autovacuum))::float8
           AS since_vacuum_s,
       EXISTS (SELECT 1 FROM pg_catalog.pg_stat_progress_vacuum p WHERE p.relid = s.relid)
           AS running,
       (pg_catalog.pg_has_role(c.relowner, 'USAGE')
        OR pg_catalog.pg_has_role(d.datdba, 'USAGE')) AS may_vacuum
FROM pg_catalog.pg_stat_user_tables s
JOIN pg_catalog.pg_class c ON c.oid = s.relid
JOIN pg_catalog.pg_database d ON d.datname = current_database()
WHERE s.relid = 'deadman.jobs'::regclass;

-- name: jobs_vacuum
-- Vacuum the hot table (deadman/maintenance/vacuumer.py, DECISIONS 72), in autocommit
-- on a connection of its own (VACUUM cannot run in a transaction). SKIP_LOCKED: when
-- another vacuum holds the table, this one returns at once with a warning instead of
-- queueing behind it. INDEX_CLEANUP ON: the point is the claim index's dead entries,
-- which the default (AUTO) leaves in place when few heap pages hold dead items.
-- TRUNCATE false: truncating the file's empty tail would take an ACCESS EXCLUSIVE
-- lock, which every claim would wait on. PARALLEL 0: no extra worker processes.
VACUUM (SKIP_LOCKED, INDEX_CLEANUP ON, TRUNCATE false, PARALLEL 0) deadman.jobs;

-- name: job_prune_finished
-- Retention: delete finished jobs older than their state's retention, in batches.
-- The victims are locked first, SKIP LOCKED: a row an operator is retrying or
-- replaying right now is left for the next round. Deleting without locking them
-- first took row locks in no fixed order and waited on each: a DLQ replay that held
-- a dead dependent and then asked for its succeeded upstream (FOR SHARE) deadlocked
-- with a prune deleting both (found by the operators chaos scenario). Locking
-- re-tests each row's WHERE against its latest version, so a job a retry moved dead
-- -> queued and committed meanwhile is no victim; the DELETE tests state and age
-- once more, so the statement stays right on its own (the retention bug of
-- tests/integration/test_race_matrix.py: a DELETE that waited re-tested only its
-- own WHERE, never the CTE that picked the row, and deleted a job after its
-- retry's 200).
WITH succeeded AS (
    SELECT id FROM deadman.jobs
    WHERE state = 'succeeded'
      AND finished_at < now() - %(succeeded_ms)s::bigint * interval '1 millisecond'
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), failed AS (
    SELECT id FROM deadman.jobs
    WHERE state IN ('dead', 'cancelled')
      AND finished_at < now() - %(failed_ms)s::bigint * interval '1 millisecond'
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
DELETE FROM deadman.jobs j
USING (SELECT id FROM succeeded UNION ALL SELECT id FROM failed) AS d
WHERE j.id = d.id
  AND CASE WHEN j.state = 'succeeded'
           THEN j.finished_at < now() - %(succeeded_ms)s::bigint * interval '1 millisecond'
           WHEN j.state IN ('dead', 'cancelled')
           THEN j.finished_at < now() - %(failed_ms)s::bigint * interval '1 millisecond'
           ELSE false END
RETURNING j.id;

-- name: workflow_prune_finished
-- Retention for workflows: a finished workflow goes once it finished longer ago than
-- %(keep_ms)s (the longer of the two job retentions) and none of its nodes is left
-- (job_prune_finished deletes them; the check goes through jobs_workflow_node_uq).
-- Oldest first, in batches, like job_prune_finished. A workflow with a node left is
-- kept: the node can still be retried, which reopens the workflow.
WITH doomed AS (
    SELECT w.id FROM deadman.workflows w
    WHERE w.state <> 'running'
      AND w.finished_at < now() - %(keep_ms)s::bigint * interval '1 millisecond'
      AND NOT EXISTS (SELECT 1 FROM deadman.jobs j WHERE j.workflow_id = w.id)
    ORDER BY w.finished_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
DELETE FROM deadman.workflows w USING doomed d WHERE w.id = d.id
RETURNING w.id;

-- name: xmin_horizon_age
-- How many transactions old the oldest still-running transaction (one with an xid) of
-- the whole cluster is: xmax - xmin of a fresh snapshot. While it grows, vacuum can
-- reclaim no row version newer than it, and a queue table bloats and its claims slow
-- down (BENCHMARKS.md, "a transaction held open"). Read-only, any role may run it;
-- it does not see read-only REPEATABLE READ snapshots (those need pg_stat_activity
-- with pg_read_all_stats).
SELECT (pg_snapshot_xmax(s)::text::bigint - pg_snapshot_xmin(s)::text::bigint) AS age
FROM pg_current_snapshot() AS s;

-- name: job_attempts
SELECT lease_token, job_id, attempt, worker, started_at, finished_at, outcome, error
FROM deadman.attempts WHERE job_id = %(id)s ORDER BY lease_token;

-- name: job_get_many
SELECT * FROM deadman.jobs WHERE id = ANY(%(ids)s::bigint[]) ORDER BY id;

-- name: effect_insert
-- The side-effect handler's effect; runs inside ctx.transaction(), so it commits
-- only together with the fenced completion.
INSERT INTO deadman.effects (job_id, lease_token) VALUES (%(job_id)s, %(lease_token)s);

-- name: effect_count
SELECT count(*) AS n FROM deadman.effects WHERE job_id = %(job_id)s;

-- name: lease_refusal_record
-- Evidence of refused zombie writes (see deadman.lease_refusals).
INSERT INTO deadman.lease_refusals (job_id, lease_token, worker, action)
SELECT * FROM unnest(%(ids)s::bigint[], %(tokens)s::bigint[], %(workers)s::text[],
                     %(actions)s::text[]);

-- ===== HTTP API =====
-- The queries of the API server (deadman/api). It may run as the least-privilege role
-- deadman_api (migrations/0002_api.sql): SELECT, INSERT and UPDATE, never DELETE.

-- name: job_insert_many_returning
-- POST /jobs/batch: many jobs in one statement; the caller runs it in one transaction
-- with the replay lookup below, so a batch is created whole or not at all. As in
-- job_insert, a row whose idempotency key is taken is skipped (ON CONFLICT waits for
-- a concurrent inserter of that key to finish) and the caller reads it by key. Rows
-- are inserted in %(ords)s order, so ids grow with it: that is how the caller matches
-- the returned key-less rows to its input. Jobs with depends_on come with their
-- pending count and upstream error from job_deps_lock, as in job_insert; their edges
-- follow (job_deps_insert_many).
WITH input AS (
    SELECT *
    FROM unnest(%(ords)s::integer[], %(types)s::text[], %(queues)s::text[],
                %(priorities)s::integer[], %(payloads)s::jsonb[], %(max_attempts)s::integer[],
                %(backoffs)s::jsonb[], %(timeouts_ms)s::integer[], %(run_ats)s::timestamptz[],
                %(delays_ms)s::bigint[], %(idempotency_keys)s::text[],
                %(request_hashes)s::text[], %(pending_deps)s::integer[],
                %(upstream_errors)s::text[], %(start_bys)s::timestamptz[],
                %(deadlines)s::timestamptz[], %(heartbeat_timeouts_ms)s::integer[],
                %(limit_keys)s::text[], %(trace_contexts)s::jsonb[])
         AS t(ord, type, queue, priority, payload, max_attempts, backoff, timeout_ms, run_at,
              delay_ms, idempotency_key, request_hash, pending_deps, upstream_error,
              start_by, deadline, heartbeat_timeout_ms, limit_key, trace_context)
), ins AS (
INSERT INTO deadman.jobs (type, queue, priority, payload, state, max_attempts, backoff,
                          timeout_ms, run_at, idempotency_key, request_hash, pending_deps,
                          finished_at, last_error, upstream_cancelled, start_by, deadline,
                          heartbeat_timeout_ms, limit_key, trace_context)
SELECT i.type, i.queue, i.priority, i.payload,
       CASE WHEN i.upstream_error IS NOT NULL THEN 'cancelled'
            WHEN i.pending_deps > 0 THEN 'waiting'
            WHEN r.run_at > now() THEN 'scheduled' ELSE 'queued' END,
       i.max_attempts, i.backoff, i.timeout_ms, r.run_at, i.idempotency_key, i.request_hash,
       CASE WHEN i.upstream_error IS NULL THEN i.pending_deps ELSE 0 END,
       CASE WHEN i.upstream_error IS NOT NULL THEN now() END,
       i.upstream_error, i.upstream_error IS NOT NULL,
       i.start_by, i.deadline, i.heartbeat_timeout_ms, i.limit_key, i.trace_context
FROM input i
CROSS JOIN LATERAL (
    SELECT COALESCE(i.run_at, now() + i.delay_ms * interval '1 millisecond')
) AS r(run_at)
ORDER BY i.ord
ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING *
), woke AS (
    SELECT pg_notify('deadman_jobs', queue) FROM ins
    WHERE state IN ('queued', 'scheduled', 'retrying') GROUP BY queue
)
SELECT ins.* FROM ins WHERE (SELECT count(*) FROM woke) >= 0 ORDER BY ins.id;

-- name: job_deps_insert_many
-- The edges of a batch's jobs with depends_on, as (job, dependency) pairs.
INSERT INTO deadman.job_deps (job_id, depends_on)
SELECT j, d FROM unnest(%(job_ids)s::bigint[], %(depends_on)s::bigint[]) AS t(j, d)
ON CONFLICT DO NOTHING;

-- name: job_get_many_by_idempotency_key
-- The existing jobs behind batch rows that ON CONFLICT skipped (replays, or keys
-- reused for a different request).
SELECT * FROM deadman.jobs WHERE idempotency_key = ANY(%(keys)s::text[]);

-- name: queue_depth_get
-- DEADMAN_MAX_QUEUE_DEPTH: how many jobs wait in a queue, counted no further than the
-- cap, so the check is a short walk of jobs_claim_idx however deep the queue is.
SELECT count(*) AS n
FROM (SELECT 1 FROM deadman.jobs
      WHERE queue = %(queue)s AND state IN ('queued', 'scheduled', 'retrying')
      LIMIT %(cap)s) AS s;

-- name: job_list
-- GET /jobs: newest first, keyset pagination (id < %(before)s), optional filters; a
-- NULL parameter means "no filter". Run unprepared: each execution then gets a plan
-- for its actual values, in which the NULL tests fold away and the matching index
-- (jobs_list_state_idx, jobs_running_idx or the primary key) is walked backwards. A
-- cached generic plan would keep the ORs and could scan the whole table for a rare
-- state.
-- Two branches (migration 0016): jobs_list_state_idx holds no running job, so running
-- jobs (as many as the fleet has slots) come from jobs_running_idx; a filter on
-- another state makes that branch contradict itself and the planner drops it.
-- %(floor)s (migration 0020): a listing by queue or type that can reach succeeded
-- jobs has no index of its own; it reads only ids from %(floor)s up (job_list_floor),
-- a bounded walk of the primary key.
(SELECT * FROM deadman.jobs
 WHERE state <> 'running'
   AND (%(state)s::text IS NULL OR state = %(state)s::text)
   AND (%(type)s::text IS NULL OR type = %(type)s::text)
   AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
   AND (%(before)s::bigint IS NULL OR id < %(before)s::bigint)
   AND (%(floor)s::bigint IS NULL OR id >= %(floor)s::bigint)
 ORDER BY id DESC
 LIMIT %(limit)s)
UNION ALL
(SELECT * FROM deadman.jobs
 WHERE state = 'running'
   AND (%(state)s::text IS NULL OR state = %(state)s::text)
   AND (%(type)s::text IS NULL OR type = %(type)s::text)
   AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
   AND (%(before)s::bigint IS NULL OR id < %(before)s::bigint)
   AND (%(floor)s::bigint IS NULL OR id >= %(floor)s::bigint)
 ORDER BY id DESC
 LIMIT %(limit)s)
ORDER BY id DESC
LIMIT %(limit)s;

-- name: job_list_floor
-- Where a windowed page of job_list stops (migration 0020): the id of the
-- %(window)s-th job below the cursor, counted along the primary key (an index walk
-- of %(window)s entries); no row when fewer jobs are left, and the page reads to the
-- bottom. Counted in jobs, not ids, so that ids retention left empty cost no pages.
-- Unprepared, as job_list.
SELECT id AS floor FROM deadman.jobs
WHERE %(before)s::bigint IS NULL OR id < %(before)s::bigint
ORDER BY id DESC
OFFSET %(window)s::bigint - 1
LIMIT 1;

-- name: job_cancel
-- POST /jobs/{id}/cancel as one guarded statement, so it cannot race a claim (the
-- row lock orders them; a claim's SKIP LOCKED passes over a row being cancelled, and
-- a cancel that waited for a claim re-reads the row and sees it running). A job not
-- yet running ends 'cancelled' at once; a running one keeps its lease with
-- cancel_requested set: its worker's heartbeat sees the flag and cancels the handler,
-- and if that worker is gone the rescuer ends the job 'cancelled'. Every right-hand
-- side reads the row as it was. No row: unknown id, or the job already finished.
-- A running job's worker also hears of it at once: pg_notify('deadman_cancel', id),
-- delivered at commit to every worker's listener (the heartbeat is the fallback).
-- The jobs_state_changed trigger cancels the job's waiting dependents.
WITH c AS (
    UPDATE deadman.jobs
    SET state = CASE WHEN state = 'running' THEN state ELSE 'cancelled' END,
        cancel_requested = (state = 'running'),
        finished_at = CASE WHEN state = 'running' THEN finished_at ELSE now() END,
        last_error = CASE WHEN state = 'running' THEN last_error ELSE 'cancelled' END
    WHERE id = %(id)s AND state NOT IN ('succeeded', 'dead', 'cancelled')
    RETURNING *
)
SELECT c.*, CASE WHEN c.state = 'running' THEN pg_notify('deadman_cancel', c.id::text) END
       AS notified
FROM c;

-- name: job_retry
-- POST /jobs/{id}/retry, the dead-letter replay: a dead or cancelled job goes back to
-- 'queued', due now, with a fresh set of attempts (attempt and rescues 0); to
-- 'waiting' if some of its dependencies have not succeeded yet. Its attempt history
-- and last_error stay. Refused (no row) while a dependency is dead or cancelled:
-- retry that one instead, its upstream-cancelled dependents reopen with it (the
-- jobs_state_changed trigger, migrations/0006). The dependencies are locked FOR
-- SHARE and their latest committed states read, so one finishing right now is
-- either counted as succeeded or releases this job after our commit. Wakes the
-- queue's idle producers (the NOTIFY is sent at commit). No row: unknown id, a state
-- that cannot be retried, or a blocking dependency (job_blocking_deps says which).
WITH deps AS (
    -- a due dependency's claims step past it until our commit: wake its queue then
    SELECT u.state, deadman.wake_if_due(u.state, u.run_at, u.queue) AS notified
    FROM deadman.job_deps d
    JOIN deadman.jobs u ON u.id = d.depends_on
    WHERE d.job_id = %(id)s
    ORDER BY u.id
    FOR SHARE OF u
), verdict AS (
    SELECT count(*) FILTER (WHERE state <> 'succeeded') AS pending,
           bool_or(state IN ('dead', 'cancelled')) AS blocked
    FROM deps
), retried AS (
    SELECT j.* FROM verdict v, deadman.job_rerun(%(id)s, v.pending) j  -- migrations/0012
    WHERE v.blocked IS NOT TRUE
)
SELECT r.*, CASE WHEN r.state = 'queued' THEN pg_notify('deadman_jobs', r.queue) END
       AS notified
FROM retried r;

-- name: job_blocking_deps
-- Why job_retry refused: the job's dependencies that are dead or cancelled.
SELECT u.id, u.state, COALESCE(u.node, 'job ' || u.id) AS name
FROM deadman.job_deps d
JOIN deadman.jobs u ON u.id = d.depends_on
WHERE d.job_id = %(id)s AND u.state IN ('dead', 'cancelled')
ORDER BY u.id;

-- name: queue_list
-- GET /queues, /stats, /metrics, `deadman queues|top` and the dashboard: every queue
-- that has unfinished jobs or a settings row, with its pause flag, exact counts of
-- its unfinished jobs by state, and when its oldest due job became due. Only the
-- unfinished rows are read (jobs_list_state_idx on state = ANY(...), and
-- jobs_running_idx for the running ones: migration 0016), so the cost follows the
-- backlog, never the millions of finished rows retention keeps; finished jobs are
-- counted by job_counts_finished instead, without a queue breakdown.
WITH live AS (
    SELECT queue, state, count(*) AS n,
           min(run_at) FILTER (WHERE state IN ('queued', 'scheduled', 'retrying')
                                 AND run_at <= now()) AS oldest_due_at
    FROM deadman.jobs
    WHERE state IN ('waiting', 'scheduled', 'queued', 'retrying')
    GROUP BY queue, state
    UNION ALL
    SELECT queue, state, count(*), NULL
    FROM deadman.jobs
    WHERE state = 'running'
    GROUP BY queue, state
), names AS (
    SELECT queue AS name FROM live
    UNION
    SELECT name FROM deadman.queues
)
SELECT nm.name, COALESCE(q.paused, false) AS paused,
       COALESCE(jsonb_object_agg(l.state, l.n) FILTER (WHERE l.state IS NOT NULL),
                '{}'::jsonb) AS counts,
       min(l.oldest_due_at) AS oldest_due_at,
       now() AS now
FROM names nm
LEFT JOIN deadman.queues q ON q.name = nm.name
LEFT JOIN live l ON l.queue = nm.name
GROUP BY nm.name, q.paused
ORDER BY nm.name;

-- name: queue_set_paused
-- POST /queues/{name}/pause and /resume. job_claim skips paused queues; submissions
-- to a paused queue are still accepted. A pause is an upsert, so a queue can be
-- paused before its first job exists; a resume deletes the row, so pausing and
-- resuming invented queue names leaves nothing behind (queue_list, and with it
-- /metrics and /queues, would otherwise list every name ever paused). A resume
-- wakes the queue's idle producers (the NOTIFY is sent at commit): they slept on
-- empty claims while it was paused, and would otherwise claim only at their next poll
-- (the race matrix: a claim that read the queue as paused just before this commits).
-- Returns the queue as queue_list shows it (unfinished jobs of this queue only:
-- jobs_claim_idx, jobs_running_idx).
WITH paused AS (
    INSERT INTO deadman.queues (name, paused)
    SELECT %(name)s, true WHERE %(paused)s::boolean
    ON CONFLICT (name) DO UPDATE SET paused = true, updated_at = now()
), resumed AS (
    DELETE FROM deadman.queues WHERE name = %(name)s AND NOT %(paused)s::boolean
    RETURNING pg_notify('deadman_jobs', name)
), live AS (
    SELECT state, count(*) AS n,
           min(run_at) FILTER (WHERE state IN ('queued', 'scheduled', 'retrying')
                                 AND run_at <= now()) AS oldest_due_at
    FROM deadman.jobs
    WHERE queue = %(name)s
      AND state IN ('waiting', 'scheduled', 'queued', 'retrying')
    GROUP BY state
    UNION ALL  -- running jobs are in no listing index (migration 0016)
    SELECT state, count(*), NULL
    FROM deadman.jobs
    WHERE queue = %(name)s AND state = 'running'
    GROUP BY state
)
SELECT %(name)s::text AS name, %(paused)s::boolean AS paused,
       COALESCE((SELECT jsonb_object_agg(state, n) FROM live), '{}'::jsonb) AS counts,
       (SELECT min(oldest_due_at) FROM live) AS oldest_due_at,
       now() AS now;

-- name: worker_list
-- GET /workers: registered worker processes (a worker deregisters when it stops; the
-- rescuer prunes those that stopped beating), with the number of jobs each holds
-- (jobs_running_idx) and whether it beat within %(ttl_ms)s by the database clock.
SELECT w.id, w.hostname, w.pid, w.queues, w.concurrency, w.started_at,
       w.last_heartbeat_at,
       w.last_heartbeat_at >= now() - %(ttl_ms)s::bigint * interval '1 millisecond' AS alive,
       (SELECT count(*) FROM deadman.jobs j
        WHERE j.lease_worker = w.id AND j.state = 'running') AS jobs_held
FROM deadman.workers w
ORDER BY w.id;

-- name: job_counts_finished
-- GET /stats, /metrics: jobs in each finished state, in total (no queue breakdown).
-- These are the big states (retention keeps a day of successes), so they are never
-- counted whole: a count reads no further than %(cap)s + 1 rows (jobs_list_state_idx
-- for dead and cancelled; succeeded rows are not in it since migration 0016 and are
-- the bulk of the table, so its first rows match); past the cap the planner's
-- estimate is used instead, marked `estimated`:
-- the table's live row estimate (reltuples per page, scaled to the current number of
-- pages, as the planner does) times the state's frequency in pg_stats. Estimates are
-- as fresh as the last ANALYZE (autovacuum analyzes the jobs table after 2 percent of it changed).
-- One count per state, each with its state as a constant, so that each can be
-- planned on its own index (jobs_finished_idx for succeeded, jobs_list_state_idx
-- for the others).
WITH capped AS MATERIALIZED (
    SELECT 'succeeded' AS state,  -- in finished_at order: along jobs_finished_idx
           (SELECT count(*) FROM (SELECT 1 FROM deadman.jobs j WHERE j.state = 'succeeded'
                                  ORDER BY j.finished_at
                                  LIMIT %(cap)s::bigint + 1) AS s) AS n
    UNION ALL
    SELECT 'dead',
           (SELECT count(*) FROM (SELECT 1 FROM deadman.jobs j WHERE j.state = 'dead'
                                  LIMIT %(cap)s::bigint + 1) AS s)
    UNION ALL
    SELECT 'cancelled',
           (SELECT count(*) FROM (SELECT 1 FROM deadman.jobs j WHERE j.state = 'cancelled'
                                  LIMIT %(cap)s::bigint + 1) AS s)
), rel AS (
    SELECT CASE WHEN c.relpages > 0 AND c.reltuples >= 0
                THEN c.reltuples / c.relpages
                     * (pg_relation_size(c.oid) / current_setting('block_size')::bigint)
                ELSE 0 END AS rows
    FROM pg_class c WHERE c.oid = 'deadman.jobs'::regclass
), freq AS (
    SELECT v.state, v.freq
    FROM pg_stats s,
         unnest(s.most_common_vals::text::text[], s.most_common_freqs) AS v(state, freq)
    WHERE s.schemaname = 'deadman' AND s.tablename = 'jobs' AND s.attname = 'state'
)
SELECT c.state,
       CASE WHEN c.n <= %(cap)s THEN c.n
            ELSE greatest(round(rel.rows * COALESCE(f.freq, 0))::bigint, c.n) END AS n,
       c.n > %(cap)s AS estimated
FROM capped c CROSS JOIN rel LEFT JOIN freq f ON f.state = c.state
ORDER BY c.state;

-- ===== Operating (CLI, dashboard, metrics) =====

-- name: job_retry_dead_many
-- `deadman dlq replay --all/--type/--queue` and the dashboard's bulk replay: up to
-- %(limit)s dead jobs (NULL filter: any) go back as job_retry sends one: 'queued', or
-- 'waiting' while dependencies are unfinished; a job with a dead or cancelled
-- dependency is skipped (replay that one). Returns every picked id with `replayed`,
-- so the caller's cursor moves past skipped ones; it loops until a batch comes back
-- short, so each batch is a short transaction: replaying a million dead letters never
-- holds a million row locks or one giant WAL record. Oldest first along
-- jobs_list_state_idx (state, id); run unprepared (see job_list). pg_notify per row
-- is cheap: Postgres delivers identical notifications of one transaction once, i.e.
-- once per queue per batch.
WITH picked AS (
    SELECT id FROM deadman.jobs
    WHERE state = 'dead'
      AND (%(type)s::text IS NULL OR type = %(type)s::text)
      AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
      AND (%(after)s::bigint IS NULL OR id > %(after)s::bigint)
    ORDER BY id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), deps AS (
    -- the picked jobs' dependencies, through the primary key (`id = ANY`), locked
    -- (a due one's claims step past it until our commit: wake its queue then)
    SELECT u.id, u.state, deadman.wake_if_due(u.state, u.run_at, u.queue) AS notified
    FROM deadman.jobs u
    WHERE u.id = ANY(ARRAY(SELECT d.depends_on FROM deadman.job_deps d
                           JOIN picked p ON p.id = d.job_id))
    ORDER BY u.id
    FOR SHARE OF u
), verdict AS (
    SELECT p.id,
           count(u.state) FILTER (WHERE u.state <> 'succeeded') AS pending,
           COALESCE(bool_or(u.state IN ('dead', 'cancelled')), false) AS blocked
    FROM picked p
    LEFT JOIN deadman.job_deps d ON d.job_id = p.id
    LEFT JOIN deps u ON u.id = d.depends_on
    GROUP BY p.id
), retried AS (
    SELECT j.id, j.queue, j.state
    FROM verdict v, deadman.job_rerun(v.id, v.pending) j  -- as job_retry does
    WHERE NOT v.blocked
)
SELECT p.id, r.id IS NOT NULL AS replayed,
       CASE WHEN r.state = 'queued' THEN pg_notify('deadman_jobs', r.queue) END AS notified
FROM picked p LEFT JOIN retried r ON r.id = p.id
ORDER BY p.id;

-- name: throughput_recent
-- `deadman top` and the dashboard's sparklines: finished jobs per minute and queue
-- over the last %(minutes)s minutes (from the recent_throughput view, which walks
-- jobs_finished_idx over that hour only, never the whole table).
SELECT minute, queue, state, jobs
FROM deadman.recent_throughput
WHERE minute > now() - %(minutes)s::integer * interval '1 minute'
ORDER BY minute, queue, state;

-- ===== Workflows =====
-- A workflow's nodes are jobs (workflow_id, node); its edges are job_deps rows.
-- Releasing, cascading and finalising happen in the jobs_state_changed trigger
-- (migrations/0005, 0006).

-- name: workflow_insert
-- The workflow, every node and every edge in one statement. A node with dependencies
-- starts 'waiting' with pending_deps = its in-degree; the others are due (or
-- scheduled) at once. Edges are resolved by node name through the nodes just
-- inserted. With an Idempotency-Key that is already taken nothing is inserted and no
-- row comes back (ON CONFLICT waits for a concurrent inserter's commit, so the
-- caller's next statement sees its workflow).
WITH wf AS (
    INSERT INTO deadman.workflows (name, nodes, unfinished, idempotency_key, request_hash)
    VALUES (%(name)s, %(nodes_count)s, %(nodes_count)s, %(idempotency_key)s,
            %(request_hash)s)
    ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING *
), input AS (
    SELECT *
    FROM unnest(%(ords)s::integer[], %(nodes)s::text[], %(types)s::text[], %(queues)s::text[],
                %(priorities)s::integer[], %(payloads)s::jsonb[], %(max_attempts)s::integer[],
                %(backoffs)s::jsonb[], %(timeouts_ms)s::integer[], %(run_ats)s::timestamptz[],
                %(delays_ms)s::bigint[], %(pending)s::integer[], %(has_dependents)s::boolean[],
                %(start_bys)s::timestamptz[], %(deadlines)s::timestamptz[],
                %(heartbeat_timeouts_ms)s::integer[], %(limit_keys)s::text[],
                %(trace_contexts)s::jsonb[])
         AS t(ord, node, type, queue, priority, payload, max_attempts, backoff, timeout_ms,
              run_at, delay_ms, pending, has_dependents, start_by, deadline,
              heartbeat_timeout_ms, limit_key, trace_context)
), inserted AS (
    INSERT INTO deadman.jobs (workflow_id, node, type, queue, priority, payload, state,
                              max_attempts, backoff, timeout_ms, run_at, pending_deps,
                              has_dependents, start_by, deadline, heartbeat_timeout_ms,
                              limit_key, trace_context)
    SELECT wf.id, i.node, i.type, i.queue, i.priority, i.payload,
           CASE WHEN i.pending > 0 THEN 'waiting'
                WHEN r.run_at > now() THEN 'scheduled' ELSE 'queued' END,
           i.max_attempts, i.backoff, i.timeout_ms, r.run_at, i.pending, i.has_dependents,
           i.start_by, i.deadline, i.heartbeat_timeout_ms, i.limit_key, i.trace_context
    FROM wf CROSS JOIN input i
    CROSS JOIN LATERAL (
        SELECT COALESCE(i.run_at, now() + i.delay_ms * interval '1 millisecond')
    ) AS r(run_at)
    ORDER BY i.ord
    RETURNING id, node, queue, state
), woke AS (
    SELECT pg_notify('deadman_jobs', queue) FROM inserted
    WHERE state IN ('queued', 'scheduled', 'retrying') GROUP BY queue
), edges AS (
    INSERT INTO deadman.job_deps (job_id, depends_on)
    SELECT t.id, f.id
    FROM unnest(%(froms)s::text[], %(tos)s::text[]) AS e(src, dst)
    JOIN inserted f ON f.node = e.src
    JOIN inserted t ON t.node = e.dst
)
SELECT * FROM wf WHERE (SELECT count(*) FROM woke) >= 0;

-- name: workflow_get_by_idempotency_key
SELECT * FROM deadman.workflows WHERE idempotency_key = %(idempotency_key)s;

-- name: workflow_get
SELECT * FROM deadman.workflows WHERE id = %(id)s;

-- name: workflow_nodes
-- A workflow's jobs, in the order they were given (jobs_workflow_node_uq).
SELECT * FROM deadman.jobs WHERE workflow_id = %(id)s ORDER BY id;

-- name: workflow_cancel
-- POST /workflows/{id}/cancel: job_cancel for every unfinished node at once. Nodes
-- not running end 'cancelled' now; running ones get cancel_requested and a
-- deadman_cancel notification. The workflow finalises when its last node ends.
-- Rows are locked in id order, as everywhere else.
WITH l AS (
    SELECT id FROM deadman.jobs
    WHERE workflow_id = %(id)s AND state NOT IN ('succeeded', 'dead', 'cancelled')
    ORDER BY id
    FOR UPDATE
), c AS (
    UPDATE deadman.jobs j
    SET state = CASE WHEN j.state = 'running' THEN j.state ELSE 'cancelled' END,
        cancel_requested = (j.state = 'running'),
        finished_at = CASE WHEN j.state = 'running' THEN j.finished_at ELSE now() END,
        last_error = CASE WHEN j.state = 'running' THEN j.last_error
                          ELSE 'workflow cancelled' END
    FROM l
    WHERE j.id = l.id AND j.state NOT IN ('succeeded', 'dead', 'cancelled')
    RETURNING j.id, j.state
)
SELECT c.id, c.state,
       CASE WHEN c.state = 'running' THEN pg_notify('deadman_cancel', c.id::text) END
       AS notified
FROM c;

-- name: limit_put
-- PUT /limits/{key}: create or replace a limit; it applies from the next claim (the
-- claim reads it under its row lock). Returns it with its live state.
WITH up AS (
    INSERT INTO deadman.limits (key, concurrency, rate_count, rate_per_ms)
    VALUES (%(key)s, %(concurrency)s, %(rate_count)s, %(rate_per_ms)s)
    ON CONFLICT (key) DO UPDATE
    SET concurrency = EXCLUDED.concurrency, rate_count = EXCLUDED.rate_count,
        rate_per_ms = EXCLUDED.rate_per_ms, updated_at = now()
    RETURNING *
)
SELECT key, concurrency, rate_count, rate_per_ms,
       deadman.limit_running(key) AS running,
       deadman.limit_available(key, rate_count, rate_per_ms, clock_timestamp()) AS available
FROM up;

-- name: limit_list
-- GET /limits: every limit and its live state, by key (at most %(cap)s).
SELECT * FROM deadman.limit_state ORDER BY key LIMIT %(cap)s;

-- name: limit_get
SELECT * FROM deadman.limit_state WHERE key = %(key)s;

-- name: limit_delete
-- DELETE /limits/{key}: its jobs run unlimited from the next claim; its start log goes
-- with it (ON DELETE CASCADE).
DELETE FROM deadman.limits WHERE key = %(key)s RETURNING key;

-- name: schedule_put
-- PUT /schedules/{name}: create or replace a schedule's definition; a replaced one keeps
-- whether it is paused and what it last fired. Returns it, and whether it is new.
INSERT INTO deadman.schedules (name, cron, every_ms, timezone, job, catch_up, next_fire_at)
VALUES (%(name)s, %(cron)s, %(every_ms)s, %(timezone)s, %(job)s, %(catch_up)s,
        %(next_fire_at)s)
ON CONFLICT (name) DO UPDATE
SET cron = EXCLUDED.cron, every_ms = EXCLUDED.every_ms, timezone = EXCLUDED.timezone,
    job = EXCLUDED.job, catch_up = EXCLUDED.catch_up, next_fire_at = EXCLUDED.next_fire_at,
    updated_at = now()
RETURNING *, (xmax = 0) AS created;

-- name: schedule_declare
-- Registry.periodic at worker start: the same as schedule_put, except that a schedule
-- whose definition did not change keeps its next tick (a fleet restarting one worker
-- at a time must not move it, and every worker declares it).
INSERT INTO deadman.schedules (name, cron, every_ms, timezone, job, catch_up, next_fire_at)
VALUES (%(name)s, %(cron)s, %(every_ms)s, %(timezone)s, %(job)s, %(catch_up)s,
        %(next_fire_at)s)
ON CONFLICT (name) DO UPDATE
SET cron = EXCLUDED.cron, every_ms = EXCLUDED.every_ms, timezone = EXCLUDED.timezone,
    job = EXCLUDED.job, catch_up = EXCLUDED.catch_up, updated_at = now(),
    next_fire_at = CASE
        WHEN (schedules.cron, schedules.every_ms, schedules.timezone)
             IS NOT DISTINCT FROM (EXCLUDED.cron, EXCLUDED.every_ms, EXCLUDED.timezone)
        THEN schedules.next_fire_at ELSE EXCLUDED.next_fire_at END
RETURNING *, (xmax = 0) AS created;

-- name: schedule_list
SELECT *, false AS created FROM deadman.schedules ORDER BY name LIMIT %(cap)s;

-- name: schedule_get
SELECT *, false AS created FROM deadman.schedules WHERE name = %(name)s;

-- name: schedule_delete
DELETE FROM deadman.schedules WHERE name = %(name)s RETURNING name;

-- name: schedule_set_paused
-- POST /schedules/{name}/pause and /resume. A resumed schedule does not fire the
-- ticks it slept through: the scheduler treats them as missed (catch_up).
UPDATE deadman.schedules SET paused = %(paused)s, updated_at = now()
WHERE name = %(name)s
RETURNING *, false AS created;

-- name: schedule_due
-- The scheduler's tick (as the leader, in its transaction): schedules whose next tick
-- has come, locked until the tick commits (SKIP LOCKED: a second scheduler that
-- somehow runs at once takes other rows, never the same one). With the clock the
-- plan is made against.
SELECT *, false AS created, now() AS db_now
FROM deadman.schedules
WHERE NOT paused AND next_fire_at <= now()
ORDER BY next_fire_at
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED;

-- name: schedule_fired
-- In the same transaction as the ticks' jobs: the schedule moves on. A tick is
-- enqueued exactly once because its job carries the key schedule:<name>:<tick>
-- (jobs_idempotency_key_uq) and next_fire_at moves past it in the same commit.
UPDATE deadman.schedules
SET next_fire_at = %(next_fire_at)s,
    last_fire_at = COALESCE(%(last_fire_at)s, last_fire_at),
    last_job_id = COALESCE(%(last_job_id)s, last_job_id)
WHERE name = %(name)s;

-- name: db_now
-- The database's clock: a new schedule's first tick is counted from it, as every
-- later one is (the scheduler plans against schedule_due's now()).
SELECT now() AS now;

-- name: server_identity
-- Which database a connection is on, for conn= (deadman.connections): a caller's
-- connection must reach the client's own database. Readable by any role (the cluster's
-- system_identifier may not be: pg_control_system() can be revoked); the postmaster's
-- start time tells two servers apart, read afresh on both sides for each comparison.
SELECT current_database() AS database, pg_postmaster_start_time() AS started_at;

-- name: job_insert_grouped
-- POST /jobs under group commit (deadman/api/group_commit.py): the single submissions
-- that arrived while the previous group was being written, in one statement, so in
-- one transaction and one WAL flush; each request is answered once it returns. Jobs
-- without depends_on only (those go through job_insert, with their locks). As in
-- job_insert, a row whose idempotency key is taken is skipped (ON CONFLICT waits for
-- a concurrent inserter of that key to finish) and its caller reads the existing job
-- by key. Keys are unique within one group, and the caller orders keyed rows by key
-- (ord): two groups inserting the same keys take them in the same order, so they
-- wait on each other instead of deadlocking. Rows are inserted in ord order, so ids
-- grow with it: that is how key-less rows are matched to their callers.
-- The group is one JSON array of objects, as job_finish_many's batch (psycopg adapts
-- parameter arrays element by element in Python); a payload of JSON null is stored
-- as jsonb null, as job_insert stores it, not as SQL NULL.
WITH ins AS (
INSERT INTO deadman.jobs (type, queue, priority, payload, state, max_attempts, backoff,
                          timeout_ms, run_at, idempotency_key, request_hash, start_by,
                          deadline, heartbeat_timeout_ms, limit_key, trace_context)
SELECT i.type, i.queue, i.priority, COALESCE(i.payload, 'null'::jsonb),
       CASE WHEN r.run_at > now() THEN 'scheduled' ELSE 'queued' END,
       i.max_attempts, i.backoff, i.timeout_ms, r.run_at, i.idempotency_key, i.request_hash,
       i.start_by, i.deadline, i.heartbeat_timeout_ms, i.limit_key, i.trace_context
FROM json_to_recordset(%(group)s::json)
     AS i(ord integer, type text, queue text, priority integer, payload jsonb,
          max_attempts integer, backoff jsonb, timeout_ms integer, run_at timestamptz,
          delay_ms bigint, idempotency_key text, request_hash text, start_by timestamptz,
          deadline timestamptz, heartbeat_timeout_ms integer, limit_key text,
          trace_context jsonb)
CROSS JOIN LATERAL (
    SELECT COALESCE(i.run_at, now() + i.delay_ms * interval '1 millisecond')
) AS r(run_at)
ORDER BY i.ord
ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING *
), woke AS (
    SELECT pg_notify('deadman_jobs', queue) FROM ins
    WHERE state IN ('queued', 'scheduled', 'retrying') GROUP BY queue
)
SELECT ins.* FROM ins WHERE (SELECT count(*) FROM woke) >= 0 ORDER BY ins.id;
