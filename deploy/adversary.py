"""A bounded adversarial run against one gateway on 127.0.0.1 (a script, not a test).

Starts a Kafka node and one gateway process of its own (no streaming job: the gateway NOTIFYs
DELIVERY ALL messages itself, routing early, and nothing here waits on the job), or attacks the
gateway at ``--address`` (127.0.0.1 only).  While a legitimate client in a process of its own
sends NOOPs, publishes guaranteed messages and receives and ACKs every one of them, it runs four
attacks, each bounded in count and in time:

- ``flood``: 10,000 TCP connections, opened as fast as the gateway accepts them and held idle;
- ``slow``: slow readers (log in, SUB with a notify window of 1,000, then never read while large
  messages are published to them), slow writers (every command one byte at a time), and
  unfinished frames (a partial line left alone; one dribbled a byte every few seconds);
- ``fuzz``: 1,000,000 frames over several logged-in guest connections: a pool drawn by hypothesis
  from the strategies of tests/gateway/test_fuzz.py (deploy/frame_strategies.py), multiplied by a
  seeded mutator (bit flips, cuts, duplications, splices); a closed connection is opened again;
- ``brute``: wrong passwords for one account, pipelined over many connections, at full speed,
  while the account's owner tries the right one every couple of seconds.

It reports per phase: connections accepted, refused and held; the legitimate client's NOOP
latency (p50/p99/max, and NOOPs unanswered within 5 s) before and during; the gateway's resident
memory (peak per phase, VmHWM overall) and CPU; and at the end whether the gateway is alive, every
message answered 200 reached the subscriber, and what the gateway logged as errors.  Figures go to
``bench-results/adversary-<date>.json``; the exit code is 0 only if nothing crashed, nothing was
lost and the legitimate client was served throughout.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import multiprocessing
import os
import re
import resource
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator

from deploy.adversary_attacks import brute, flood, fuzz, slow
from deploy.adversary_legit import latency_figures, legit_main
from deploy.adversary_wire import LEGIT_TOPIC, PASSWORDS, error_name
from deploy.broker import KafkaBroker, create_topics, free_port, wait_for_port
from deploy.stack import cpu_seconds, peak_memory_mb, resident_memory_mb, stopping_on_sigterm
from schemas.config import load_config


ROOT = Path(__file__).resolve().parents[1]


# -- measuring the gateway process

class Sampler:
    """The gateway's resident memory every ``interval`` seconds, in a thread of its own (so a busy
    event loop here does not skip samples); ``peak(start, end)`` is a phase's highest."""

    def __init__(self, pid: int | None, interval: float = 0.25):
        self.pid, self.interval = pid, interval
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def __enter__(self) -> Sampler:
        if self.pid:
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(2)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            with contextlib.suppress(OSError, ValueError):
                self.samples.append((time.time(), resident_memory_mb(self.pid)))

    def peak(self, start: float, end: float) -> float | None:
        inside = [mb for t, mb in self.samples if start <= t <= end]
        return max(inside) if inside else None


@dataclass
class PhaseWindow:
    name: str
    start: float
    end: float = 0.0
    cpu_start: float = 0.0
    figures: dict = field(default_factory=dict)


# -- the stack and the run

@contextlib.contextmanager
def own_stack(workdir: str) -> Iterator[tuple[tuple[str, int], subprocess.Popen]]:
    """A Kafka node and one gateway process (no streaming job) with the run's accounts, hashed as
    ``python -m gateway.accounts`` would (200,000 PBKDF2 iterations: what a guess costs the gateway)."""
    from gateway.accounts import hash_password

    with KafkaBroker(f"{workdir}/kafka", settings=load_config(env={}).local_kafka) as broker:
        config = load_config(env={}, data_dir=f"{workdir}/data", kafka={"bootstrap": broker.bootstrap},
                             gateway={"port": free_port()})
        create_topics(config.kafka)
        config_file = Path(workdir, "smqp.toml")
        config_file.write_text("[accounts]\n" + "".join(f'{name} = "{hash_password(password)}"\n'
                                                        for name, password in PASSWORDS.items()))
        env = dict(os.environ, SMQP_CONFIG=str(config_file), SMQP_DATA_DIR=config.data_dir,
                   SMQP_KAFKA_BOOTSTRAP=broker.bootstrap, SMQP_GATEWAY_PORT=str(config.gateway.port))
        gateway = subprocess.Popen([sys.executable, "-m", "gateway.server"], env=env, start_new_session=True,
                                   stdout=open(f"{workdir}/gateway.log", "wb"), stderr=subprocess.STDOUT)
        try:
            wait_for_port(config.gateway.host, config.gateway.port, 120)
            yield (config.gateway.host, config.gateway.port), gateway
        finally:
            if gateway.poll() is None:
                gateway.send_signal(signal.SIGTERM)
                try:
                    gateway.wait(60)
                except subprocess.TimeoutExpired:
                    os.killpg(gateway.pid, signal.SIGKILL)
                    gateway.wait(10)


