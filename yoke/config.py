"""Settings: defaults, overridden by YOKE_* environment variables and then by
explicit keyword arguments (the CLI passes its flags that way)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, fields, replace
from typing import Any

from . import errors

DEFAULT_DATABASE_URL = "sqlite:///./.yoke/yoke.db"


@dataclass(frozen=True)
class Settings:
    database_url: str = DEFAULT_DATABASE_URL
    # The role the PostgreSQL runtime logs in as: no BYPASSRLS, so row-level
    # security applies to every query it makes. When database_url logs in
    # with a privileged role or the tables' owner (used for migrations), the
    # runtime connects to the same database as pg_role, or with
    # pg_runtime_url when set.
    # Its name is chosen per database: migrating as the owner creates it and
    # grants it what the runtime needs (docs/production/roles.md), with
    # pg_role_password when set (then also the runtime's login password).
    pg_role: str = "yoke_runtime"
    pg_role_password: str = ""
    pg_runtime_url: str = ""
    # Connections per process: the pool's, plus one for LISTEN (and one at
    # start for migrations); see docs/production/roles.md for sizing.
    pg_pool_min: int = 2
    pg_pool_max: int = 10
    # Each runtime statement's limit on the server (0: none); a statement
    # past it is cancelled and answered as retryable (503).
    pg_statement_timeout_s: float = 0.0
    # A server that takes connections but answers nothing (a hung machine, a
    # partition) must not hold Yoke for ever: how long a connect waits per
    # host of the URL before trying the next, and how long a runtime
    # statement waits for an answer before its connection is dropped
    # (503, retryable; 0: no limit).
    pg_connect_timeout_s: float = 5.0
    pg_command_timeout_s: float = 15.0
    # What pg_stat_activity shows for this process's connections (the CLI
    # sets "yoke serve", "yoke worker", "yoke migrate", "yoke cli").
    pg_application_name: str = "yoke"
    # Apply pending migrations when a process starts; False (--no-migrate):
    # a pending migration refuses the start (run `yoke migrate` first).
    migrate: bool = True
    # In-memory budgets for ephemeral events (docs/production/memory.md): per stream,
    # per tenant and per process. Past any of them the oldest event under it
    # is evicted (the stream's, the tenant's or the process's oldest).
    ephemeral_buffer_bytes: int = 10 * 1024 * 1024
    ephemeral_tenant_bytes: int = 16 * 1024 * 1024
    ephemeral_process_bytes: int = 64 * 1024 * 1024
    max_event_bytes: int = 64 * 1024
    # Most events one group commit writes in one transaction.
    max_group_events: int = 10_000
    # A tail rereads the store at least this often even without a wake-up,
    # so a lost notification costs latency, never events.
    tail_sweep_s: float = 1.0
    # How often the runtime runs a retention pass.
    prune_interval_s: float = 60.0
    # How often each process publishes the wake events of input records
    # whose outbox rows are due (streams/inputs.py; the appending process
    # does at once); 0: never (this process leaves them to the others).
    input_dispatch_s: float = 1.0
    # Where `yoke serve` keeps the admin token file (and SQLite its objects,
    # next to the database file).
    data_dir: str = ".yoke"
    # HTTP server.
    host: str = "127.0.0.1"
    port: int = 8080
    sse_heartbeat_s: float = 15.0
    access_log: bool = True
    # When set, /metrics requires "Authorization: Bearer <metrics_token>"
    # (its labels name tenants). Off loopback (or behind a proxy) /metrics
    # is refused without one, unless metrics_public says it may be open.
    metrics_token: str = ""
    metrics_public: bool = False
    # Operations (docs/production/): yoke worker's /metrics server (port 0:
    # none); how often the database-sampled gauges are refreshed in the
    # background (0: not in this process); how many tenants get series of
    # their own in them (the rest are summed as tenant="(other)"); stream
    # paths as labels of the subscription series (off: unbounded).
    metrics_port: int = 0
    metrics_host: str = "127.0.0.1"
    metrics_sample_s: float = 15.0
    metrics_max_tenants: int = 100
    metrics_path_labels: bool = False
    # serve and worker: log level (debug, info, warning, error) and format (text, json).
    log_level: str = "info"
    log_format: str = "text"
    # Where the log lines go: stderr, or stdout (the container image's).
    log_stream: str = "stderr"
    # serve and worker: "otlp" installs an OpenTelemetry SDK that exports
    # Yoke's spans over OTLP/HTTP, configured by the standard OTEL_* variables
    # (docs/advanced/tracing.md); "off" installs nothing. An application that
    # opens Yoke itself installs its own provider instead.
    tracing: str = "off"
    # serve: browser origins allowed on /v1 and /v1/stream (comma-separated,
    # * for any, none for no origin); unset keeps the Durable Streams
    # protocol open to any origin and /v1 to none. Behind a TLS proxy,
    # proxy_headers trusts X-Forwarded-Proto/-For from forwarded_allow_ips;
    # tls_cert/tls_key serve HTTPS directly.
    cors_origins: str = ""
    proxy_headers: bool = False
    forwarded_allow_ips: str = "127.0.0.1"
    tls_cert: str = ""
    tls_key: str = ""
    shutdown_timeout_s: float = 10.0
    # Connection edges (yoke/http/connection_limits.py, docs/reference/http.md): a request's
    # line and headers must arrive within http_header_timeout_s, its body
    # within http_body_timeout_s after that; an idle kept-alive connection
    # closes after http_keep_alive_s; at most http_max_connections open
    # connections per server process, SSE tails included (past it: 503;
    # /healthz, /readyz and /metrics are answered all the same), and at most
    # http_max_connections_per_client of them from one client address (0: no
    # such cap; behind a proxy every client is the proxy); a request head
    # (line + headers) is at most http_max_head_bytes.
    http_header_timeout_s: float = 10.0
    http_body_timeout_s: float = 60.0
    http_keep_alive_s: float = 5.0
    http_max_connections: int = 1000
    http_max_connections_per_client: int = 0
    http_max_head_bytes: int = 32 * 1024
    # The Durable Streams protocol (/v1/stream/..., docs/advanced/durable-streams.md):
    # the largest request body a PUT or POST takes; how long a long-poll
    # waits for data before answering 204 (and how often an idle SSE read
    # gets a control event); how long one SSE response lasts before the
    # server ends it (the client reconnects from its last offset).
    protocol_max_body_bytes: int = 16 * 1024 * 1024
    protocol_long_poll_s: float = 20.0
    protocol_sse_max_s: float = 60.0
    # Actors. Where per-instance SQLite databases live: file (embedded
    # default), pg_sqlite (PostgreSQL default) or s3.
    storage: str = ""
    s3_bucket: str = ""
    s3_endpoint_url: str = ""
    s3_prefix: str = "yoke/"
    s3_sync: str = "lazy"  # lazy: upload after writes, flush on shutdown; strict: fsync first
    # Worker membership: heartbeat period and how old a heartbeat may get
    # before the worker is taken for dead and its instances move.
    worker_heartbeat_s: float = 1.0
    worker_stale_s: float = 10.0
    # The scheduler claims at least this often without a wake-up, and runs
    # at most max_in_flight process() calls at once per process.
    scheduler_sweep_s: float = 1.0
    max_in_flight: int = 256
    # Concurrent claim loops per process, each for a share of the instances:
    # one loop's round trip to the store overlaps the others' runs.
    claim_shards: int = 2
    schedule_poll_s: float = 1.0
    # Where actors' process() runs by default (docs/advanced/hosts.md): "inprocess"
    # (the runtime's event loop: fast, unisolated) or "process" (a pool of
    # host_processes host processes, each limited to host_memory_mb of
    # address space when that is above 0). @app.actor(isolation=) overrides.
    isolation: str = "inprocess"
    host_processes: int = 4
    # Runs one host takes at once: 1 isolates each run from every other;
    # more trade that (a crash or a timeout ends every run on the host) for
    # throughput (docs/advanced/hosts.md#the-pool).
    host_runs: int = 1
    host_memory_mb: int = 0
    # Watch the application's files and recycle the hosts when they change
    # (serve/worker --reload; docs/advanced/hosts.md#reloading).
    reload: bool = False
    # The deployment version (subscriptions resume halted deliveries on a new one).
    deploy_version: str = ""
    # How long a fork of an instance is kept before it expires (docs/advanced/forks.md).
    fork_ttl_s: float = 7 * 86400.0
    # Actors' retries (docs/basics/actors.md#queues-retries-dead-letters):
    # attempts before a row is dead and the backoff (doubling from base to
    # max, +-20% jitter) for every actor, and per actor as a JSON object
    # ({"billing": {"max_attempts": 2, "retry_base_s": 0.01}}); an argument
    # given to the actor's decorator wins over both.
    # The SQL catalogue (docs/advanced/sql.md): whether this process keeps
    # the mirror of the instances it runs current, and each query's limits
    # (a query may ask for less).
    sql_mirror: bool = True
    sql_max_rows: int = 10_000
    sql_timeout_s: float = 10.0
    actor_max_attempts: int = 5
    actor_retry_base_s: float = 1.0
    actor_retry_max_s: float = 300.0
    actor_retry: str = ""
    # How many instance databases this process keeps open at once (the least
    # recently used idle ones close past it; docs/production/memory.md);
    # 0: up to 1,000, as the file-descriptor limit allows.
    actor_open_databases: int = 0
    # Subscriptions declared on the App (docs/basics/subscriptions.md):
    # secrets their webhooks name with secret_from_setting (a JSON object of
    # name to secret), and whether a subscription the app declared once and
    # no longer declares is removed at start (else only reported).
    webhook_secrets: str = ""
    remove_undeclared_subscriptions: bool = False
    # Subscriptions: how often the engine sweeps every tenant's leases
    # without being asked (the safety net: it sweeps at once on a change it
    # hears of), how long a delivering process may stay silent before its
    # subscriptions go to others (it heartbeats four times per lease), the
    # retry ladder (doubling from base to max, +-20% jitter; tests make the
    # clock fast by lowering these) and the receiver timeout (webhook
    # response, call and processor).
    subscription_sweep_s: float = 30.0
    subscription_lease_s: float = 10.0
    subscription_retry_base_s: float = 1.0
    subscription_retry_max_s: float = 1800.0
    subscription_timeout_s: float = 20.0
    # Filters (docs/reference/http.md#expensive-filters): the processes per server
    # process that evaluate expensive JSONata expressions (regexes, function
    # definitions, ... and those found slow) away from the event loop,
    # tenants taking turns; how many tails with an expensive where= one
    # token, and one tenant, may hold open in one process (past it: 429).
    filter_processes: int = 2
    expensive_tails_per_token: int = 4
    expensive_tails_per_tenant: int = 16

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None, **overrides: Any) -> Settings:
        env = dict(os.environ if env is None else env)
        values: dict[str, Any] = {}
        for f in fields(cls):
            raw = env.get("YOKE_" + f.name.upper())
            if raw is None:
                continue
            kind = type(f.default)
            if kind is bool:
                values[f.name] = raw.strip().lower() in ("1", "true", "yes", "on")
            else:
                values[f.name] = kind(raw) if kind in (int, float) else raw
        settings = cls(**values)
        return replace(settings, **{k: v for k, v in overrides.items() if v is not None})


def json_object_setting(text: str, name: str, values: type, shape: str) -> dict[str, Any]:
    """A setting holding a JSON object whose values are ``values`` (""
    is none); ``shape`` says what it holds, for the error."""
    if not text.strip():
        return {}
    try:
        parsed = json.loads(text)
    except ValueError as exc:
        raise errors.InvalidInput(f"{name} is not valid JSON: {exc}", field=name) from None
    if not isinstance(parsed, dict) or not all(isinstance(v, values) for v in parsed.values()):
        raise errors.InvalidInput(f"{name} is {shape}", field=name)
    return parsed
