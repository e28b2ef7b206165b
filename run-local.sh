#!/usr/bin/env bash
# Install everything (first run only) and start broker + streaming job + gateway. Ctrl-C stops all.
set -euo pipefail
cd "$(dirname "$0")"
source scripts/bootstrap.sh local
exec .venv/bin/smqp-local "$@"
