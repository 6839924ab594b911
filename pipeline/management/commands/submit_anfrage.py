"""Create an inquiry from files and start its pipeline. Not for cron (each run creates one).

The new inquiry's id is the last line of the output, for scripts:
``ID=$(manage.py submit_anfrage --tenant acme items.txt | tail -n1)``.
"""

from __future__ import annotations

from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from accounts.validation import TENANT_SLUG_MAX, read_bounded, text_argument
from pipeline.exceptions import PipelineError
from pipeline.limits import MAX_FILE_BYTES, MAX_FILES, MAX_TITLE
from pipeline.selectors import tenant_by_slug
from pipeline.submit import Upload, anfrage_submit
from queueing.display import format_table


class Command(BaseCommand):
    help = "Create an inquiry from FILE... (text, CSV or Markdown) and start its pipeline."

    def add_arguments(self, parser):
        parser.add_argument(
            "--tenant",
            required=True,
            type=text_argument(max_length=TENANT_SLUG_MAX),
            help="tenant slug",
        )
        parser.add_argument(
            "--title",
            default="",
            type=text_argument(max_length=MAX_TITLE),
            help="title (default: the first file name)",
        )
        parser.add_argument("files", nargs="+", metavar="FILE")

    def handle(self, *args, tenant: str, title: str, files: list[str], **options):
        if len(files) > MAX_FILES:
            raise CommandError(f"{len(files)} files; at most {MAX_FILES} per inquiry")
        tenant_row = tenant_by_slug(slug=tenant)
        if tenant_row is None:
            raise CommandError(
                f"no tenant {tenant!r}: create it with "
                f"'manage.py create_api_token --tenant {tenant} --user <name>'"
            )
        uploads = []
        for name in files:
            try:
                data = read_bounded(name, max_bytes=MAX_FILE_BYTES)
            except ValueError as exc:
                raise CommandError(f"{exc}; nothing was created") from exc
            except OSError as exc:
                raise CommandError(f"cannot read {name}: {exc.strerror}; check the path") from exc
            uploads.append(Upload(filename=Path(name).name, data=data))
        try:
            anfrage = anfrage_submit(
                tenant=tenant_row, uploads=uploads, title=title, actor="command:submit_anfrage"
            )
        except PipelineError as exc:
            raise CommandError(f"{exc.detail}; nothing was created") from exc
        rows = [(m["filename"], m["format"], m["size"], m["sha256"][:12]) for m in anfrage.uploads]
        self.stdout.write(format_table(("file", "format", "bytes", "sha256"), rows))
        self.stdout.write(
            f"inquiry {anfrage.id} ({tenant_row.slug}) submitted; intake is queued. "
            f"Follow it with 'manage.py pipeline_status --anfrage {anfrage.id}'."
        )
        self.stdout.write(str(anfrage.id))
