"""``python -m bench``: every scenario, side by side with plain procrastinate, as ratios."""

from __future__ import annotations

import os
import sys

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")


def main() -> int:
    import django

    django.setup()
    from bench import throughput

    throughput.main(sys.argv[1:])
    try:
        from bench import writes_per_job
    except ImportError:
        return 0
    writes_per_job.main([])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
