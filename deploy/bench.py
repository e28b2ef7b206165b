"""``python -m deploy.bench``: the benchmark's workloads against our stack alone.

It is ``python -m deploy.compare --systems smqp`` (``--help`` lists the workloads); our side of the
comparison, the adapter the workloads drive, is :mod:`deploy.smqp_adapter`.
"""

from __future__ import annotations

import sys

from deploy import compare


def main(argv: list[str] | None = None) -> int:
    return compare.main(["--systems", "smqp", *(sys.argv[1:] if argv is None else argv)],
                        prog="python -m deploy.bench")


if __name__ == "__main__":
    sys.exit(main())
