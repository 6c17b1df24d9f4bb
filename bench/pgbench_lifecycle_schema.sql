-- The table bench/pgbench_lifecycle.sql runs against (bench.pgbench_ceiling): a plain,
-- logged table of its own on the benchmark's durable cluster, with the least a job
-- queue needs: an id, a state, a due time, the finish, and a count of finishes so
-- the run can check that no job finished twice. The partial index is the claim's:
-- due queued jobs in order, as deadman.jobs_claim_idx is Deadman's.
DROP TABLE IF EXISTS bench_lifecycle;
CREATE TABLE bench_lifecycle (
    id          bigserial   PRIMARY KEY,
    state       text        NOT NULL DEFAULT 'queued',
    run_at      timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz,
    finishes    integer     NOT NULL DEFAULT 0
);
CREATE INDEX bench_lifecycle_claim_idx ON bench_lifecycle (run_at, id) WHERE state = 'queued';
