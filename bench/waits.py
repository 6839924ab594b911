"""What the harness's sessions wait on while a scenario runs: ``pg_stat_activity``
sampled on a connection of its own. A lock wait shows as ``Lock:advisory`` or
``Lock:transactionid`` (a row another transaction holds); ``client: idle in transaction``
is a session holding its transaction open while the client (Python) works."""

from __future__ import annotations

import collections
import threading
from collections.abc import Mapping
from typing import Any

import psycopg

from bench import wire

SAMPLE = """
/* bench */
SELECT CASE WHEN state = 'active'
            THEN coalesce(wait_event_type || ':' || wait_event, 'running')
            ELSE 'client: idle in transaction' END AS waiting,
       query
  FROM pg_stat_activity
 WHERE datname = current_database()
   AND pid <> pg_backend_pid()
   AND state IN ('active', 'idle in transaction')
   AND application_name = %(application)s
"""


class WaitSampler:
    """Every ``interval`` seconds, what each active session of ``application`` does; with
    ``armed=False``, only from :meth:`arm` on (its connection is opened before, so that
    opening it costs the sampled window nothing)."""

    def __init__(
        self,
        params: Mapping[str, Any],
        *,
        application: str,
        interval: float = 0.02,
        armed: bool = True,
    ):
        self._params = {k: v for k, v in params.items() if v is not None}
        self._application = application
        self._interval = interval
        self._stop = threading.Event()
        self._armed = threading.Event()
        if armed:
            self._armed.set()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.samples = 0
        self.sessions = 0
        self.states: collections.Counter[str] = collections.Counter()
        self.waiting_statements: collections.Counter[tuple[str, str]] = collections.Counter()

    def __enter__(self) -> WaitSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._armed.set()
        self._thread.join(timeout=10)

    def arm(self) -> None:
        """Start sampling (a sampler made with ``armed=False``)."""
        self._armed.set()

    def _run(self) -> None:
        with psycopg.connect(**self._params, autocommit=True) as conn:
            self._armed.wait()
            while not self._stop.wait(self._interval):
                rows = conn.execute(SAMPLE, {"application": self._application}).fetchall()
                self.samples += 1
                self.sessions += len(rows)
                for waiting, query in rows:
                    self.states[waiting] += 1
                    if waiting.startswith("Lock"):
                        self.waiting_statements[(waiting, wire.normalise(query)[:160])] += 1

    def summary(self) -> dict[str, Any]:
        """Shares of session-samples by state, and the statements seen waiting most."""
        total = self.sessions or 1
        return {
            "samples": self.samples,
            "active_sessions_mean": round(self.sessions / (self.samples or 1), 2),
            "share_by_state": {
                state: round(n / total, 3) for state, n in self.states.most_common()
            },
            "waiting_statements": [
                {"wait": wait, "share": round(n / total, 3), "statement": text}
                for (wait, text), n in self.waiting_statements.most_common(5)
            ],
        }
