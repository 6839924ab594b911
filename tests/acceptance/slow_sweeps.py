"""Loaded into a worker (``PGSTAGE_TASK_MODULES``) to hold it inside its sweeps: each sweep
named in ``$SLOW_SWEEPS`` records that it started (in ``test_effects``, committed at once
on a connection of its own) and then waits for ``$SLOW_SWEEPS_DIR/<name>`` — so the test
can kill the worker while it is inside that sweep, with whatever it holds."""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path

import psycopg
from procrastinate.contrib.django.utils import connector_params

from queueing import sweeps as sweeps_module

EFFECTS_DDL = """
CREATE TABLE IF NOT EXISTS test_effects (
    id bigserial PRIMARY KEY, label text NOT NULL, at timestamptz NOT NULL DEFAULT now())"""


def _record(label: str) -> None:
    with psycopg.connect(**connector_params(), autocommit=True) as conn:
        conn.execute("INSERT INTO test_effects (label) VALUES (%s)", [label])


def _held(name: str, func):
    gate = Path(os.environ["SLOW_SWEEPS_DIR"]) / name

    def held(ctx):
        _record(f"sweep:{name}:started")
        deadline = time.monotonic() + 120
        while not gate.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        return func(ctx)

    return held


for _name in filter(None, os.environ.get("SLOW_SWEEPS", "").split(",")):
    _sweep = sweeps_module._registry[_name]
    sweeps_module._registry[_name] = dataclasses.replace(_sweep, func=_held(_name, _sweep.func))
