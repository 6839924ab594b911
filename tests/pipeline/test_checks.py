"""System checks of the pipeline's settings (pure; no fault model: nothing runs)."""

from __future__ import annotations

import pytest

from pipeline.checks import check_pipeline_settings


def ids(messages) -> list[str]:
    return [m.id for m in messages]


def test_the_default_configuration_passes():
    assert check_pipeline_settings(None) == []


@pytest.mark.parametrize(
    ("setting", "value", "expected"),
    [
        ("PIPELINE_LEASE_SECONDS", 0, ["pipeline.E001"]),
        ("PIPELINE_LEASE_SECONDS", 6, ["pipeline.W001"]),
        ("PIPELINE_RESUME_GRACE_SECONDS", -1, ["pipeline.E002"]),
        ("PIPELINE_MAX_RESUMES", -1, ["pipeline.E002"]),
    ],
)
def test_bad_values_are_flagged(settings, setting, value, expected):
    setattr(settings, setting, value)
    assert ids(check_pipeline_settings(None)) == expected
