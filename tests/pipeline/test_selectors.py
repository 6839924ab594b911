"""The inquiry's reads: a stage shown as succeeded comes with what it wrote.

Fault model: ``calculate`` commits (success and quote in one transaction) between the read
of the inquiry's row and the read of its stages; a page would then show ``calculate``
succeeded with no quote, and stop polling (test_a_succeeded_calculate_comes_with_its_quote).
"""

from __future__ import annotations

import pytest

from pipeline.models import Anfrage
from pipeline.selectors import anfrage_detail, anfrage_overview
from pipeline.stages import Stage
from tests.pipeline.conftest import run_stages, submit

pytestmark = pytest.mark.django_db


def test_a_succeeded_calculate_comes_with_its_quote(tenant):
    anfrage = submit(tenant)
    run_stages(anfrage.id, stages=[Stage.INTAKE, Stage.EXTRACT, Stage.FEASIBILITY])
    # The rows as a request read them just before calculate committed.
    stale = Anfrage.objects.get(pk=anfrage.id)
    stale_page = list(Anfrage.objects.filter(pk=anfrage.id))
    run_stages(anfrage.id, stages=[Stage.CALCULATE])

    detail = anfrage_detail(anfrage=stale)
    assert detail.complete
    assert detail.quote_total is not None and detail.currency
    [(listed, stages)] = anfrage_overview(anfragen=stale_page)
    assert {s.status for s in stages} == {"success"}
    assert (listed.quote_total, listed.currency) == (detail.quote_total, detail.currency)
