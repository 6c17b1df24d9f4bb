-- pgbench script (bench.pgbench_ceiling): what a job's life costs at the SQL level at
-- its least, in batches of :batch (pgbench -D batch=N), three durable commits per
-- batch, as a queue needs at least: the submission, the claim, the finish.
-- Run with -M prepared: :ids is then a parameter, a text array cast to bigint[].
INSERT INTO bench_lifecycle (state) SELECT 'queued' FROM generate_series(1, :batch);
WITH claimed AS (
    SELECT id FROM bench_lifecycle
    WHERE state = 'queued' AND run_at <= now()
    ORDER BY run_at, id
    LIMIT :batch
    FOR UPDATE SKIP LOCKED
), started AS (
    UPDATE bench_lifecycle j SET state = 'running' FROM claimed c WHERE j.id = c.id
    RETURNING j.id
)
SELECT coalesce(array_agg(id), '{}')::text AS ids FROM started
\gset
UPDATE bench_lifecycle SET state = 'done', finished_at = now(), finishes = finishes + 1
WHERE id = ANY (:ids::bigint[]) AND state = 'running';
