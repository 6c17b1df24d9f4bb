-- A resume deletes the queue's settings row (queue_set_paused): pausing and
-- resuming invented queue names used to leave a row per name behind, listed by
-- /queues and exported as ~7 /metrics series each, for ever. The API role may
-- delete these settings rows, and still never a job (0002_api.sql).
GRANT DELETE ON deadman.queues TO deadman_api;
