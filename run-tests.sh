#!/usr/bin/env bash
# Install everything (first run only) and run the whole test suite. Extra args go to pytest.
set -euo pipefail
cd "$(dirname "$0")"
source scripts/bootstrap.sh test
set +e
.venv/bin/python -m pytest "$@"
status=$?
set -e
if [ "$status" = 5 ]; then
  echo "run-tests: pytest collected no tests; treating that as a failure" >&2
  exit 1
fi
exit "$status"
