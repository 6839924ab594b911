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
-- The heartbeat of the given workers (a worker that unregistered or was pruned is absent),
-- with their slots and how many hung runs hold (as their last beat counted them; slots
-- NULL for a worker of a release that does not count them).
SELECT w.id, w.last_heartbeat, now() - w.last_heartbeat AS age, t.slots,
       coalesce(t.hung_slots, 0)
  FROM procrastinate_workers w
  LEFT JOIN pgstage_worker_tasks t ON t.worker_id = w.id
 WHERE w.id = ANY(%(worker_ids)s)

-- last_heartbeat --
-- The newest heartbeat of any registered worker, against the database's clock (hosts'
-- clocks may disagree); NULL when no worker is registered.
SELECT (SELECT max(last_heartbeat) FROM procrastinate_workers) AS last_heartbeat, now() AS now
