"""Java libraries from Maven Central, fetched once with ``mvn`` into a git-ignored cache.

Each set of jars is a checked-in POM, ``deploy/<name>/pom.xml``, that is never built: its runtime
dependencies are copied (``mvn dependency:copy-dependencies``) into ``<cache>/<name>/``, where
``<cache>`` is ``$SMQP_JAR_CACHE`` or ``.cache/jars`` in the checkout.  A stamp holding the POM's
hash says the copy is complete and current; a changed POM fetches again.  Maven reads its own
settings (``~/.m2/settings.xml``: mirrors, proxies), which is why this uses ``mvn`` and not Ivy.

``python -m deploy.jars kafka`` fetches ahead of time (the bootstrap does, with progress on the
terminal); :func:`jar_dir` fetches on first use otherwise.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
POMS = Path(__file__).resolve().parent


class JarsUnavailable(RuntimeError):
    """The jars are not in the cache and could not be fetched (no ``mvn``, no network …)."""


def cache_root() -> Path:
    """Where fetched jars live: ``$SMQP_JAR_CACHE``, else ``.cache/jars`` in the checkout."""
    return Path(os.environ.get("SMQP_JAR_CACHE") or ROOT / ".cache" / "jars")


def _pom(name: str) -> Path:
    pom = POMS / name / "pom.xml"
    if not pom.is_file():
        known = sorted(p.parent.name for p in POMS.glob("*/pom.xml"))
        raise JarsUnavailable(f"no jar set {name!r} (known: {', '.join(known)})")
    return pom


def jar_dir(name: str, *, quiet: bool = True) -> Path:
    """The directory holding jar set ``name``, fetched first if it is missing or stale."""
    pom = _pom(name)
    target = cache_root() / name
    stamp = target / ".pom-sha1"
    digest = hashlib.sha1(pom.read_bytes()).hexdigest()
    if stamp.is_file() and stamp.read_text().strip() == digest:
        return target
    _fetch(pom, target, quiet=quiet)
    stamp.write_text(digest + "\n")
    return target


def jar_files(name: str) -> list[Path]:
    """Every jar file of set ``name``, in name order (fetched first if missing or stale)."""
    return sorted(jar_dir(name).glob("*.jar"))


def classpath(name: str) -> str:
    """A Java class path naming every jar of set ``name`` (``dir/*``)."""
    return str(jar_dir(name) / "*")


def _fetch(pom: Path, target: Path, *, quiet: bool) -> None:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise JarsUnavailable(
            f"the jars of {pom.parent.name} are not in {target} and Maven is not installed to fetch them: "
            "install it (apt-get install maven) or run scripts/bootstrap.sh, which does")
    print(f"==> fetching the {pom.parent.name} jars from Maven Central into {target} (first run only)",
          file=sys.stderr, flush=True)
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    command = [mvn, "-B", "-f", str(pom), "dependency:copy-dependencies", "-DincludeScope=runtime",
               f"-DoutputDirectory={partial}"]
    if quiet:
        command.insert(1, "-q")
    result = subprocess.run(command, stdout=subprocess.PIPE if quiet else None, stderr=subprocess.STDOUT, text=True)
    if result.returncode != 0:
        shutil.rmtree(partial, ignore_errors=True)
        raise JarsUnavailable(f"mvn could not fetch the {pom.parent.name} jars (exit {result.returncode}):\n"
                              f"{(result.stdout or '')[-4000:]}")
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m deploy.jars",
        description="Fetch a set of Java jars from Maven Central (deploy/<name>/pom.xml) into the jar cache "
                    "($SMQP_JAR_CACHE, default .cache/jars); does nothing when they are there already.")
    parser.add_argument("names", nargs="+", metavar="NAME", help="jar sets to fetch, e.g. kafka spark-jars")
    parser.add_argument("--list", action="store_true",
                        help="print the jar files, comma-separated (spark-submit's --jars), instead of the directory")
    args = parser.parse_args(argv)
    try:
        for name in args.names:
            print(",".join(map(str, jar_files(name))) if args.list else f"{name}: {jar_dir(name)}")
    except JarsUnavailable as error:
        print(f"deploy.jars: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
