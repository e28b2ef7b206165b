"""The one configuration object, passed down to every part of the system.

Read from a TOML file (``--config`` or ``$SMQP_CONFIG``), then overridden by
environment variables named ``SMQP_<SECTION>_<KEY>`` (for example
``SMQP_KAFKA_BOOTSTRAP=10.0.0.5:9092``).  Every key has a default, so the
whole system runs locally with no file at all.  ``deploy/smqp.example.toml``
documents every key.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field, fields, is_dataclass, replace
from pathlib import Path
from typing import Any, Mapping


@dataclass(frozen=True)
class KafkaConfig:
    bootstrap: str = "127.0.0.1:19092"
    commands_topic: str = "smqp.commands"
    deliveries_topic: str = "smqp.deliveries"
    commands_partitions: int = 1
    deliveries_partitions: int = 1
    # how long a gateway's append no client waits on alone (pipelined PUBs, ACKs within a NOTIFY window) may
    # wait for others to share its produce request (Kafka's linger.ms), until batch_bytes wait (Kafka's
    # batch.size); a lone PUB or a window-1 ACK is sent at once.  0: appends made while a partition's
    # request is out still share the next one.  Measured on Kafka (bench-results/ab-linger/, medians of
    # 3 alternating runs), 0 against 20: ingest 17,270 vs 14,785 msg/s at 15 % less CPU per PUB, fan-out
    # the same (22,172 vs 22,576 deliveries/s); 20 was for tansu, which listed every batch at each fetch.
    # At a steady 1,000 msg/s (two full comparisons, bench-results/compare-2026-11-27-*) 0 took publish ->
    # NOTIFY from p50 14.4 / p99 25.5 ms to 0.7 / 5.5, for 2.7x the gateway's CPU per message (585 vs 212
    # µs: a produce request and a fetch per message instead of one per 20 ms); under load batches fill anyway
    linger_ms: int = 0
    batch_bytes: int = 16384
    delivery_timeout_ms: int = 15000  # a PUB not durable by then gets 503
    # the longest a gateway's fetch waits at the broker for records (Kafka's fetch.max.wait.ms and default):
    # Kafka answers the moment a record arrives, so this costs no latency; it is how often an idle tail asks
    fetch_max_wait_ms: int = 500
    # a gateway's fetch is answered once this many bytes are there, or after fetch_max_wait_ms
    fetch_min_bytes: int = 1


@dataclass(frozen=True)
class LocalKafkaConfig:
    """The one-node Apache Kafka that ``smqp-local`` (and the test suite) starts (deploy/broker.py);
    a deployment on a Kafka cluster of its own ignores this section."""

    heap: str = "512m"  # the JVM's -Xmx
    controller_port: int = 19093  # the KRaft controller's listener on 127.0.0.1 (the broker's: [kafka] bootstrap)
    # fsync every append before acknowledging it (log.flush.interval.messages=1), as RabbitMQ does for
    # persistent messages; Kafka's default, false, acknowledges once the record is in the page cache
    flush_every_message: bool = False


@dataclass(frozen=True)
class GatewayConfig:
    host: str = "127.0.0.1"
    port: int = 7720
    server_ident: str = "SMQP-on-Spark/0.1"
    server_host: str = "localhost"  # host part of Smuid attributes
    node_id: int = 0  # 0..1022, unique per gateway of a farm: part of every SMUID (1023 is the job's)
    default_timeout: str = "01:00:00:00"
    allow_guest: bool = True
    max_line_bytes: int = 8192
    max_header_lines: int = 256
    max_message_bytes: int = 1 << 20
    frame_timeout_s: float = 30.0  # an unfinished frame older than this gets 408 and a close
    max_bad_commands: int = 20  # syntax errors tolerated per session before it is closed
    max_children_per_topic: int = 1000  # CREATE TOPIC beyond this gets 414
    max_logins: int = 10000  # LOGIN beyond this many logins on this gateway gets 311 (or 503)
    redirect_to: str = ""  # "host:port" of another gateway of the farm for that 311; "" = 503
    max_connections: int = 20000  # beyond this, "SMQP/1.0 Not Available." and a close
    # connections the kernel queues before the gateway accepts them (capped by net.core.somaxconn):
    # asyncio's default of 100 left 145 of a 10,000-connection burst ungreeted for 10 s
    listen_backlog: int = 1024
    max_subscriptions: int = 1000  # message subscriptions per account; beyond, 510
    max_topics_per_subscribe: int = 1000  # a wildcard SUB reaching more topics gets 414
    # failed logins of one account from one address (IPv6: its /64) within login_lockout_s before that
    # address's attempts at it are refused unchecked, for login_throttle_s after each further failure: the
    # longest a correct password is refused; other addresses are never refused for those failures
    max_login_failures: int = 5
    login_lockout_s: float = 30.0
    login_throttle_s: float = 3.0
    tls_port: int = 0  # SMQPS (TLS) listener beside the plain one; 0 = off
    tls_cert: str = ""  # PEM certificate chain for SMQPS
    tls_key: str = ""  # PEM private key for SMQPS
    # with tls_port set: LOGIN … CLEAR/1.0 and SET LOGIN PASSWORD CLEAR/1.0 on the plain port get 405
    # (the password would cross it readable); SCRAM-SHA-256 stays allowed there
    clear_only_over_tls: bool = True
    # SET NOTIFY PORT may name the session's own address, or one of these hosts (addresses or names)
    notify_hosts: tuple[str, ...] = ()
    # a TLS session's SET NOTIFY PORT connection is TLS too: the CA file (PEM) its listener's certificate
    # is checked against; "" = the system's trusted CAs
    notify_tls_ca: str = ""
    status_port: int = 0  # HTTP /metrics (Prometheus) on this port of ``host``; 0 = off
    # bytes a connection may hold unread by its client (outbox + transport); past half of it its commands
    # are not read, a notification that would pass it closes it
    max_buffered_bytes: int = 4 << 20
    stalled_client_timeout_s: float = 30.0  # a client past half of max_buffered_bytes this long is closed
    # SET NOTIFY WINDOW (extension): the most guaranteed NOTIFYs one login may ask to have awaiting ACK
    max_notify_window: int = 1000
    # NOTIFY a DELIVERY ALL message as soon as this gateway has folded its publish from the commands log,
    # routing it by the same rule the job applies, instead of waiting for the job's micro-batch; the job
    # still records every delivery.  Takes effect with one commands partition only.
    route_early: bool = True
    # bytes of COUNT / LIST / GET MESSAGE reads of the Delta tables' latest versions kept for the polls
    # that repeat them before the job's next commit (gateway.server.kept_reads); 0 = read the files each time
    kept_read_bytes: int = 32 << 20
    # SIGTERM (a planned stop) tells clients NOTIFY SERVER BYE <this>, takes no new connection, serves
    # those it has this long (or until they left), then closes; 0 = BYE and close at once.  SIGINT
    # closes at once; ``python -m gateway.admin bye`` names its own grace
    shutdown_grace_s: float = 0.0

    def __post_init__(self) -> None:
        if isinstance(self.notify_hosts, str):  # SMQP_GATEWAY_NOTIFY_HOSTS=host,host
            hosts = (host.strip() for host in self.notify_hosts.split(","))
            object.__setattr__(self, "notify_hosts", tuple(host for host in hosts if host))
        else:
            object.__setattr__(self, "notify_hosts", tuple(self.notify_hosts))
        if self.login_throttle_s < 0:
            raise ValueError(f"[gateway] login_throttle_s must not be negative, not {self.login_throttle_s}")
        if self.shutdown_grace_s < 0:
            raise ValueError(f"[gateway] shutdown_grace_s must not be negative, not {self.shutdown_grace_s}")
        if self.max_notify_window < 1:
            raise ValueError(f"[gateway] max_notify_window must be at least 1, not {self.max_notify_window}")
        if self.kept_read_bytes < 0:
            raise ValueError(f"[gateway] kept_read_bytes must not be negative, not {self.kept_read_bytes}")


@dataclass(frozen=True)
class StreamingConfig:
    master: str = "local[2]"
    shuffle_partitions: int = 1
    trigger_interval: str = "0 seconds"
    # a burst the deferral waits out fits in one batch (≈ 3 s of this host's top rate of commands): a
    # full batch starts at once, and at 20,000 a fan-out's first batch ran while its NOTIFYs were going out
    max_records_per_batch: int = 100_000
    # a batch holding a REMOVE TOPIC (which goes to the routing query, whose time grows with its rows:
    # ~2 s at 1,000, 4-6 s at 20,000) ends this many records in, or just before that command when it comes
    # later; what follows is routed by the next batches, on the driver when simple.  A backlog arriving
    # with a command the query routed (then a SUBSCRIBE) waited 54 s whole.  0 = no bound
    # (python source only)
    max_records_per_query_batch: int = 2_000
    poll_timeout_ms: int = 50
    # how long the job's appends to Kafka (deliveries, ticks) wait for it before a batch fails, and the
    # query with it: a Kafka outage shorter than this only pauses routing.  The gateways' own bound,
    # [kafka] delivery_timeout_ms, is short because a client waits on each of their appends
    kafka_outage_s: float = 300.0
    # a batch that finds a burst of commands goes on reading while it lasts (a poll every busy_gap_ms
    # brings busy_rate a second or more; the job's own ticks are not commands here), up to this long:
    # the gateways NOTIFY DELIVERY ALL messages without the job, so a burst gets the host's cores, and
    # the job routes it afterwards in one batch, paying a batch's fixed cost (Delta commits) once.
    # Measured on Kafka (bench-results/ab-defer/, medians of 3 alternating runs): 0 instead of 3 cost
    # the fan-out 21 % (27,261 -> 21,570 deliveries/s) and the drain 21 % (23,784 -> 18,756 msg/s);
    # publish -> NOTIFY at 1,000 msg/s was the same (p50 15 ms).  0 = never (python source only)
    defer_while_busy_s: float = 3.0
    busy_gap_ms: int = 200
    # commands a second that make a burst.  Slower traffic is routed at once, so what waits on the job
    # (DELIVERY ONE, expiry, receipts, Delta) does not lag behind it: at 1,000 msg/s a deferred batch
    # came every 5 s.  The bursts the deferral is for run at 16,000-25,000 commands a second on this
    # host (ingest, fan-out, drain); 0 = any command is a burst (every batch deferred by busy_gap_ms)
    busy_rate: int = 5000
    query_name: str = "smqp-router"
    # plan and run the routing query once on made-up commands before the stream starts (streaming.warm_up):
    # a cold JVM's first query took 12 s for 2,000 commands with a SUBSCRIBE, 5 s after a 10-s warm-up
    warm_up: bool = True
    tick_interval_s: float = 1.0  # a Tick to commands partition 0 this often (expiry with no traffic); 0 = off
    trash_retention: str = "07:00:00:00"  # how long the Trash keeps a message (spec timeout format); INFINITE = forever
    trash_sweep_interval_s: float = 3600.0  # the Trash is emptied at most this often, by the job's clock; 0 = every batch
    # the job's tables are compacted this often (by its clock, between batches): each batch writes a
    # small file to each, and every read and merge looks at every file; 0 = never
    compact_interval_s: float = 300.0
    # and a table is compacted as soon as it has this many files more than after its last compaction
    # (one table a batch at most): a whole-topic read opens every file, ~1.7 ms each on this host, and
    # a Trash polled by LIST MESSAGE grew 100 files a minute at low load; 0 = by the interval only
    compact_files: int = 50
    compact_target_mb: int = 16  # files smaller than this are packed together, up to this size
    # but a table compacted for its files alone (compact_files) packs only those smaller than this
    # (MiB): a compaction rewrites the newest packed file too while it is under its target, so with
    # 16 every such compaction, one in fifty batches, copied what the table gained since the last
    # interval (messages at 1,000 msg/s: 74,000 rows, 115-177 ms, growing; the interval packs them)
    compact_step_mb: float = 1.0
    # "python": the smqp_kafka source (kafka-python on the driver, works everywhere), which defers a
    # burst's batch (defer_while_busy_s) and bounds a batch the routing query must route;
    # "kafka": Spark's built-in Kafka source (its jars come from the Maven cache: deploy/spark-jars).
    # Side by side (bench-results/kafka-source-fetch-wait-2026-11-30/): Spark's had the better job
    # latency tails at a steady 1,000 msg/s and its job peaked 580 MiB lower; ours fanned out 17-20 %
    # more, and at 5,000 msg/s offered NOTIFYed p99 555-1,344 ms against 2,785-3,285 (the job's CPU a
    # message 81-82 us against 124-133)
    source: str = "python"
    # route every batch but one with a REMOVE TOPIC (publishes, ACKs, NACKs, (UN)SUBSCRIBEs, SINCE's
    # clearing, expiry, receipts) on the driver (streaming.simple_batch) instead of planning
    # the routing query for it; false: every batch through the routing query, for comparison
    simple_batches: bool = True
    # extra Spark properties for the job's session; spark-submit's --conf wins over them
    spark_conf: Mapping[str, str] = field(default_factory=dict)
    # CPU priority of the job (its driver, JVM and Python workers) where it shares a host with gateways:
    # gateways NOTIFY DELIVERY ALL messages without waiting for it, so they go first and the job takes
    # the spare cycles (its micro-batches then grow and cost less per message); 0 = as any process
    nice: int = 10

    def __post_init__(self) -> None:
        if not 0 <= self.nice <= 19:
            raise ValueError(f"[streaming] nice must be 0..19, not {self.nice}")
        if self.source not in ("python", "kafka"):
            raise ValueError(f"[streaming] source must be \"python\" or \"kafka\", not {self.source!r}")
        if self.compact_files < 0:
            raise ValueError(f"[streaming] compact_files must be 0 (off) or more, not {self.compact_files}")
        if not 0 < self.compact_step_mb <= self.compact_target_mb:
            raise ValueError(f"[streaming] compact_step_mb must be over 0 and at most compact_target_mb "
                             f"({self.compact_target_mb}), not {self.compact_step_mb}")


@dataclass(frozen=True)
class DashboardConfig:
    host: str = "127.0.0.1"
    port: int = 7722
    # the gateways' status pages to aggregate ("http://host:port/metrics"); empty: this
    # configuration's own gateway, when its status_port is set
    gateways: tuple[str, ...] = ()
    # the link processes' status pages ("http://host:port/metrics", smqp-link's [federation]
    # status_port); empty: this configuration's own, when it has links and a status_port
    links: tuple[str, ...] = ()
    refresh_s: float = 2.0  # how often the dashboard re-reads the tables and the gateways (and the page polls)
    scrape_timeout_s: float = 2.0  # a gateway that does not answer by then is shown as down
    history_batches: int = 120  # micro-batches of the metrics table shown in the charts

    def __post_init__(self) -> None:
        for name in ("gateways", "links"):  # SMQP_DASHBOARD_GATEWAYS=url,url, SMQP_DASHBOARD_LINKS=url,url
            urls = getattr(self, name)
            object.__setattr__(self, name, tuple(u.strip() for u in urls.split(",") if u.strip())
                               if isinstance(urls, str) else tuple(urls))

    def gateway_urls(self, gateway: GatewayConfig) -> tuple[str, ...]:
        """The status pages to scrape: ``gateways``, else ``gateway``'s own when it has one."""
        if self.gateways:
            return self.gateways
        if gateway.status_port:
            return (_status_url(gateway.host, gateway.status_port),)
        return ()

    def link_urls(self, gateway: GatewayConfig, federation: FederationConfig) -> tuple[str, ...]:
        """The link processes' status pages to scrape: ``links``, else this configuration's own (which
        listens on ``gateway.host``) when it has links and a ``status_port``."""
        if self.links:
            return self.links
        if federation.links and federation.status_port:
            return (_status_url(gateway.host, federation.status_port),)
        return ()


