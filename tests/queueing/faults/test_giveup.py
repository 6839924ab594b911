"""Give-up hooks of jobs whose last attempt failed (queueing/worker.py ``_persist_job_status``

Fixed by recording the owed hook in the statement that saves the failure
(``pgstage_owed_give_ups``), run by any worker's maintenance. Before that:

then ``_settle``).

The job is saved ``failed`` in one transaction, and its task's give-up hook runs after it,
in another (in the maintenance thread, possibly queued behind a sweep run). Nothing records
that a failed job still owes its hook, and nothing runs it later: stalled recovery only
looks at ``doing`` jobs. So whatever ends the worker between the two commits leaves a
``failed`` job whose domain row never settles (docs/design.md#invariants, 13: "a job
that fails for good leaves its domain row terminal") —
test_a_worker_killed_between_the_failure_and_its_hook.

No process even has to die: when the reply to the commit that saved ``failed`` is lost,
the worker saves again, finds the job no longer ``doing``, takes it for "recovered
elsewhere" (outcome ``taken``) and skips the hook —
test_a_lost_reply_to_the_failures_commit_still_settles_the_domain.
"""

from __future__ import annotations

import contextlib
import os
import signal

import pytest
from django.db import connection

import tests.queueing.faults.tasks  # noqa: F401  (registers the review tasks in this process)
from queueing.enqueue import enqueue
from queueing.sweeps import run_sweep
from tests.conftest import jobs, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

TASKS = {"PGSTAGE_TASK_MODULES": "tests.queueing.tasks,tests.queueing.faults.tasks"}
FAST = {
    **TASKS,
    "WORKER_HEARTBEAT_SECONDS": "0.5",
    "STALLED_WORKER_SECONDS": "3",
    "STALLED_RECOVERY_SECONDS": "0.8",
}


def test_a_worker_killed_between_the_failure_and_its_hook(effects, task_worker, tmp_path):
    gate = tmp_path / "gate"
    doomed = task_worker(env=FAST, name="doomed")
    job = enqueue("review.fails_for_good", args={"label": "g", "gate": str(gate)})
    wait_for(
        lambda: (tmp_path / "gate.hook-started").exists(),
        message=f"the give-up hook to start\n{doomed.log()[-1500:]}",
    )
    # The failure is saved; the hook is on its way (here: waiting on its gate).
    assert jobs(id=job.job_id)[0]["status"] == "failed"
    os.killpg(doomed.process.pid, signal.SIGKILL)
    doomed.wait(timeout=10)
    gate.touch()

    # Everything that could pick the settlement up again: the dead worker is long silent,
    # recovery runs (here and in a new worker), the new worker takes jobs.
    with connection.cursor() as cursor:
        cursor.execute("UPDATE procrastinate_workers SET last_heartbeat = now() - interval '1 h'")
    run_sweep("stalled_jobs")
    rescuer = task_worker(env=FAST, name="rescuer")
    try:
        wait_for(lambda: "gave-up:g" in effects(), timeout=10, message="the give-up hook")
    except AssertionError:
        pytest.fail(
            f"job {job.job_id} is {jobs(id=job.job_id)[0]['status']} and its give-up hook "
            f"never completed (effects: {effects()})\n{rescuer.log()[-600:]}"
        )


class ReplyCutter:
    """A TCP proxy in front of the test database that passes everything through, except
    that once — on the connection that sent ``trigger`` (a statement's text) — it drops the
    server's reply that ends the statement's transaction (the first ``ReadyForQuery`` that
    reports the session idle: the reply to the statement itself in autocommit, to its
    ``COMMIT`` otherwise) and closes both ends: the commit happened, the client never hears
    of it (a connection cut at the wrong moment)."""

    def __init__(self, upstream: tuple[str, int] | str, trigger: bytes):
        import socket
        import threading

        self.upstream = upstream
        self.trigger = trigger
        self.cut = threading.Event()
        self._armed_once = threading.Lock()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self._stop = False
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._stop = True
        self.listener.close()

    def _accept(self) -> None:
        import socket
        import threading

        while not self._stop:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if isinstance(self.upstream, str):  # a Unix socket (the embedded server)
                server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                server.connect(self.upstream)
            else:
                server = socket.create_connection(self.upstream)
            state = {"armed": False}
            threading.Thread(
                target=self._pump_up, args=(client, server, state), daemon=True
            ).start()
            threading.Thread(
                target=self._pump_down, args=(server, client, state), daemon=True
            ).start()

    def _pump_up(self, client, server, state) -> None:
        try:
            while data := client.recv(65536):
                if (
                    not self.cut.is_set()
                    and self.trigger in data
                    and self._armed_once.acquire(blocking=False)
                ):
                    state["armed"] = True
                server.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (client, server):
                _hang_up(sock)

    def _pump_down(self, server, client, state) -> None:
        try:
            while data := server.recv(65536):
                if state["armed"] and _IDLE in data and not self.cut.is_set():
                    self.cut.set()
                    for sock in (client, server):
                        _hang_up(sock)
                    return
                client.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (client, server):
                _hang_up(sock)


#: The server's ``ReadyForQuery`` with the session idle: a transaction just ended.
_IDLE = b"Z\x00\x00\x00\x05I"


def _hang_up(sock) -> None:
    """Close at once, waking the other pump's recv (a bare close() would not send FIN)."""
    import socket

    for step in (lambda: sock.shutdown(socket.SHUT_RDWR), sock.close):
        with contextlib.suppress(OSError):
            step()


@pytest.fixture
def cutter(worker_env):
    from urllib.parse import parse_qs, urlsplit

    url = urlsplit(worker_env["DATABASE_URL"])
    query = parse_qs(url.query)
    if "host" in query:  # the embedded server listens on a Unix socket only
        port = query.get("port", ["5432"])[0]
        upstream: tuple[str, int] | str = f"{query['host'][0]}/.s.PGSQL.{port}"
    else:
        upstream = (url.hostname, url.port or 5432)
    proxy = ReplyCutter(upstream, trigger=b"procrastinate_finish_job_v1(id")
    yield proxy, url._replace(netloc=f"{url.username}@127.0.0.1:{proxy.port}", query="").geturl()
    proxy.close()


def test_a_lost_reply_to_the_failures_commit_still_settles_the_domain(effects, task_worker, cutter):
    """No process dies: the commit that saved the job ``failed`` reached the server, its
    reply did not. The worker retries the save, finds the job no longer ``doing``, calls it
    "taken" (recovered elsewhere) and skips the hook."""
    proxy, url = cutter
    worker = task_worker("--queues=default", env={**FAST, "DATABASE_URL": url}, name="cut")
    job = enqueue("review.fails_once_for_good", args={"label": "r"})
    wait_for(lambda: proxy.cut.is_set(), message=f"the cut\n{worker.log()[-1500:]}")
    wait_for(lambda: jobs(id=job.job_id)[0]["status"] == "failed", message="the saved failure")
    try:
        wait_for(lambda: "gave-up:r" in effects(), timeout=10, message="the give-up hook")
    except AssertionError:
        pytest.fail(
            f"job {job.job_id} is failed, the worker is alive ({worker.alive}) and the "
            f"give-up hook never ran (effects: {effects()}); the worker said:\n"
            + "\n".join(
                line[:300]
                for line in worker.log().splitlines()
                if "saving the outcome" in line or "no longer this worker" in line
            )
        )
