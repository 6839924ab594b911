-- readiness --
-- One round trip for /readyz: how many of the code's latest migrations the database has,
-- and the newest worker heartbeat (procrastinate's workers beat every 10 s; the index on
-- last_heartbeat makes max() one index probe).
SELECT
    (SELECT count(*)
       FROM django_migrations
      WHERE (app || '.' || name) = ANY(%(leaves)s)) AS applied_leaves,
    (SELECT max(last_heartbeat) FROM procrastinate_workers) AS last_heartbeat,
    now() AS now

-- worker_heartbeats --
-- The heartbeat of the given workers (a worker that unregistered or was pruned is absent).
SELECT id, last_heartbeat, now() - last_heartbeat AS age
  FROM procrastinate_workers
 WHERE id = ANY(%(worker_ids)s)

-- last_heartbeat --
-- The newest heartbeat of any registered worker, against the database's clock (hosts'
-- clocks may disagree); NULL when no worker is registered.
SELECT (SELECT max(last_heartbeat) FROM procrastinate_workers) AS last_heartbeat, now() AS now
