"""LISTEN loop: a notification it cannot parse.

Fixed: a payload that is not procrastinate's is taken as a wake-up. Before that:

``PgstageWorker._listen`` (queueing/worker.py) re-establishes LISTEN after any
``psycopg.Error``/``OSError`` and is documented as unbounded ("without LISTEN the worker
still polls"). But a payload that is not procrastinate's JSON (``NOTIFY
procrastinate_any_queue_v1`` typed by an operator to wake the workers, or any other
client on that channel) raises ``JSONDecodeError``/``KeyError`` out of the listener side
task; procrastinate's side-task monitor then stops the worker. Every worker listens on the
channel, so one stray NOTIFY stops the whole fleet.
"""

from __future__ import annotations

import time

import pytest
from django.db import connection

import tests.queueing.tasks  # noqa: F401  (registers the test tasks in this process)
from queueing.enqueue import enqueue
from tests.conftest import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


@pytest.mark.parametrize("payload", ["", "wake up", '{"job_id": 1}'])
def test_a_stray_notification_does_not_stop_the_worker(effects, task_worker, payload):
    worker = task_worker()
    enqueue("tests.record", args={"label": "before"})
    wait_for(lambda: "before" in effects(), message=f"a first job\n{worker.log()}")

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_notify('procrastinate_any_queue_v1', %s)", [payload])
    time.sleep(2)  # a real process reacting to a real notification: nothing to back-date

    assert worker.alive, (
        f"the worker stopped (exit status {worker.process.poll()}) on NOTIFY {payload!r}:\n"
        f"{worker.log()[-1500:]}"
    )
    enqueue("tests.record", args={"label": "after"})
    wait_for(lambda: "after" in effects(), message=f"a job after the NOTIFY\n{worker.log()}")