def _status_url(host: str, port: int) -> str:
    """A status page listening on ``host:port``, as a scraper on this machine reaches it."""
    host = "127.0.0.1" if host in ("0.0.0.0", "", "::") else host
    return f"http://{host}:{port}/metrics"


@dataclass(frozen=True)
class LinkConfig:
    """One peer farm this farm links to (spec 2.3), a ``[[federation.links]]`` table.

    The link process (``federation/``) is an SMQP client of the peer: it logs in there as ``account``
    (an account of the peer, whose UAL on the peer decides what this farm may read) and subscribes to
    what this farm's subscribers want, so the peer forwards to it what their ``Depth`` allows.
    Passwords are never in the file: ``password_env`` names the environment variable holding it."""

    domain: str  # the peer's domain: its [gateway] server_host
    address: str  # "host:port" of one of the peer's gateways (its SMQPS port when ``tls``)
    account: str = ""  # the peer's account this farm logs in as for forwarding; "" = guest
    password_env: str = ""  # environment variable with that account's password ("" = "guest")
    tls: bool = False  # SMQPS to the peer
    tls_ca: str = ""  # PEM CA bundle verifying the peer's certificate ("" = the system's)
    # a remote virtual topic (CREATE TOPIC /x > <domain>/y) pulls as the creating account when it is
    # named here (local account -> environment variable with its password on the peer), else as guest
    # (spec 4.1.3: "either the current account or guest")
    accounts: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        host, colon, port = self.address.rpartition(":")
        if not colon or not host or not port.isdigit():
            raise ValueError(f"[[federation.links]] {self.domain!r}: address must be host:port, not {self.address!r}")

    @property
    def host_port(self) -> tuple[str, int]:
        host, _, port = self.address.rpartition(":")
        return host, int(port)


