"""Exceptions of the analyses domain; ``RunsError`` is the root.

Each refusal carries a stable ``code`` (the API's ``error`` field and the commands' wording
use it); ``runs.api`` maps the classes to HTTP statuses in one place.
"""

from __future__ import annotations


class RunsError(Exception):
    """The analysis service refused the operation."""

    code = "runs_error"

    def __init__(self, message: str | None = None):
        super().__init__(message or self.__doc__)


class JobNotFound(RunsError):
    """No such analysis job (or it belongs to someone else)."""

    code = "not_found"


class InsufficientCredits(RunsError):
    """Not enough credits for another analysis; ask an operator to grant some."""

    code = "insufficient_credits"


class UserInactive(RunsError):
    """The account is deactivated: it can start no analysis, and its waiting analyses
    were cancelled and refunded."""

    code = "user_inactive"


class NoCitations(RunsError):
    """The document holds no citations to check (mark them with data-source="KEY" or
    [KEY])."""

    code = "no_citations"


class QueueFull(RunsError):
    """Too many of your analyses are waiting or running; wait for some to finish."""

    code = "queue_full"


class TooManyCitations(RunsError):
    """The document holds more citations than one analysis may judge; split it."""

    code = "too_many_citations"


class ParentNotComplete(RunsError):
    """A delta re-check needs a completed analysis to re-check."""

    code = "parent_not_complete"


class JobNotFinished(RunsError):
    """The analysis has not finished yet: save its run once it is complete."""

    code = "job_not_finished"


class NothingToSave(RunsError):
    """The analysis has no results (and no document body) to save as a run."""

    code = "nothing_to_save"


class CoreError(RunsError):
    """The core service failed."""

    code = "core_error"


class CoreUnavailable(CoreError):
    """The core service is unreachable; try again shortly."""

    code = "core_unavailable"


class CoreRefused(CoreError):
    """The core service refused to create the run."""

    code = "core_refused"


class InvalidDoi(CoreRefused):
    """A source's DOI is malformed (expected 10.<registrant>/<suffix>)."""

    code = "invalid_doi"


class NoSources(CoreRefused):
    """An analysis needs at least one source to judge citations against."""

    code = "no_sources"


class BudgetExhausted(CoreRefused):
    """Your tenant's provider budget for today is used up; analyses can be started again
    tomorrow (UTC)."""

    code = "budget_exhausted"


class HoldExpired(CoreError):
    """The admission waited so long that its held provider run expired; admit it again."""

    code = "hold_expired"


class CoreStateError(CoreError):
    """The core run is not in a state that allows this transition."""

    code = "core_state"


class JudgeError(RunsError):
    """The judge could not judge this document."""

    code = "judge_failed"


class RetryRefused(RunsError):
    """Only a failed analysis that still holds its document can be retried."""

    code = "retry_refused"


class InvalidAmount(RunsError):
    """A credit grant must be a positive whole number of credits."""

    code = "invalid_amount"
