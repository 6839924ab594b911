"""Test doubles plugged in through settings (also into worker subprocesses, see
worker_settings.py)."""

from __future__ import annotations

from runs.core import LocalCore
from runs.exceptions import CoreUnavailable
from runs.judge import Judgement, OverlapJudge, Source
from runs.models import CoreRun

#: A job whose sources include this key meets a core that is down at release.
OUTAGE_KEY = "outage"


class FlakyCore(LocalCore):
    """The local core, unreachable at release for runs with an ``outage`` source."""

    def release(self, *, core_run_id: int) -> None:
        sources = CoreRun.objects.values_list("sources", flat=True).get(pk=core_run_id)
        if any(s.get("key") == OUTAGE_KEY for s in sources):
            raise CoreUnavailable("simulated outage")
        super().release(core_run_id=core_run_id)


#: A job whose sources include this key meets a judge that crashes on it.
BROKEN_KEY = "broken"


class BrokenJudge(OverlapJudge):
    """The default judge, crashing (not a JudgeError: a bug) on a ``broken`` source."""

    def judge(self, *, claim: str, source: Source | None) -> Judgement:
        if source is not None and source.key == BROKEN_KEY:
            raise RuntimeError("the judge crashed")
        return super().judge(claim=claim, source=source)
