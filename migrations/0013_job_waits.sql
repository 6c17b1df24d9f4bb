-- Waiting for a job to end (deadman.waiting: Waiter, AsyncWaiter; GET /jobs/{id}?wait_ms=N).
-- DECISIONS 40 says why it is built this way.
--
-- A waiter LISTENs on deadman_done first, then sets `waited` on the job (job_wait_flag)
-- and reads it back: a job already ended is answered at once; any statement that ends
-- it later updates the row version that carries waited = true (an UPDATE always
-- applies to the latest committed version), so the trigger below fires and the
-- notification is sent at its commit, to a waiter that is listening by then.
--
-- A job nobody waits on costs nothing more: the trigger's WHEN is evaluated on the new
-- row without calling the function, and no NOTIFY is queued, so a finishing
-- transaction takes no notify-queue lock at its commit. Not indexed: renewals and
-- finishes stay HOT updates. Adding a NOT NULL column with a constant default
-- rewrites nothing (a catalog change).
ALTER TABLE deadman.jobs ADD COLUMN waited boolean NOT NULL DEFAULT false;

-- Every path that ends a job is covered: the completer, ctx.transaction(), the
-- rescuer (poison pills), the expirer, cancels (one job, a workflow, the trigger's
-- cascade downstream). Identical notifications of one transaction are folded into one.
CREATE FUNCTION deadman.notify_job_done() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('deadman_done', NEW.id::text);
    RETURN NULL;
END
$$;

CREATE TRIGGER jobs_notify_done
    AFTER UPDATE OF state ON deadman.jobs
    FOR EACH ROW
    WHEN (NEW.waited AND NEW.state IN ('succeeded', 'dead', 'cancelled'))
    EXECUTE FUNCTION deadman.notify_job_done();

-- The API's long-poll flags the jobs it waits on. deadman_api already holds UPDATE on
-- the whole table (0002: cancel, retry); the column grant states what the long-poll
-- needs, so that narrowing the table grant one day keeps it working.
GRANT UPDATE (waited) ON deadman.jobs TO deadman_api;
