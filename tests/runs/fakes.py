"""Test doubles plugged in through settings (also into worker subprocesses, see
worker_settings.py)."""

from __future__ import annotations

from runs.core import LocalCore
from runs.exceptions import CoreUnavailable
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
