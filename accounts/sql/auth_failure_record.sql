-- Count one failed authentication of a client address. One statement, so concurrent
-- failures from many web processes are all counted: the row's window restarts (with one
-- failure) once it is older than the window, else its count goes up by one.
INSERT INTO auth_failures AS f (scope, address, window_start, failures)
VALUES (%(scope)s, %(address)s, now(), 1)
ON CONFLICT (scope, address) DO UPDATE
   SET window_start = CASE WHEN f.window_start <= now() - make_interval(secs => %(window)s)
                           THEN now() ELSE f.window_start END,
       failures = CASE WHEN f.window_start <= now() - make_interval(secs => %(window)s)
                       THEN 1 ELSE f.failures + 1 END
RETURNING failures;
