"""Settings of the baseline workers: pgstage's settings with procrastinate's own worker.

``config.settings`` installs pgstage's worker (``queueing.worker``) on app ready; the
baseline runs procrastinate's ``Worker`` unchanged, so a ratio compares pgstage with plain
procrastinate, worker included.
"""

from config.settings import *  # noqa: F403

PROCRASTINATE_ON_APP_READY = None
