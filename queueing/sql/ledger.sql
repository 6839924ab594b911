-- ledger_renew --
-- Extend a live holder's lease from now. Compare-and-set on the fencing token and on
-- 'running': a holder that was taken over (or whose row was closed) extends nothing, so
-- its successor's lease is never prolonged by a stale renewal.
UPDATE {table}
   SET lease_expires_at = now() + %(lease_seconds)s * interval '1 second'
 WHERE id = %(id)s AND attempts = %(token)s AND status = 'running'
RETURNING id;
