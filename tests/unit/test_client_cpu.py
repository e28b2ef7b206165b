"""``python -m deploy.client_cpu``: the client's CPU per delivery, against its scripted server."""

from __future__ import annotations

import re

from deploy import client_cpu


def test_every_subscriber_takes_every_notify_and_the_cpu_per_delivery_is_printed(capsys):
    assert client_cpu.main(["--subscribers", "3", "--messages", "40", "--window", "7", "--runs", "2",
                            "--gc", "default"]) == 0
    out = capsys.readouterr().out
    assert re.findall(r"run \d: ([\d,]+) deliveries", out) == ["120", "120"]  # 3 x 40, each ACKed
    assert re.search(r"median of 2: \d+\.\d µs per delivery .*collector thresholds: default", out), out

