-- The limits scenario's verifier: plain SQL over the attempt history, run after the
-- fleet has drained. It reads when each attempt of a keyed job started and ended
-- (deadman.attempts, and the jobs still running), never the implementation's own
-- bookkeeping (not deadman.limit_starts, not deadman.limit_running, not the limit
-- rows): the limits it judges against are the ones the harness set, as parameters,
-- one array element per key, NULL where the key has no bound of that kind. To run
-- one in psql, e.g.
--   %(keys)s        -> ARRAY['chaos-c3', 'chaos-r50']
--   %(concurrency)s -> ARRAY[3, NULL]::int[]
--   %(rate_count)s  -> ARRAY[NULL, 50]::int[]
--   %(rate_per_ms)s -> ARRAY[NULL, 1000]::int[]
--
-- Why the recorded times can be trusted for this: a slot is held from the claim's
-- commit to the commit of the statement that ends the attempt (a finish, or the
-- rescue of a lapsed lease). started_at is the claim's clock_timestamp(), read
-- inside its deciding statement after its snapshot, so before its commit;
-- finished_at is now() of the ending transaction, its start, so before its commit.
-- A claim that took a freed slot saw the end committed, so that end's finished_at
-- precedes the claim's started_at. Each recorded interval [started_at, finished_at)
-- thus lies inside the time its slot was really held: overlaps of recorded
-- intervals can only be fewer than the real ones, never more; a count above a limit
-- is a limit exceeded. A rate's starts are the claims' stamps themselves.

-- name: limit_peaks
-- By key: the most attempts open at one instant (the slots held), and the most
-- starts in one window of its rate, both by one sweep over marks ordered in time.
-- A killed worker's attempt stays open until the rescuer ends it: that is when its
-- slot frees (the rescue writes its finished_at). An attempt still running holds its
-- slot for as long as anyone can see ('infinity').
-- A start at s lies in the window (t - per_ms, t] exactly when t is in
-- [s, s + per_ms): the most starts in any window is the most of those spans open at
-- once, the same sweep as the slots.
-- An end at t closes before a start at t opens (the intervals are half-open), so a
-- slot handed on at one instant is not counted twice. An attempt that ends at or
-- before its start would close before it opens and hide an overlap from the sweep:
-- such attempts are counted in ``backwards`` (the check fails on any).
WITH lim AS (
    SELECT *
    FROM unnest(%(keys)s::text[], %(concurrency)s::int[], %(rate_count)s::int[],
                %(rate_per_ms)s::int[]) AS l (key, concurrency, rate_count, rate_per_ms)
), spans AS (
    SELECT j.limit_key AS key, a.started_at, a.finished_at
    FROM deadman.attempts a
    JOIN deadman.jobs j ON j.id = a.job_id
    WHERE j.limit_key = ANY (%(keys)s::text[])
    UNION ALL
    SELECT limit_key, started_at, 'infinity'::timestamptz
    FROM deadman.jobs
    WHERE state = 'running' AND limit_key = ANY (%(keys)s::text[])
), marks AS (
    SELECT s.key, 'slot' AS kind, m.at, m.step
    FROM spans s
    CROSS JOIN LATERAL (VALUES (s.started_at, 1), (s.finished_at, -1)) AS m (at, step)
    WHERE s.finished_at > s.started_at
    UNION ALL
    SELECT s.key, 'start', m.at, m.step
    FROM spans s
    JOIN lim l ON l.key = s.key AND l.rate_per_ms IS NOT NULL
    CROSS JOIN LATERAL (VALUES (s.started_at, 1),
                               (s.started_at + l.rate_per_ms * interval '1 millisecond', -1))
        AS m (at, step)
), open AS (
    SELECT key, kind, at,
           sum(step) OVER (PARTITION BY key, kind ORDER BY at, step
                           ROWS UNBOUNDED PRECEDING) AS n
    FROM marks
), peaks AS (
    -- the first instant each peak was reached
    SELECT DISTINCT ON (key, kind) key, kind, n, at
    FROM open
    ORDER BY key, kind, n DESC, at
)
SELECT l.key, l.concurrency, l.rate_count, l.rate_per_ms,
       COALESCE(slot.n, 0) AS peak_running,
       slot.at AS peak_running_at,
       COALESCE(start.n, 0) AS most_starts_in_window,
       start.at AS busiest_window_ends_at,
       (SELECT count(*) FROM spans s
        WHERE s.key = l.key AND s.finished_at <= s.started_at) AS backwards
FROM lim l
LEFT JOIN peaks slot ON slot.key = l.key AND slot.kind = 'slot'
LEFT JOIN peaks start ON start.key = l.key AND start.kind = 'start'
ORDER BY l.key;

-- name: limit_jobs
-- By key: its jobs and how they ended, their attempts and rescues, and their
-- duplicate executions (invocations logged beyond one per job).
WITH runs AS (
    SELECT job_id, count(*) AS n FROM deadman.chaos_invocations GROUP BY job_id
), tries AS (
    SELECT job_id, count(*) AS n, count(*) FILTER (WHERE outcome = 'lease_expired') AS rescued
    FROM deadman.attempts
    GROUP BY job_id
)
SELECT l.key,
       count(j.id) AS jobs,
       count(j.id) FILTER (WHERE j.state = 'succeeded') AS succeeded,
       count(j.id) FILTER (WHERE j.state NOT IN ('succeeded', 'dead', 'cancelled'))
           AS unfinished,
       COALESCE(sum(t.n), 0) AS attempts,
       COALESCE(sum(t.rescued), 0) AS rescues,
       count(r.job_id) FILTER (WHERE r.n > 1) AS jobs_run_more_than_once,
       COALESCE(sum(r.n - 1) FILTER (WHERE r.n > 1), 0) AS duplicate_invocations
FROM unnest(%(keys)s::text[]) AS l (key)
LEFT JOIN deadman.jobs j ON j.limit_key = l.key
LEFT JOIN runs r ON r.job_id = j.id
LEFT JOIN tries t ON t.job_id = j.id
GROUP BY l.key
ORDER BY l.key;

-- name: limit_open_at
-- The attempts of a key open at one instant (a peak limit_peaks found), for a
-- failure's detail: which jobs, on which workers, from when to when.
SELECT a.lease_token, a.job_id, a.worker, a.started_at, a.finished_at, a.outcome
FROM deadman.attempts a
JOIN deadman.jobs j ON j.id = a.job_id
WHERE j.limit_key = %(key)s AND a.started_at <= %(at)s AND a.finished_at > %(at)s
UNION ALL
SELECT lease_token, id, lease_worker, started_at, NULL, 'running'
FROM deadman.jobs
WHERE limit_key = %(key)s AND state = 'running' AND started_at <= %(at)s
ORDER BY started_at
LIMIT 20;
