#!/usr/bin/env bash
# Installs what the project needs into ./.venv (idempotent; re-runs pip only when pyproject.toml changed).
# Usage: source scripts/bootstrap.sh [extras]   e.g. "local" or "test"
set -euo pipefail
extras="${1:-local}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

apt_install() {  # Debian packages the project needs beside Python
  local sudo_=""; [ "$(id -u)" = 0 ] || sudo_="sudo"
  $sudo_ apt-get update -qq && $sudo_ env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}
if ! command -v java >/dev/null 2>&1; then
  echo "==> Java not found: installing OpenJDK 17 (Kafka and Spark run on it)"
  apt_install openjdk-17-jre-headless
fi
if ! command -v mvn >/dev/null 2>&1; then
  echo "==> Maven not found: installing it (it fetches Kafka's jars from Maven Central)"
  apt_install maven
fi
if [ "$extras" = test ] && ! command -v chromium >/dev/null 2>&1; then
  echo "==> installing Chromium (the dashboard test renders the page headless)"
  apt_install chromium
fi

python="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  echo "==> creating .venv"
  "$python" -m venv .venv
fi
stamp=".venv/.installed-$extras-$(sha1sum pyproject.toml | cut -c1-12)"
if [ ! -f "$stamp" ]; then
  echo "==> installing smqp-spark[$extras] into .venv"
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -e ".[$extras]"
  touch "$stamp"
fi
# Kafka's jars, once, into the git-ignored cache (.cache/jars; deploy/jars.py)
.venv/bin/python -m deploy.jars kafka spark-jars >/dev/null
export PYSPARK_PYTHON="$root/.venv/bin/python"
