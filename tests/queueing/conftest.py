from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from django.db import connection, connections, transaction

from queueing import locks
from queueing.sweeps import SWEEP_LOCK
from tests.queueing.models import MODELS

EFFECTS_DDL = """
CREATE TABLE IF NOT EXISTS test_effects (
    id bigserial PRIMARY KEY,
    label text NOT NULL,
    at timestamptz NOT NULL DEFAULT now()
)"""


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup, django_db_blocker):
    with django_db_blocker.unblock():
        existing = connection.introspection.table_names()
        with connection.schema_editor() as editor:
            for model in MODELS:
                if model._meta.db_table not in existing:
                    editor.create_model(model)
        with connection.cursor() as cursor:
            cursor.execute(EFFECTS_DDL)


@pytest.fixture
def effects(clean_queue):
    """Labels recorded by the test tasks (tests/queueing/tasks.py), via real commits."""
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE test_effects")

    def read() -> list[str]:
        with connection.cursor() as cursor:
            cursor.execute("SELECT label FROM test_effects ORDER BY id")
            return [row[0] for row in cursor.fetchall()]

    return read


@pytest.fixture
def task_worker(start_worker):
    """Start a worker that also loads the test tasks."""

    def start(*args, **kwargs):
        env = {"PGSTAGE_TASK_MODULES": "tests.queueing.tasks", **kwargs.pop("env", {})}
        return start_worker(*args, env=env, **kwargs)

    return start


@contextmanager
def sweep_lock_held(name: str) -> Iterator[None]:
    """Another connection holds sweep ``name``'s try-lock, as a run of it in a worker
    does, until the block ends."""
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        try:
            with transaction.atomic():
                assert locks.try_xact_lock(SWEEP_LOCK, name)
                holding.set()
                release.wait(timeout=10)
        finally:
            connections.close_all()

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert holding.wait(timeout=10), f"could not take sweep {name}'s lock"
        yield
    finally:
        release.set()
        holder.join(timeout=10)
