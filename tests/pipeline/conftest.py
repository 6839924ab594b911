"""Fixtures of the pipeline tests: a storage root per test, tenants, inline stage runs and
worker subprocesses that share the storage root."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from pipeline.models import Anfrage, Stage
from pipeline.replay import pipeline_stage_replay
from pipeline.stages import pipeline_stage_run
from pipeline.submit import Upload, anfrage_submit
from tests.conftest import run_concurrently
from tests.factories import TenantFactory, UserFactory
from tests.pipeline.extractors import ScriptedExtractor

ITEMS_TXT = "12 pcs steel beam HEA 200, 6 m\n30 m Flachstahl 40x5\n200 Stk Schrauben M12 V2A\n"
ITEMS_CSV = (
    "position;qty;unit;item;material;length_mm\n"
    "1;4;Stk;Stahlträger IPE 240;S355;8000\n"
    "2;10;pcs;Rohr 60x4;1.4301;6000\n"
)


@pytest.fixture(autouse=True)
def storage_root(settings, tmp_path) -> Path:
    root = tmp_path / "storage"
    settings.STORAGE_ROOT = root
    return root


@pytest.fixture
def scripted_extractor(settings):
    settings.PIPELINE_EXTRACTOR = "tests.pipeline.extractors.ScriptedExtractor"
    ScriptedExtractor.reset()
    yield ScriptedExtractor
    ScriptedExtractor.release.set()
    ScriptedExtractor.reset()


@pytest.fixture
def tenant(db):
    return TenantFactory(slug="acme")


@pytest.fixture
def other_tenant(db):
    return TenantFactory(slug="globex")


@pytest.fixture
def user(tenant):
    return UserFactory(username="alice", tenant=tenant)


def submit(tenant, files: dict[str, str | bytes] | None = None, *, title: str = "") -> Anfrage:
    """Submit an inquiry through the service (default: one text file of three items)."""
    files = files if files is not None else {"items.txt": ITEMS_TXT}
    uploads = [
        Upload(filename=name, data=data.encode() if isinstance(data, str) else data)
        for name, data in files.items()
    ]
    return anfrage_submit(tenant=tenant, uploads=uploads, title=title, actor="test")


def in_background(func: Callable[[], object]) -> tuple[threading.Thread, list]:
    """Start ``func()`` in a thread with its own connection (another worker, an operator).
    After joining the thread, the list holds its result or the exception it raised."""
    outcome: list = []
    thread = threading.Thread(target=lambda: outcome.extend(run_concurrently(lambda i: func(), 1)))
    thread.start()
    return thread, outcome


def run_stages(anfrage_id: int, stages=tuple(Stage)) -> list[str]:
    """Run stages in this process, in order (what the worker does, without the queue)."""
    return [pipeline_stage_run(anfrage_id=anfrage_id, stage=stage) for stage in stages]


def force_replay(tenant, anfrage: Anfrage, stage: Stage) -> None:
    """An operator's forced replay of ``stage`` and the stages after it."""
    pipeline_stage_replay(
        tenant_id=tenant.id,
        anfrage_id=anfrage.id,
        stage=stage.value,
        force=True,
        cascade=True,
        actor="test",
    )


@pytest.fixture
def blocked_extract(scripted_extractor) -> Callable[..., tuple[threading.Thread, list]]:
    """Start extract as another worker would (:func:`in_background`) and return its
    ``(thread, outcome)`` once the extractor computes; it stays inside until
    ``scripted_extractor.release`` is set, then returns its first ``keep`` positions (all
    by default)."""

    def start(anfrage: Anfrage, *, keep: int | None = None) -> tuple[threading.Thread, list]:
        scripted_extractor.block = True
        scripted_extractor.keep = keep
        started = in_background(
            lambda: pipeline_stage_run(anfrage_id=anfrage.id, stage=Stage.EXTRACT)
        )
        assert scripted_extractor.entered.wait(timeout=20)
        return started

    return start


@pytest.fixture
def pipeline_worker(start_worker, storage_root) -> Callable:
    """Start a worker subprocess that uses this test's storage root."""

    def start(*extra: str, env: dict[str, str] | None = None, **kwargs):
        return start_worker(
            *extra, env={"STORAGE_ROOT": str(storage_root), **(env or {})}, **kwargs
        )

    return start