@dataclass(frozen=True)
class FederationConfig:
    """Linked farms (spec 2.3): the peers that log in here and the links this farm keeps.  The farm's
    domain is ``[gateway] server_host``, which its SMUIDs already carry."""

    # account -> domain: sessions of these accounts are other farms' links.  What they subscribe to
    # reaches them only as a message's Depth and Hops allow (schemas.topics.forwards)
    peers: Mapping[str, str] = field(default_factory=dict)
    links: tuple[LinkConfig, ...] = ()  # the peers this farm links to ([[federation.links]])
    node_id: int = 1022  # the link process's part of the SMUIDs it gives forwarded messages here
    status_port: int = 0  # the link process's HTTP /metrics; 0 = off
    retry_initial_s: float = 0.5  # a link that cannot reach its peer retries after this, doubling
    retry_max_s: float = 30.0  # up to this
    # a forwarded message is recognised when it comes again (a second route, a resend after a crash)
    # until this long after its expiry here; a peer never sends a dead message, so the link forgets it then
    seen_grace_s: float = 3600.0

    def __post_init__(self) -> None:
        links = tuple(link if isinstance(link, LinkConfig) else LinkConfig(**link) for link in self.links)
        object.__setattr__(self, "links", links)
        object.__setattr__(self, "peers", {account.lower(): domain.lower() for account, domain in self.peers.items()})
        domains = [link.domain.lower() for link in links]
        if len(set(domains)) != len(domains):
            raise ValueError(f"[[federation.links]]: a domain is linked twice in {domains}")

    def link(self, domain: str) -> LinkConfig | None:
        """The link to ``domain`` (any case), or None."""
        return next((link for link in self.links if link.domain.lower() == domain.lower()), None)


