-- Named queries of the hosts scenario (deadman/chaos/hosts_scenario.py).

-- name: hosts_lease_margins
-- The live leases of the skewed host's workers (by pid): how many, and the least and
-- most seconds until one lapses, on the database's clock. A worker that reckoned its
-- leases on its own clock would show hours here.
SELECT count(j.id) AS leases,
       min(extract(epoch FROM j.lease_expires_at - clock_timestamp()))::float8 AS min_left_s,
       max(extract(epoch FROM j.lease_expires_at - clock_timestamp()))::float8 AS max_left_s
FROM deadman.jobs j
JOIN deadman.workers w ON w.id = j.lease_worker
WHERE j.state = 'running' AND w.pid = ANY(%(pids)s);
