"""Fixtures of tests/queueing, reused: the test models and effects table, real workers."""

from tests.queueing.conftest import django_db_setup, effects, task_worker  # noqa: F401