@dataclass(frozen=True)
class SMQPConfig:
    data_dir: str = "smqp-data"
    kafka: KafkaConfig = field(default_factory=KafkaConfig)
    local_kafka: LocalKafkaConfig = field(default_factory=LocalKafkaConfig)
    gateway: GatewayConfig = field(default_factory=GatewayConfig)
    streaming: StreamingConfig = field(default_factory=StreamingConfig)
    dashboard: DashboardConfig = field(default_factory=DashboardConfig)
    federation: FederationConfig = field(default_factory=FederationConfig)
    # account name -> password hash (see gateway.accounts.hash_password)
    accounts: Mapping[str, str] = field(default_factory=dict)
    # topic -> action -> account names: the User Access Lists (see gateway.ual)
    ual: Mapping[str, Mapping[str, list]] = field(default_factory=dict)
    # topic -> queue parameter -> value: per-topic queue parameters, inherited (see schemas.queue_params)
    topics: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        from schemas.queue_params import TopicSettings

        TopicSettings(self.topics)  # a bad [topics."/…"] entry fails at start-up, naming itself

    @property
    def domain(self) -> str:
        """This farm's domain (spec 2.3), lower case: ``[gateway] server_host``, the host part of its SMUIDs."""
        return self.gateway.server_host.lower()

    def table_path(self, name: str) -> str:
        """Where Delta table ``name`` lives."""
        return str(Path(self.data_dir, "tables", name).absolute())

    @property
    def job_kafka(self) -> KafkaConfig:
        """``[kafka]`` as the job appends with it: an append waits for Kafka up to ``[streaming] kafka_outage_s``."""
        return replace(self.kafka, delivery_timeout_ms=round(self.streaming.kafka_outage_s * 1000))

    @property
    def checkpoint_dir(self) -> str:
        return str(Path(self.data_dir, "checkpoints", self.streaming.query_name).absolute())


