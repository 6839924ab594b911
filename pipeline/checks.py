"""System checks for the pipeline's settings."""

from __future__ import annotations

from django.conf import settings
from django.core.checks import Error, Warning, register

#: A shorter lease is renewed every few seconds: one slow renewal (a database failover,
#: a long pause of the worker) would let another worker take over a live stage.
MIN_SAFE_LEASE_SECONDS = 30


@register()
def check_pipeline_settings(app_configs, **kwargs):
    messages = []
    lease = settings.PIPELINE_LEASE_SECONDS
    if lease <= 0:
        messages.append(
            Error(
                f"PIPELINE_LEASE_SECONDS={lease} must be positive: a stage's claim holds "
                "a lease of that length.",
                hint="Use the default, 300.",
                id="pipeline.E001",
            )
        )
    elif lease < MIN_SAFE_LEASE_SECONDS:
        messages.append(
            Warning(
                f"PIPELINE_LEASE_SECONDS={lease} is renewed every {lease / 3:g} s: one "
                "renewal delayed that long lets another worker take over a live stage.",
                hint=f"Use {MIN_SAFE_LEASE_SECONDS} seconds or more (default 300).",
                id="pipeline.W001",
            )
        )
    for name in ("PIPELINE_RESUME_GRACE_SECONDS", "PIPELINE_MAX_RESUMES"):
        value = getattr(settings, name)
        if value < 0:
            messages.append(Error(f"{name}={value} must not be negative.", id="pipeline.E002"))
    return messages
