#!/bin/sh
# The web process of a deployment: uvicorn with DEXAGENTS_WEB_PROCESSES worker processes
# (default 1) on PORT (default 8000). With PROMETHEUS_MULTIPROC_DIR set, the directory is
# emptied first: prometheus_client sums every file in it, and files of processes from an
# earlier start would be counted again.
set -eu
if [ -n "${PROMETHEUS_MULTIPROC_DIR:-}" ]; then
    mkdir -p "$PROMETHEUS_MULTIPROC_DIR"
    find "$PROMETHEUS_MULTIPROC_DIR" -maxdepth 1 -name '*.db' -delete
fi
exec uvicorn dexagents_site.asgi:application \
    --host "${DEXAGENTS_WEB_HOST:-0.0.0.0}" --port "${PORT:-8000}" \
    --workers "${DEXAGENTS_WEB_PROCESSES:-1}" --no-access-log --proxy-headers
