-- Named queries of deadman.shards (parsed by deadman.db.queries.parse). They read and
-- set the id range of one shard's database; nothing here touches a job.

-- name: shard_id_ranges
-- The range each id sequence of this database draws from, and how far it got
-- (last_value NULL: never drawn). A shard is initialised when both sequences are
-- confined to its range; the client checks that once per shard before routing to it.
SELECT sequencename AS name, min_value, max_value, last_value
  FROM pg_sequences
 WHERE schemaname = 'deadman' AND sequencename IN ('jobs_id_seq', 'workflows_id_seq')
 ORDER BY sequencename;

-- name: shard_range_given
-- The range for shard_set_range, as transaction-local settings: a DO block takes no
-- parameters, so the values reach it this way and are never spliced into the text.
SELECT set_config('deadman.shard_first', %(first)s::text, true),
       set_config('deadman.shard_last', %(last)s::text, true);

-- name: shard_set_range
-- One-time (idempotent) step of `deadman shards init`: confine the jobs and workflows
-- id sequences to [first, last], so an id names its shard (id >> 48) and two shards
-- can never hand out the same id; MAXVALUE turns running out of the range into an
-- error instead of a collision. A sequence still below the range restarts at its
-- start; one already inside keeps going (shard 0 can be an existing single-primary
-- database: its ids stay as they are); one beyond it belongs to another shard's range
-- and is refused, before anything is changed.
DO $$
DECLARE
    first bigint := current_setting('deadman.shard_first')::bigint;
    last bigint := current_setting('deadman.shard_last')::bigint;
    seq text;
    top bigint;
BEGIN
    FOREACH seq IN ARRAY ARRAY['jobs_id_seq', 'workflows_id_seq'] LOOP
        SELECT coalesce(s.last_value, 0) INTO top
          FROM pg_sequences s WHERE s.schemaname = 'deadman' AND s.sequencename = seq;
        IF top IS NULL THEN
            RAISE EXCEPTION 'no sequence deadman.%: is the database migrated?', seq;
        END IF;
        IF top > last THEN
            RAISE EXCEPTION 'deadman.% is at %, past this shard''s range [%, %]: '
                'this database holds ids of another shard', seq, top, first, last;
        END IF;
    END LOOP;
    FOREACH seq IN ARRAY ARRAY['jobs_id_seq', 'workflows_id_seq'] LOOP
        SELECT coalesce(s.last_value, 0) INTO top
          FROM pg_sequences s WHERE s.schemaname = 'deadman' AND s.sequencename = seq;
        IF top < first THEN
            EXECUTE format('ALTER SEQUENCE deadman.%I MINVALUE %s MAXVALUE %s START WITH %s RESTART WITH %s',
                           seq, first, last, first, first);
        ELSE
            EXECUTE format('ALTER SEQUENCE deadman.%I MINVALUE %s MAXVALUE %s START WITH %s',
                           seq, first, last, first);
        END IF;
    END LOOP;
END
$$;
