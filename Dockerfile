# pgstage: one image for the web process (gunicorn), the workers and the migrations.
#   docker build -t pgstage .
#   docker run -e DATABASE_URL=… -e SECRET_KEY=… -p 8000:8000 pgstage          # web
#   docker run -e DATABASE_URL=… -e SECRET_KEY=… pgstage python manage.py procrastinate worker
# compose.yaml runs the whole thing; docs/deploy.md explains each process.

FROM python:3.11-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /app
RUN python -m venv /venv
# Dependencies first, in their own layer: a code change does not reinstall them. The
# framework's and the reference site's libraries (the `demo` extra); not the embedded
# PostgreSQL (the `embedded` extra), which a container with DATABASE_URL never starts.
COPY pyproject.toml README.md ./
RUN mkdir queueing && touch queueing/__init__.py \
    && /venv/bin/pip install ".[demo]" \
    && /venv/bin/pip uninstall -y -q pgstage \
    && rm -rf queueing build pgstage.egg-info
COPY . .
# The framework as a plain (not editable) install, as a project installs it; its source
# copy leaves the tree, so the site imports the installed package.
RUN /venv/bin/pip install --no-deps . \
    && rm -rf queueing build pgstage.egg-info
# collectstatic reads the settings, which need a DATABASE_URL (unused here: unset, the
# embedded PostgreSQL would be started).
RUN DATABASE_URL=postgresql://build@localhost/build SECRET_KEY=build STATIC_ROOT=/app/static \
    /venv/bin/python manage.py collectstatic --noinput -v 0

FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PATH=/venv/bin:$PATH \
    PGSTAGE_DATA_DIR=/data \
    STATIC_ROOT=/app/static \
    HOST=0.0.0.0 \
    PORT=8000
RUN useradd --system --uid 10001 --user-group --home-dir /app --no-create-home pgstage \
    && mkdir -p /data/storage \
    && chown -R pgstage:pgstage /data
COPY --from=build /venv /venv
COPY --from=build /app /app
WORKDIR /app
USER pgstage
EXPOSE 8000
HEALTHCHECK --interval=15s --timeout=5s --start-period=20s \
    CMD python -c "import os, urllib.request; urllib.request.urlopen(f'http://127.0.0.1:{os.environ.get(\"PORT\", \"8000\")}/healthz', timeout=4)"
CMD ["python", "-m", "gunicorn", "-c", "python:queueing.gunicorn", "config.wsgi"]
