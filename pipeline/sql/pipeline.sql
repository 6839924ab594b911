-- replay_reset --
-- Reopen successful stages for an audited replay: compare-and-set on 'success', so of two
-- concurrent replays only the first reopens a row (the second finds it reopened already).
-- The row becomes claimable ('failed' with the replay as its reason); attempts stay, so
-- the fencing tokens keep growing.
UPDATE pipeline_runs
   SET status = 'failed', error = %(reason)s, finished_at = now(), lease_expires_at = NULL
 WHERE tenant_id = %(tenant_id)s
   AND anfrage_id = %(anfrage_id)s
   AND stage = ANY(%(stages)s)
   AND status = 'success'
RETURNING stage;

-- replayable_runs --
-- Runs of one stage that need a replay: failed, or abandoned while running (lease
-- expired, its job gone), whose earlier stages all succeeded. Oldest first.
SELECT r.tenant_id, r.anfrage_id
  FROM pipeline_runs r
 WHERE r.stage = %(stage)s
   AND (%(tenant_id)s::bigint IS NULL OR r.tenant_id = %(tenant_id)s::bigint)
   AND (r.status = 'failed' OR (r.status = 'running' AND r.lease_expires_at < now()))
   AND (SELECT count(*)
          FROM pipeline_runs p
         WHERE p.tenant_id = r.tenant_id
           AND p.anfrage_id = r.anfrage_id
           AND p.stage = ANY(%(previous)s)
           AND p.status = 'success') = cardinality(%(previous)s::text[])
 ORDER BY r.id
 LIMIT %(limit)s;

-- previous_stage_for_share --
-- The status of the stage before, read in a stage's closing transaction and share-locked:
-- a replay reopening it (an UPDATE) waits for this transaction, and this read waits for
-- a previous stage that is committing new output.
SELECT status
  FROM pipeline_runs
 WHERE tenant_id = %(tenant_id)s AND anfrage_id = %(anfrage_id)s AND stage = %(stage)s
   FOR SHARE;

-- staged_blobs_in_use --
-- Of the given blob hashes, those that an inquiry still needs: one whose intake has not
-- succeeded yet names it in its upload manifest. An intake that failed and stayed failed
-- for the whole grace period (an unreadable upload, refused for good) needs it no more.
SELECT DISTINCT u.entry ->> 'sha256'
  FROM anfragen a
 CROSS JOIN LATERAL jsonb_array_elements(a.uploads) AS u(entry)
 WHERE u.entry ->> 'sha256' = ANY(%(hashes)s)
   AND NOT EXISTS (
        SELECT 1 FROM pipeline_runs r
         WHERE r.tenant_id = a.tenant_id AND r.anfrage_id = a.id
           AND r.stage = 'intake'
           AND (r.status = 'success'
                OR (r.status = 'failed'
                    AND r.finished_at < now() - make_interval(secs => %(grace)s))));