def _coerce(value: str, target: Any) -> Any:
    """Turn an environment string into the type of the default it overrides."""
    if isinstance(target, bool):
        return value.strip().lower() in ("1", "true", "yes", "on")
    if isinstance(target, int):
        return int(value)
    if isinstance(target, float):
        return float(value)
    return value


def _merge(section: Any, values: Mapping[str, Any], env_prefix: str, env: Mapping[str, str]) -> Any:
    changes = {}
    for f in fields(section):
        current = getattr(section, f.name)
        if is_dataclass(current):
            changes[f.name] = _merge(current, values.get(f.name, {}), f"{env_prefix}{f.name.upper()}_", env)
            continue
        if f.name in values:
            changes[f.name] = values[f.name]
        env_name = f"{env_prefix}{f.name.upper()}"
        if env_name in env and not isinstance(current, Mapping):
            changes[f.name] = _coerce(env[env_name], current)
    unknown = set(values) - {f.name for f in fields(section)}
    if unknown:
        raise ValueError(f"unknown configuration key(s) {sorted(unknown)} in [{env_prefix.strip('_').lower()}]")
    return replace(section, **changes)


def load_config(path: str | os.PathLike | None = None, env: Mapping[str, str] | None = None,
                **overrides: Any) -> SMQPConfig:
    """Defaults, then the TOML file (``path`` or ``$SMQP_CONFIG``), then ``SMQP_*`` variables."""
    env = os.environ if env is None else env
    path = path or env.get("SMQP_CONFIG")
    values: dict[str, Any] = {}
    if path:
        with open(path, "rb") as handle:
            values = tomllib.load(handle)
    values.update(overrides)
    return _merge(SMQPConfig(), values, "SMQP_", env)
