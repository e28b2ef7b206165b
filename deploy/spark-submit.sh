#!/usr/bin/env bash
# Submit the SMQP routing job (streaming/job.py) to a Spark cluster with spark-submit.
#
#   deploy/spark-submit.sh --master spark://HOST:7077 [spark-submit options ...] [-- job options ...]
#   deploy/spark-submit.sh --master spark://10.0.0.5:7077 --conf spark.executor.memory=2g -- --config /etc/smqp/smqp.toml
#
# Options before "--" go to spark-submit and win over the properties file and over the
# job's own [streaming] settings; options after "--" go to the job (see: python -m streaming.job --help).
# The job runs in client mode: its driver is this process (Spark runs no Python driver on a
# standalone worker), it writes the Delta tables under data_dir and keeps its
# checkpoint there, so run it on a host that owns data_dir (deploy/cluster.md).
#
# Environment:
#   PYTHON                 interpreter with the project installed (default: .venv/bin/python, else python3)
#   PYSPARK_PYTHON         interpreter the executors start (default: $PYTHON; on a real cluster the same
#                          path must exist on every worker with pyspark, pyarrow, deltalake, kafka-python)
#   SPARK_HOME             Spark installation (default: the pyspark package of $PYTHON)
#   SMQP_SPARK_PROPERTIES  properties file (default: deploy/spark/smqp-router.conf)
#   SMQP_CONFIG            the job's TOML configuration (or pass --config after "--")
#   SMQP_BUILD_DIR         where the job's packages are zipped for the executors (default: build/)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

if [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then
  sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'
  exit 0
fi

python="${PYTHON:-}"
if [ -z "$python" ]; then
  if [ -x "$root/.venv/bin/python" ]; then python="$root/.venv/bin/python"; else python="$(command -v python3)"; fi
fi
export PYSPARK_PYTHON="${PYSPARK_PYTHON:-$python}"
export PYSPARK_DRIVER_PYTHON="${PYSPARK_DRIVER_PYTHON:-$python}"
export SPARK_HOME="${SPARK_HOME:-$("$python" -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))')}"
properties="${SMQP_SPARK_PROPERTIES:-$root/deploy/spark/smqp-router.conf}"

spark_args=()
job_args=()
while [ $# -gt 0 ]; do
  if [ "$1" = "--" ]; then shift; job_args=("$@"); break; fi
  spark_args+=("$1"); shift
done

# The job's packages for the executors (Spark puts --py-files on their sys.path), so workers
# need only the third-party packages, not a checkout of this project.
build="${SMQP_BUILD_DIR:-$root/build}"
mkdir -p "$build"
"$python" - "$root" "$build/smqp-job.zip" <<'PY'
import pathlib, sys, zipfile
root, target = pathlib.Path(sys.argv[1]), sys.argv[2]
with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as archive:
    for package in ("schemas", "streaming", "kafka_edge"):
        for path in sorted((root / package).rglob("*.py")):
            archive.write(path, path.relative_to(root))
PY

# Spark's Kafka connector and delta-spark, from the Maven cache (deploy/spark-jars/pom.xml; fetched on
# first use): spark-submit ships them to the executors.
jars="$("$python" -m deploy.jars --list spark-jars)"

# spark-submit runs in a process group of its own (set -m), so a Ctrl-C in a terminal reaches only
# this script; SIGTERM / SIGINT are forwarded to the job's Python driver (the spark-submit JVM's
# child running streaming/job.py), which stops the query, flushes its metrics and stops Spark; the
# JVM then exits with the driver's exit code. Signalling the JVM itself would stop the SparkContext
# under the driver's feet.
set -m
set -x
"$SPARK_HOME/bin/spark-submit" --properties-file "$properties" --py-files "$build/smqp-job.zip" --jars "$jars" \
  "${spark_args[@]}" "$root/streaming/job.py" "${job_args[@]}" &
{ set +x; } 2>/dev/null
submit=$!
stop_driver() {
  local driver
  driver="$(pgrep -P "$submit" -f 'streaming/job\.py' || true)"
  echo "spark-submit.sh: stopping the job (SIGTERM to ${driver:+driver }${driver:-spark-submit $submit})" >&2
  kill -TERM ${driver:-$submit} 2>/dev/null || true
}
trap stop_driver TERM INT
while true; do
  status=0
  wait "$submit" || status=$?
  kill -0 "$submit" 2>/dev/null || break  # gone: $status is its exit code; else a trapped signal woke us
done
exit "$status"