def raise_file_limit(needed: int) -> dict:
    """Raise this process's soft RLIMIT_NOFILE towards ``needed`` (up to the hard limit); a gateway
    started afterwards inherits it.  Says what it found, what it set and whether that suffices."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = soft if soft >= needed else (needed if hard == resource.RLIM_INFINITY else min(hard, needed))
    if target != soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return {"soft_before": soft, "hard": hard, "soft_now": target, "needed": needed, "enough": target >= needed}


def gateway_log_errors(path: Path | None) -> dict:
    """Tracebacks and ERROR lines the gateway logged (the first few, by kind)."""
    if path is None or not path.exists():
        return {"log": None}
    text = path.read_text(errors="replace")
    kinds: collections.Counter = collections.Counter()
    for entry in re.split(r"\n(?=\d{4}-\d\d-\d\d )", text):
        if " ERROR " not in entry and "Traceback" not in entry:
            continue
        lines = entry.splitlines()
        raised = [line for line in lines if re.match(r"^[A-Za-z_.]+(Error|Exception|Misuse)\b", line)]
        ours = [line.strip() for line in lines if re.search(r'File "[^"]*/(gateway|kafka_edge|schemas)/', line)]
        logged = re.sub(r"\(.*|\d+", "", lines[0].split(" ERROR ", 1)[-1])[:60].strip()
        kinds[" | ".join(filter(None, (logged, raised[-1][:120] if raised else "", ours[-1] if ours else "")))] += 1
    return {"log": str(path), "tracebacks": text.count("Traceback (most recent call last)"),
            "errors_by_kind": dict(kinds.most_common(10))}


async def run_phases(address, args, gateway_pid: int | None, sampler: Sampler) -> list[PhaseWindow]:
    attacks = {"flood": flood, "slow": slow, "fuzz": fuzz, "brute": brute}
    windows = []

    async def phase(name: str, work) -> None:
        window = PhaseWindow(name, time.time(), cpu_start=cpu_seconds(gateway_pid) if gateway_pid else 0.0)
        print(f"[{datetime.now().strftime('%H:%M:%S')}] phase {name} ...", flush=True)
        try:
            window.figures = await work
        except Exception as error:  # noqa: BLE001 - one phase failing is a result, the others still run
            window.figures = {"phase_failed": f"{error_name(error)}: {error}"}
        window.end = time.time()
        if gateway_pid:
            window.figures["gateway_cpu_s"] = round(cpu_seconds(gateway_pid) - window.cpu_start, 1)
            window.figures["gateway_rss_peak_mb"] = sampler.peak(window.start, window.end)
        windows.append(window)
        print(f"  {name}: {json.dumps(window.figures)}", flush=True)

    await phase("before", asyncio.sleep(args.quiet_seconds, result={}))
    for name in args.phases:
        await phase(name, attacks[name](address, args))
        await phase(f"after {name}", asyncio.sleep(args.settle_seconds, result={}))
    return windows


def report(args, windows: list[PhaseWindow], legit: dict, gateway, limits: dict, log: Path | None,
           started: datetime) -> dict:
    alive = gateway.poll() is None if gateway else None
    phases = {}
    for window in windows:
        phases[window.name] = {"phase_seconds": round(window.end - window.start, 1),
                               "legit_noop": latency_figures(legit["samples"], window.start, window.end),
                               **window.figures}
        attack = phases[window.name].pop("attack_window", None)
        if attack:  # the attack proper, without its preparation or aftermath
            phases[window.name]["legit_noop_during_attack"] = latency_figures(legit["samples"], *attack)
    unserved = sum(p["legit_noop"]["unanswered"] for p in phases.values())
    result = {
        "started": started.isoformat(timespec="seconds"), "ended": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "commit": subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                                 text=True).stdout.strip(),
        "host": {"cores": os.cpu_count(), "load_average_end": [round(x, 2) for x in os.getloadavg()], "note": args.note},
        "target": "own stack: Kafka + one gateway process, no streaming job (DELIVERY ALL is routed early by the "
                  "gateway)" if args.own_stack else f"{args.address}",
        "settings": {k: v for k, v in vars(args).items() if k not in ("file_limit", "note")},
        "gateway_limits": limits, "file_limit": args.file_limit,
        "phases": phases,
        "legit": {"noop_interval_s": args.noop_interval, "published": legit["published"], "received": legit["received"],
                  "lost": legit["lost"], "lost_smuids": legit["lost_smuids"], "duplicates": legit["duplicates"],
                  "unexpected": legit["unexpected"], "noops_unanswered": unserved,
                  "events": legit["events"][:30], "events_total": len(legit["events"])},
        "gateway": {"alive_at_end": alive, "exit_code": None if alive or gateway is None else gateway.returncode,
                    "rss_peak_mb": peak_memory_mb(gateway.pid) if alive else None,
                    "rss_end_mb": resident_memory_mb(gateway.pid) if alive else None, **gateway_log_errors(log)},
    }
    result["verdict"] = {"gateway_alive": alive is not False, "no_message_lost": legit["lost"] == 0,
                         "legit_client_always_served": unserved == 0 and not legit["events"],
                         "no_error_logged_by_gateway": not result["gateway"].get("tracebacks")}
    return result


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m deploy.adversary", description=__doc__.split("\n\n")[0],
                                     epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--address", help="attack this running gateway (host:port, 127.0.0.1 only; it must accept guest and have "
                          "the accounts legit, legit_pub, legit_sub, victim with this script's passwords) "
                          "instead of starting a stack")
    add("--gateway-pid", type=int, help="with --address: the gateway's process id, to measure its memory and CPU")
    add("--phases", default="flood,slow,fuzz,brute", help="which attacks, in order (default: all four)")
    add("--quick", action="store_true", help="every phase scaled down to seconds (development)")
    add("--quiet-seconds", type=float, default=10, help="legitimate traffic alone before the attacks (default 10)")
    add("--settle-seconds", type=float, default=5, help="legitimate traffic alone after each attack (default 5)")
    add("--noop-interval", type=float, default=0.05, help="seconds between the legitimate client's NOOPs (default 0.05)")
    add("--publish-rate", type=float, default=20, help="legitimate guaranteed PUBs per second (default 20)")
    add("--drain-seconds", type=float, default=30, help="allowed for the last messages to arrive (default 30)")
    add("--flood", type=int, default=10_000, help="connections opened and held (default 10,000)")
    add("--flood-concurrency", type=int, default=500, help="connections being opened at once (default 500)")
    add("--flood-hold", type=float, default=10, help="seconds they are held before checking them (default 10)")
    add("--flood-seconds", type=float, default=120, help="time bound for opening them (default 120)")
    add("--slow-seconds", type=float, default=45, help="length of the slow phase (default 45: beyond the "
                                                        "default frame_timeout_s of 30)")
    add("--slow-readers", type=int, default=50, help="subscribers that never read (default 50)")
    add("--slow-messages", type=int, default=400, help="messages published to them (default 400)")
    add("--slow-message-bytes", type=int, default=16384, help="size of each (default 16 KiB)")
    add("--slow-writers", type=int, default=50, help="clients sending a byte at a time (default 50)")
    add("--slow-byte-interval", type=float, default=0.1, help="seconds between their bytes (default 0.1)")
    add("--unfinished", type=int, default=10, help="frames left unfinished, and as many dribbled (default 10 each)")
    add("--dribble-interval", type=float, default=5, help="seconds between dribbled bytes (default 5)")
    add("--fuzz-frames", type=int, default=1_000_000, help="random and mutated frames sent (default 1,000,000)")
    add("--fuzz-pool", type=int, default=15_000, help="frames drawn by hypothesis, then mutated (default 15,000)")
    add("--fuzz-connections", type=int, default=32, help="connections sending them at once (default 32)")
    add("--fuzz-seconds", type=float, default=300, help="time bound of the fuzz (default 300)")
    add("--seed", type=int, default=32, help="seed of the pool and of the mutations (default 32)")
    add("--brute-attempts", type=int, default=1_000_000, help="wrong passwords tried (default 1,000,000)")
    add("--brute-connections", type=int, default=50, help="connections trying them (default 50)")
    add("--brute-seconds", type=float, default=30, help="time bound of the brute force (default 30)")
    add("--owner-wait", type=float, default=45, help="seconds to wait for the owner to get in afterwards (default 45)")
    add("--note", default="", help="a remark stored with the figures (e.g. what else the host was running)")
    add("--json", help="where the figures go (default bench-results/adversary-<UTC date>.json)")
    args = parser.parse_args(argv)
    if args.quick:
        for name, value in dict(quiet_seconds=3, settle_seconds=2, flood=500, flood_hold=2, slow_seconds=8,
                                slow_readers=5, slow_messages=100, slow_writers=5, slow_byte_interval=0.02,
                                unfinished=2, dribble_interval=1, fuzz_frames=20_000, fuzz_pool=500, fuzz_connections=4,
                                fuzz_seconds=60, brute_attempts=2_000, brute_connections=10, brute_seconds=10,
                                owner_wait=40, drain_seconds=15).items():
            if getattr(args, name) == parser.get_default(name):
                setattr(args, name, value)
    args.phases = [p.strip() for p in args.phases.split(",") if p.strip()]
    unknown = set(args.phases) - {"flood", "slow", "fuzz", "brute"}
    if unknown:
        parser.error(f"unknown phase(s) {sorted(unknown)}")
    if args.address:
        host, _, port = args.address.rpartition(":")
        if host not in ("127.0.0.1", "localhost"):
            parser.error("--address: this script attacks 127.0.0.1 only")
        args.address = ("127.0.0.1", int(port))
    args.own_stack = not args.address
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = datetime.now(timezone.utc)
    needed = (args.flood if "flood" in args.phases else 0) + args.brute_connections + args.slow_readers \
        + args.slow_writers + 2 * args.unfinished + args.fuzz_connections + 200
    args.file_limit = raise_file_limit(needed)
    if not args.file_limit["enough"]:
        print(f"file limit: {args.file_limit['soft_now']} open files allowed (hard limit {args.file_limit['hard']}), "
              f"{needed} needed: the flood will hit EMFILE on this side before the gateway's limits", flush=True)
    limits = {k: getattr(load_config(env={}).gateway, k) for k in (
        "max_connections", "max_logins", "max_bad_commands", "frame_timeout_s", "max_buffered_bytes",
        "stalled_client_timeout_s", "max_login_failures", "login_lockout_s")} if args.own_stack else "unknown"
    workdir = tempfile.mkdtemp(prefix="smqp-adversary-")
    try:
        with stopping_on_sigterm():
            if args.own_stack:
                print(f"starting Kafka and one gateway (no streaming job: DELIVERY ALL is routed early by the "
                      f"gateway); logs in {workdir}", flush=True)
                with own_stack(workdir) as (address, gateway):
                    result = _attack(address, gateway, args, limits, Path(workdir, "gateway.log"), started)
            else:
                result = _attack(args.address, None, args, limits, None, started)
    except KeyboardInterrupt:
        print("adversary: interrupted; what it started is stopped", flush=True)
        return 130
    path = Path(args.json or ROOT / f"bench-results/adversary-{started.strftime('%Y-%m-%d')}.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("legit", "gateway", "verdict")}, indent=2))
    print(f"figures in {path}", flush=True)
    ok = all(result["verdict"].values())
    print("adversary:", "gateway alive, no message lost, legitimate client served throughout" if ok
          else f"FOUND PROBLEMS: {result['verdict']}", flush=True)
    return 0 if ok else 1


class _PidOnly:
    """What ``report`` needs of a gateway it did not start (--gateway-pid)."""

    def __init__(self, pid: int):
        self.pid, self.returncode = pid, None

    def poll(self) -> int | None:
        return None if Path(f"/proc/{self.pid}").exists() else -1


def _attack(address, gateway, args, limits, log: Path | None, started: datetime) -> dict:
    """The legitimate client's process, the attacks, then its figures and the report."""
    if gateway is None and args.gateway_pid:
        gateway = _PidOnly(args.gateway_pid)
    context = multiprocessing.get_context("spawn")
    ours, theirs = context.Pipe()
    legit = context.Process(target=legit_main, name="legit-client", daemon=True,
                            args=(address, LEGIT_TOPIC, args.publish_rate, args.noop_interval, args.drain_seconds, theirs))
    legit.start()
    try:
        if not ours.poll(120) or not ours.recv().get("ready"):
            raise RuntimeError("the legitimate client did not get going within 120 s")
        print(f"legitimate client: NOOP every {args.noop_interval:g} s, {args.publish_rate:g} guaranteed PUB/s "
              f"to {LEGIT_TOPIC}, subscriber ACKing; phases {', '.join(args.phases)}", flush=True)
        pid = gateway.pid if gateway else None
        with Sampler(pid) as sampler:
            windows = asyncio.run(run_phases(address, args, pid, sampler))
        print("stopping the legitimate publisher; waiting for its last messages ...", flush=True)
        ours.send("stop")
        if not ours.poll(args.drain_seconds + 60):
            raise RuntimeError("the legitimate client did not report")
        figures = ours.recv()
    finally:
        legit.join(10)
        if legit.is_alive():
            legit.kill()
    return report(args, windows, figures, gateway, limits, log, started)


if __name__ == "__main__":
    sys.exit(main())
