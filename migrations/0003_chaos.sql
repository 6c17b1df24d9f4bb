-- The chaos harness's evidence table (`deadman chaos`): one row per handler
-- invocation of a chaos job, written in autocommit on a connection of its own BEFORE
-- the handler's fenced transaction. It therefore survives the attempt's rollback, a
-- SIGKILL or a lost lease: the verifier counts duplicate executions from it, which
-- must be greater than zero in a run with kills (otherwise the run proved nothing).
-- Nothing in Deadman itself reads or writes it.
CREATE TABLE deadman.chaos_invocations (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id       bigint      NOT NULL,
    lease_token  bigint      NOT NULL,
    worker       text        NOT NULL,
    at           timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX chaos_invocations_job_idx ON deadman.chaos_invocations (job_id);
