"""The ``gpugate`` command. Each subcommand parses its arguments, calls one function, presents.

Exit codes: 0 success, 1 a failure the message explains (invalid config, port taken, store down),
2 a usage error (argparse). A failure is one line, ``gpugate: error: ...`` (a config's problems:
a line each, ``path.to.key: reason (line N)``), never a traceback: what goes wrong as expected —
a taken port, a URL that is not one, a file that cannot be read — is translated to a
:class:`~gpugate.errors.GpugateError` where it enters, and :func:`main` prints it.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO
from urllib.parse import quote

from gpugate import __version__
from gpugate.config import GatewayConfig, env_problems, fallback_warnings, load_config
from gpugate.config.files import file_problems
from gpugate.errors import ConfigError, ConfigProblem, GpugateError

if TYPE_CHECKING:
    from gpugate.adapters.gateway_api import GatewayApi
    from gpugate.worker import WorkerSettings

DESCRIPTION = """\
gpugate: the front door for a team's GPU work. An OpenAI-compatible gateway that routes to
healthy model servers, couples routing to GPU health from dcgm-exporter, and runs async jobs
durably along a fallback chain of runtimes."""


def _run(coro: object) -> object:
    import uvloop

    return uvloop.run(coro)  # type: ignore[arg-type]


def _print_problems(error: ConfigError, stream: TextIO, summary: TextIO) -> None:
    """Every problem on a line of its own, ``path.to.key: reason (line N)`` (DESIGN §7), then
    ``FILE: N problems`` on ``summary``.

    A problem of the whole document (the file cannot be read, is not YAML) has the file in the
    key's place, and when it is the only one it is all there is. ``check-config`` is a linter,
    so its findings go to stdout (as ruff's and mypy's do) and the count to stderr, leaving
    stdout nothing but problem lines; a command that cannot start because of its config
    prints both on stderr.
    """
    problems, source = error.problems, error.source
    for problem in problems:
        print(_problem_line(problem, source), file=stream)
    if len(problems) == 1 and not problems[0].path and source:
        return  # its line names the file already
    stream.flush()  # the count comes after the lines, on a terminal too
    count = f"{len(problems)} problem{'s' if len(problems) != 1 else ''}"
    print(f"{source}: {count}" if source else count, file=summary)


def _problem_line(problem: ConfigProblem, source: str | None) -> str:
    """``path.to.key: reason (line N)``; for the whole document, the file in the key's place."""
    return str(replace(problem, path=source) if source and not problem.path else problem)


def cmd_serve(args: argparse.Namespace) -> int:
    from gpugate.listen import bind
    from gpugate.logs import configure_logging
    from gpugate.server import serve_gateway
    from gpugate.workers import Supervisor, port_of, reserve

    config = load_config(args.config, environ=os.environ, require_env=True)
    _check_files(config, str(args.config))
    if args.no_access_log:
        config = config.model_copy(
            update={"server": config.server.model_copy(update={"access_log": False})}
        )
    host, port = (config.host, config.port) if args.listen is None else _split_listen(args.listen)
    configure_logging(args.log_format or config.server.log_format, args.log_level)
    workers = args.workers if args.workers is not None else 1
    many = workers > 1  # the supervisor holds the ports, each worker binds them again
    sock = reserve(host, port) if many else bind(host, port)
    admin = config.admin_address
    admin_sock = None if admin is None else reserve(*admin) if many else bind(*admin)
    scheme = "https" if config.tls is not None else "http"
    where = f"{scheme}://{host}:{port_of(sock)}"
    if admin_sock is not None:
        where += f", admin plane on {scheme}://{admin[0] if admin else host}:"
        where += str(port_of(admin_sock))
    if many:  # the supervisor announces it once it handles the signals
        admin_at = None if admin is None or admin_sock is None else (admin[0], port_of(admin_sock))
        where += f" ({workers} workers)"
        announce = f"gpugate {__version__} listening on {where}"
        supervisor = Supervisor(config, workers, host, port_of(sock), admin_at, announce=announce)
        return supervisor.run()
    print(f"gpugate {__version__} listening on {where}", flush=True)
    clean = _run(serve_gateway(config, sock, admin_sock=admin_sock))
    return 0 if clean else 1


def _check_files(config: GatewayConfig, source: str) -> None:
    """What ``serve`` reads at start besides the variables (``load_config`` checked those):
    the TLS files, readable and loadable as a certificate and its key. Before anything is
    bound or announced, so a wrong file is the whole of the output, with its key's line."""
    from gpugate.server import server_tls

    problems = file_problems(config)
    if not problems:
        try:
            server_tls(config.tls, config.source_map)  # each process builds its own later
        except ConfigError as exc:
            problems = exc.problems
    if problems:
        raise ConfigError(problems, source=source)


def cmd_check_config(args: argparse.Namespace) -> int:
    config = load_config(args.file)
    missing = [*env_problems(config, os.environ), *file_problems(config)]
    if missing and args.strict_env:
        raise ConfigError(missing, source=str(args.file))
    for line in config.summary_lines():
        print(line)
    for problem in missing:
        print(f"warning: {problem} (needed at `serve`)")
    for problem in fallback_warnings(config):
        print(f"warning: {problem}")
    print(f"{args.file}: valid")
    return 0


def cmd_db_upgrade(args: argparse.Namespace) -> int:
    from gpugate.wiring import upgrade_store

    dsn = args.store or load_config(args.config).store
    applied = _run(upgrade_store(dsn))
    assert isinstance(applied, list)
    print("applied: " + ", ".join(applied) if applied else "the store is up to date")
    return 0


def cmd_fleet(args: argparse.Namespace) -> int:
    from gpugate.demo import fleet_ports, run_fleet
    from gpugate.fleet import demo_spec

    ports = [args.port] if args.port is not None else args.ports or []
    if ports:
        try:
            fleet_ports(demo_spec(), ports)
        except ValueError as exc:
            print(f"gpugate fleet: {exc}", file=sys.stderr)
            return 2
    _run(run_fleet(gpus=args.gpus, host_label=args.host_label, ports=ports))
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from gpugate.demo import run_demo
    from gpugate.logs import configure_logging

    host, port = _split_listen(args.listen)
    workdir = Path(args.workdir)
    try:
        workdir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        where = f"the work directory {workdir} (--workdir)"
        raise GpugateError(f"cannot use {where}: {exc.strerror or exc}") from exc
    configure_logging("text", args.log_level)
    clean = _run(run_demo(host, port, workdir=workdir, scenario=args.scenario, pace_s=args.pace))
    return 0 if clean else 1


def cmd_gpus_inspect(args: argparse.Namespace) -> int:
    import json

    from gpugate.services.gpu_inspect import inspect_source, render_table

    health = load_config(args.config).gpu_health if args.config else None
    result = _run(inspect_source(args.source, health))
    assert isinstance(result, tuple)
    entries, errors = result
    if args.json:
        print(json.dumps({"gpus": entries, "errors": errors}, indent=2))
    else:
        for line in render_table(entries):
            print(line)
        for error in errors:
            print(f"error: {error}", file=sys.stderr)
    return 1 if errors and not entries else 0


def _api(args: argparse.Namespace, *, token: str | None = None) -> GatewayApi:
    """A client of ``--gateway`` (redirects followed within its origin only), over TLS with
    ``--ca-file`` / ``--cert-file`` / ``--key-file`` when given."""
    from gpugate.adapters.gateway_api import GatewayApi, client_tls

    tls = client_tls(args.ca_file, args.cert_file, args.key_file)
    actor = getattr(args, "actor", None)
    return GatewayApi(_gateway_url(args), token=token, actor=actor, tls=tls)


GATEWAY_URL_ENV = "GPUGATE_URL"
DEFAULT_GATEWAY = "http://127.0.0.1:8080"


def _gateway_url(args: argparse.Namespace) -> str:
    """``--gateway``, else ``$GPUGATE_URL``, else the local default; checked."""
    if args.gateway is not None:
        return _checked_url(args.gateway, "--gateway")
    if GATEWAY_URL_ENV in os.environ:
        where = f"${GATEWAY_URL_ENV} (the default of --gateway)"
        return _checked_url(os.environ[GATEWAY_URL_ENV], where)
    return DEFAULT_GATEWAY


def _checked_url(url: str, where: str) -> str:
    """``url``, or a :class:`GpugateError` naming ``where`` it came from and what is wrong."""
    from gpugate.adapters.gateway_api import base_url_problem

    problem = base_url_problem(url)
    if problem is not None:
        raise GpugateError(f"{where}: not an http(s) URL: {url!r}: {problem}")
    return url


def _read_file(path: Path) -> bytes:
    """The bytes of ``path``, or a :class:`GpugateError` saying why it cannot be read."""
    try:
        return path.read_bytes()
    except OSError as exc:
        raise GpugateError(f"cannot read {path}: {exc.strerror or exc}") from exc


def _write_file(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path``, or a :class:`GpugateError` saying why it cannot be."""
    try:
        path.write_bytes(data)
    except OSError as exc:
        raise GpugateError(f"cannot write {path}: {exc.strerror or exc}") from exc


def _print_json(value: object) -> None:
    import json

    print(json.dumps(value, indent=2))


def cmd_jobs_submit(args: argparse.Namespace) -> int:
    import json

    given: str = args.input
    raw = _read_file(Path(given[1:])) if given.startswith("@") else given
    try:
        payload = json.loads(raw)
    except ValueError as exc:
        raise GpugateError(f"--input is not valid JSON: {exc}") from exc
    body = {"model": args.model, "input": payload, "operation": args.operation}
    body |= {"class": args.job_class, "allow_external": not args.no_external}
    body |= {k: v for k, v in (("runner", args.runner), ("slug", args.slug)) if v}
    headers = {"Idempotency-Key": args.idempotency_key} if args.idempotency_key else {}
    status, job = _api(args).request("POST", "/v1/jobs", body, headers=headers)
    _print_json(job)
    print(f"{'created' if status == 202 else 'existing'} job {job['slug']}", file=sys.stderr)
    return 0


def cmd_jobs_list(args: argparse.Namespace) -> int:
    from urllib.parse import urlencode

    query = {k: v for k, v in (("state", args.state), ("runner", args.runner)) if v}
    query["limit"] = str(args.limit)
    _, page = _api(args).request("GET", "/v1/jobs?" + urlencode(query))
    if page["data"]:
        print(f"{'SLUG':<26} {'STATE':<12} {'RUNNER':<14} {'MODEL':<16} ERROR")
    for job in page["data"]:
        error = (job["error"] or {}).get("code") or ""
        print(
            f"{job['slug']:<26} {job['state']:<12} {job['runner']:<14} {job['model']:<16} {error}"
        )
    if page["next_cursor"]:
        print(f"(more: --cursor {page['next_cursor']})", file=sys.stderr)
    return 0


def cmd_jobs_show(args: argparse.Namespace) -> int:
    api = _api(args)
    _, job = api.request("GET", f"/v1/jobs/{args.slug}")
    _print_json(job)
    if args.events:
        _, events = api.request("GET", f"/v1/jobs/{args.slug}/events")
        for e in events["data"]:
            where = ":".join(p for p in (e["runtime"], e["call_id"]) if p)
            print(f"{e['at']}  {e['status']:<11} {e['error_code'] or '':<22} {where}  {e['actor']}")
    return 0


def cmd_jobs_cancel(args: argparse.Namespace) -> int:
    _, job = _api(args).request("POST", f"/v1/jobs/{args.slug}/cancel")
    _print_json(job)
    if job["state"] != "cancelled":  # a finished job is left as it is: say so, exit 1
        print(f"job {job['slug']} is {job['state']}: nothing to cancel", file=sys.stderr)
        return 1
    return 0


def _admin_api(args: argparse.Namespace) -> GatewayApi:
    """A client of the admin API with the token from ``--token-env``; when that variable is
    unset (or empty) the gateway's 401 says so (:func:`_no_token_hint`)."""
    token = os.environ.get(args.token_env) or None
    if token is None:
        args.unset_token_env = args.token_env
    return _api(args, token=token)


def _no_token_hint(args: argparse.Namespace, exc: GpugateError) -> str:
    """The error line: a 401 answered to a command sent without a token names the variable
    it looked in (else the gateway's "missing or wrong admin token" leaves the user guessing)."""
    unset = getattr(args, "unset_token_env", None)
    if unset is None or getattr(exc, "status", None) != 401:
        return exc.message
    return f"{exc.message} (no token was sent: {unset}, see --token-env, is not set)"


def cmd_runtimes_list(args: argparse.Namespace) -> int:
    _, body = _admin_api(args).request("GET", "/admin/runtimes")
    if args.json:
        _print_json(body)
        return 0
    for r in body["runtimes"]:
        health, last = r["health"], r["last_submit"] or {}
        print(
            f"{r['id']:<16} {r['kind']:<9} {health['state']:<9} queued={r['queue_depth']:<5} "
            f"in_flight={r['in_flight']:<4} last={last.get('outcome', '-'):<10} "
            f"{health['reason'] or ''}"
        )
    return 0


def cmd_runtimes_show(args: argparse.Namespace) -> int:
    _, body = _admin_api(args).request("GET", f"/admin/runtimes/{args.runtime}")
    _print_json(body)
    return 0


def cmd_runtimes_set(args: argparse.Namespace) -> int:
    body = {"reason": args.reason} if args.reason else None
    path = f"/admin/runtimes/{args.runtime}/{args.runtimes_command}"
    _, state = _admin_api(args).request("POST", path, body)
    print(f"runtime {state['runtime']} is {state['state']} (by {state['actor']})")
    return 0


def cmd_config_export(args: argparse.Namespace) -> int:
    kind = "application/json" if args.format == "json" else "application/yaml"
    _, headers, raw = _admin_api(args).send("GET", "/admin/config", headers={"Accept": kind})
    if args.output:
        _write_file(Path(args.output), raw)
    else:
        sys.stdout.write(raw.decode())
    print(f"exported gateway config version {headers.get('x-config-version')}", file=sys.stderr)
    return 0


def cmd_config_import(args: argparse.Namespace) -> int:
    from gpugate.adapters.gateway_api import GatewayApiError

    path = Path(args.file)
    fmt = args.format or ("json" if path.suffix == ".json" else "yaml")
    headers = {"Content-Type": f"application/{fmt}", "Accept": "application/json"}
    document = _read_file(path)
    api = _admin_api(args)
    try:
        _, result = api.send_for_json("PUT", "/admin/config", document, headers=headers)
    except GatewayApiError as exc:
        if not exc.problems:
            raise
        problems = [ConfigProblem(p["path"], p["message"], p["line"]) for p in exc.problems]
        _print_problems(ConfigError(problems, source=str(path)), sys.stderr, sys.stderr)
        return 1
    what = "a new version" if result["changed"] else "unchanged: it equals the current version"
    print(f"gateway config version {result['version']} ({what})")
    return 0


def cmd_config_versions(args: argparse.Namespace) -> int:
    _, body = _admin_api(args).request("GET", f"/admin/config/versions?limit={args.limit}")
    for v in body["versions"]:
        mark = "*" if v["current"] else " "
        print(f"{mark} {v['version']:>5}  {v['created_at']}  {v['actor']:<20} {v['note']}")
    return 0


def cmd_config_rollback(args: argparse.Namespace) -> int:
    _, body = _admin_api(args).request("POST", f"/admin/config/rollback/{args.version}")
    print(f"gateway config version {body['version']} = version {body['rolled_back_to']}")
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    from gpugate.logs import configure_logging
    from gpugate.worker import WorkerSettings
    from gpugate.worker.server import serve_worker

    secret = os.environ.get(args.secret_env)
    if not secret:
        raise GpugateError(f"environment variable {args.secret_env} (--secret-env) is not set")
    host, port = _split_listen(args.listen)
    state_dir = args.state_dir or _state_home() / "gpugate" / f"worker-{args.runtime}"
    settings = WorkerSettings(
        runtime_id=args.runtime,
        secret=secret,
        gateway_url=_checked_url(args.gateway, "--gateway"),
        upstream_url=_checked_url(args.upstream, "--upstream"),
        state_dir=state_dir,
        concurrency=args.concurrency,
        idle_exit_s=args.idle_exit_s,
        auth=args.auth,
        tls_cert_file=args.tls_cert_file,
        tls_key_file=args.tls_key_file or args.tls_cert_file,
        tls_client_ca_file=args.tls_client_ca_file,
        gateway_ca_file=args.gateway_ca_file,
    )
    _check_worker_files(settings)
    configure_logging("text", args.log_level)  # once the arguments are known to be good
    result = _run(serve_worker(settings, host, port))
    assert isinstance(result, int)
    return result


def _check_worker_files(settings: WorkerSettings) -> None:
    """The worker's state directory and TLS files, usable before it listens: else one error
    line naming the flag, not a traceback from deep in the start."""
    from gpugate.worker.outbox import Outbox
    from gpugate.worker.server import worker_tls

    try:
        Outbox(settings.state_dir).open()
    except OSError as exc:
        where = f"the state directory {settings.state_dir} (--state-dir)"
        raise GpugateError(f"cannot use {where}: {exc.strerror or exc}") from exc
    try:
        worker_tls(settings)
    except OSError as exc:  # ssl.SSLError is one too
        flags = "--tls-cert-file, --tls-key-file, --tls-client-ca-file, --gateway-ca-file"
        raise GpugateError(f"cannot load the TLS files ({flags}): {exc.strerror or exc}") from exc


def _state_home() -> Path:
    """``$XDG_STATE_HOME``, else ``~/.local/state``."""
    home = os.environ.get("XDG_STATE_HOME")
    return Path(home) if home else Path.home() / ".local" / "state"


def _positive(value: str) -> float:
    number = float(value)
    if number <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return number


def _add_worker_command(sub: Any) -> None:
    """worker (the reference push worker)."""
    p = sub.add_parser(
        "worker",
        help="run the reference push worker (a home or local GPU machine)",
        description="Serve the push protocol at http://HOST:PORT/calls (the runtime's push.url), "
        "run each pushed job against a local OpenAI-compatible server (POST "
        "{upstream}/v1/{operation}), and report claimed, lease extensions and the result or "
        "the failure to the gateway's worker routes. Reports are retried with backoff while "
        "the gateway is down; a finished result is kept on disk (--state-dir) until the "
        "gateway has taken it, and sent again after a restart of the worker.",
    )
    p.add_argument("--listen", required=True, help="HOST:PORT to serve /calls on")
    p.add_argument("--gateway", required=True, help="the gateway's base URL, e.g. http://gw:8080")
    p.add_argument("--runtime", required=True, help="the runtime id this worker serves")
    p.add_argument(
        "--secret-env",
        required=True,
        help="the environment variable holding the runtime's secret (push.secret_env)",
    )
    p.add_argument(
        "--upstream", required=True, help="the local model server's base URL (OpenAI-compatible)"
    )
    p.add_argument(
        "--concurrency", type=int, default=1, help="calls run at once; more get 429 (default 1)"
    )
    p.add_argument(
        "--idle-exit-s",
        type=_positive,
        help="exit after this many seconds with nothing to run or send (default: never)",
    )
    p.add_argument(
        "--state-dir",
        type=Path,
        help="where finished results wait for the gateway "
        "(default $XDG_STATE_HOME/gpugate/worker-RUNTIME, else ~/.local/state/...)",
    )
    p.add_argument(
        "--auth",
        choices=["signed", "bearer"],
        default="signed",
        help="signed (default): HMAC-sign every message with keys derived from the secret, which "
        "never travels; bearer: for a gateway that only speaks the wave-1 protocol",
    )
    tls = (
        ("--tls-cert-file", "serve /calls over HTTPS with this chain (PEM); also the client cert"),
        ("--tls-key-file", "its private key (PEM), if not in --tls-cert-file"),
        ("--tls-client-ca-file", "require the gateway to present a certificate this CA signed"),
        ("--gateway-ca-file", "the CA that signed an https:// gateway's certificate"),
    )  # fmt: skip
    for flag, what in tls:
        p.add_argument(flag, type=Path, help=what)
    p.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING (default INFO)")
    p.set_defaults(func=cmd_worker)


def cmd_version(args: argparse.Namespace) -> int:
    print(f"gpugate {__version__}")
    return 0


def _workers(value: str) -> int:
    if value == "auto":
        from gpugate.workers import default_workers

        return default_workers()
    try:
        count = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of workers: {value!r}") from None
    if not 1 <= count <= MAX_WORKERS:
        raise argparse.ArgumentTypeError(f"--workers takes 1 to {MAX_WORKERS}, got {count}")
    return count


MAX_WORKERS = 256


def _split_listen(value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit():
        raise GpugateError(f"--listen must be HOST:PORT, got {value!r}")
    if int(port) > MAX_PORT:
        raise GpugateError(f"--listen: the port must be 0-{MAX_PORT}, got {value!r}")
    return host.strip("[]"), int(port)


MAX_PORT = 65535


def _add_process_commands(sub: Any) -> None:
    """serve, check-config, db, fleet, demo."""
    p = sub.add_parser(
        "serve",
        help="run the gateway (the production entry point)",
        epilog="environment: GPUGATE_FASTPATH=0 serves the OpenAI routes through ASGI as before "
        "the fast path (A/B benchmarks, or a suspected fast-path bug; docs/dataplane.md)",
    )
    p.add_argument("--config", required=True, type=Path, help="the YAML config file")
    p.add_argument("--listen", help="HOST:PORT, overrides `listen` in the file")
    p.add_argument("--log-format", choices=["text", "json"], help="overrides server.log_format")
    p.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING (default INFO)")
    p.add_argument(
        "--workers",
        type=_workers,
        metavar="N|auto",
        help="worker processes sharing the listen address (SO_REUSEPORT), each a whole gateway "
        "on the same store, restarted if one dies; /metrics merges them; `auto`: the cores this "
        "process may use (default 1: one process, no supervisor — with N, passive health, "
        "ejections and the console's view are each worker's own: docs/operations.md)",
    )
    p.add_argument(
        "--no-access-log",
        action="store_true",
        help="no line per request at INFO (overrides server.access_log)",
    )
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser(
        "check-config",
        help="validate a config file: every problem as `path.to.key: reason (line N)`",
        description="Validate a config file. Each problem is one line on stdout, "
        "`path.to.key: reason (line N)` (a problem of the file as a whole, such as unreadable "
        "or not YAML, names the file in the key's place), then the count, `FILE: N problems`, "
        "on stderr; exit 1. A valid file prints a summary and `FILE: valid`; exit 0. What "
        "`serve` needs of the machine it runs on (environment variables named by `*_env` keys "
        "set, the `tls` files readable) is a warning here, `warning: path.to.key: reason "
        "(line N) (needed at `serve`)` (an error with --strict-env). `serve` prints the same "
        "problem lines and count on stderr.",
    )
    p.add_argument("file", type=Path)
    p.add_argument(
        "--strict-env",
        action="store_true",
        help="what serve needs of this machine (unset *_env variables, unreadable tls files) "
        "is an error, not a warning",
    )
    p.set_defaults(func=cmd_check_config)

    p = sub.add_parser("db", help="store maintenance")
    db = p.add_subparsers(dest="db_command", required=True, metavar="DB_COMMAND")
    p = db.add_parser("upgrade", help="apply pending store migrations")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--store", help="sqlite:///path.db or postgresql://user@host/db")
    where.add_argument("--config", type=Path, help="take `store` from this config file")
    p.set_defaults(func=cmd_db_upgrade)

    _add_fleet_command(sub)

    from gpugate.demo_scenarios import SCENARIOS, describe

    p = sub.add_parser(
        "demo",
        help="gateway + simulated fleet in one command, embedded SQLite",
        description="Start a gateway in front of a simulated fleet (fake model servers and a fake "
        "dcgm-exporter), with a fresh SQLite store; it prints the console's URL and the admin "
        "token. --scenario plays a scripted incident you watch in the console, ending with the "
        "fleet healthy again.",
        epilog=describe(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--scenario",
        choices=list(SCENARIOS),
        metavar="NAME",
        help="play a scripted incident (listed below)",
    )
    p.add_argument(
        "--pace",
        type=float,
        default=5.0,
        metavar="S",
        help="with --scenario: hold each state S seconds so a person can watch it in the console "
        "(default 5; 30 makes a scenario last minutes); chat traffic runs while it plays",
    )
    p.add_argument("--listen", default="127.0.0.1:8080", help="HOST:PORT (default 127.0.0.1:8080)")
    p.add_argument("--workdir", default=".gpugate", help="state directory (default ./.gpugate)")
    p.add_argument("--log-level", default="INFO")
    p.set_defaults(func=cmd_demo)


def _add_fleet_command(sub: Any) -> None:
    """fleet; the help of its fixed ports names the members, read from the demo spec when
    ``--help`` asks (importing the fleet would cost every other command 0.2 s)."""
    p = sub.add_parser(
        "fleet",
        help="run the simulated fleet alone (fake model servers + exporter)",
        add_help=False,
    )
    one: argparse.Action  # --port and --ports, added below
    each: argparse.Action
    p.add_argument("-h", "--help", action=_HelpAfter, fill=lambda: _fill_fleet_help(one, each))
    p.add_argument("--gpus", type=int, default=2, help="GPUs on the fake exporter (default 2)")
    p.add_argument("--host-label", choices=["Hostname", "hostname"], default="Hostname")
    fixed = p.add_mutually_exclusive_group()
    one = fixed.add_argument("--port", type=int, metavar="P")
    each = fixed.add_argument("--ports", type=_port_list, metavar="P1,P2,...")
    p.set_defaults(func=cmd_fleet)


def _fill_fleet_help(port: argparse.Action, ports: argparse.Action) -> None:
    from gpugate.demo import fleet_members, fleet_spec

    members = fleet_members(fleet_spec())
    port.help = (
        f"{len(members)} consecutive fixed ports from P up (P to P+{len(members) - 1}), in "
        "the order of --ports (default: free ports, new on every run)"
    )
    ports.help = f"{len(members)} fixed ports, one per member in this order: {', '.join(members)}"


class _HelpAfter(argparse.Action):
    """``-h``/``--help`` that calls ``fill()`` first: for help text too costly to build on
    every run of the command line."""

    def __init__(
        self, option_strings: Sequence[str], dest: str, *, fill: Callable[[], None]
    ) -> None:
        super().__init__(
            option_strings,
            dest,
            nargs=0,
            default=argparse.SUPPRESS,
            help="show this help message and exit",
        )
        self._fill = fill

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        _namespace: argparse.Namespace,
        _values: object,
        _option_string: str | None = None,
    ) -> None:
        self._fill()
        parser.print_help()
        parser.exit()


def _port_list(text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of ports: {text!r}") from None


def _add_gpus_commands(sub: Any) -> None:
    """gpus inspect."""
    p = sub.add_parser("gpus", help="look at GPUs through dcgm-exporter")
    gpus = p.add_subparsers(dest="gpus_command", required=True, metavar="GPUS_COMMAND")
    p = gpus.add_parser(
        "inspect",
        help="judge one dcgm-exporter scrape: values, clock reasons, verdict and why",
        description="Read one dcgm-exporter scrape from a file or URL and show each GPU and MIG "
        "instance: util, temperature, last XID, decoded clock-event reasons, verdict "
        "(ok | faulted | unknown) and the reasons. Exit 1 when the scrape yields no GPU.",
    )
    p.add_argument("source", help="a file, or an http(s) URL of an exporter's /metrics")
    p.add_argument(
        "--json", action="store_true", help='one object: {"gpus": [...], "errors": [...]}'
    )
    p.add_argument(
        "--config",
        metavar="FILE",
        help="judge as the gateway with this config does: its gpu_health's max_temp_c and "
        "xid_overrides (default: the defaults)",
    )
    p.set_defaults(func=cmd_gpus_inspect)


def _gateway_parent() -> argparse.ArgumentParser:
    """``--gateway``, for the commands that are clients of a running gateway."""
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument(
        "--gateway",
        help=f"the gateway's base URL (default ${GATEWAY_URL_ENV} or {DEFAULT_GATEWAY}); a "
        "redirect to another origin is refused, so the token never goes elsewhere",
    )
    tls = (
        ("--ca-file", "GPUGATE_CA_FILE", "CA bundle that signed an https:// gateway's certificate"),
        ("--cert-file", "GPUGATE_CLIENT_CERT_FILE", "client certificate (mTLS gateways)"),
        ("--key-file", "GPUGATE_CLIENT_KEY_FILE", "the client certificate's key, if apart"),
    )
    for flag, env, what in tls:
        parent.add_argument(flag, default=os.environ.get(env), help=f"{what} (default ${env})")
    return parent


def _add_jobs_commands(sub: Any) -> None:
    """jobs submit|list|show|cancel (clients of a running gateway)."""
    p = sub.add_parser("jobs", help="submit and follow jobs on a running gateway")
    jobs = p.add_subparsers(dest="jobs_command", required=True, metavar="JOBS_COMMAND")
    gateway = _gateway_parent()
    p = jobs.add_parser("submit", parents=[gateway], help="create a job (idempotent with a key)")
    p.add_argument("--model", required=True)
    p.add_argument("--input", required=True, help="the request body as JSON, or @file.json")
    p.add_argument("--operation", default="chat/completions")
    p.add_argument("--class", dest="job_class", default="batch")
    p.add_argument("--runner", help="the runtime to start on (default: default_runtime)")
    p.add_argument("--slug", help="choose the job's slug")
    p.add_argument("--idempotency-key", help="the same key always returns the same job")
    p.add_argument("--no-external", action="store_true", help="the job may not leave the building")
    p.set_defaults(func=cmd_jobs_submit)
    p = jobs.add_parser("list", parents=[gateway], help="list jobs, newest first")
    p.add_argument("--state")
    p.add_argument("--runner")
    p.add_argument("--limit", type=int, default=50)
    p.set_defaults(func=cmd_jobs_list)
    p = jobs.add_parser("show", parents=[gateway], help="one job (and its events)")
    p.add_argument("slug")
    p.add_argument("--events", action="store_true", help="also print the job's event trail")
    p.set_defaults(func=cmd_jobs_show)
    p = jobs.add_parser("cancel", parents=[gateway], help="cancel a job")
    p.add_argument("slug")
    p.set_defaults(func=cmd_jobs_cancel)


def _key_body(args: argparse.Namespace) -> dict[str, Any]:
    """The fields of ``keys create|update`` that were given, as the admin API takes them."""
    body: dict[str, Any] = {}
    for name in ("name", "tenant", "max_class", "expires_at"):
        if getattr(args, name, None) is not None:
            body[name] = getattr(args, name)
    if body.get("expires_at") == "never":
        body["expires_at"] = None
    for name in ("models", "runners"):
        value = getattr(args, name, None)
        if value is not None:
            body[name] = None if value == "*" else [v for v in value.split(",") if v]
    if args.allow_external is not None:
        body["allow_external"] = args.allow_external
    limits = {name: getattr(args, name) for name in _LIMIT_FLAGS if getattr(args, name) is not None}
    if limits:
        body["limits"] = limits
    return body


_LIMIT_FLAGS = ("requests_per_min", "tokens_per_min", "concurrency", "daily_tokens", "daily_cents")


def _key_state(key: dict[str, Any]) -> str:
    """``revoked``, ``expired`` (its ``expires_at`` has passed: the gateway answers 401) or
    ``active``."""
    if key.get("revoked_at"):
        return "revoked"
    expires = key.get("expires_at")
    if expires and datetime.fromisoformat(expires) <= datetime.now(UTC):
        return "expired"
    return "active"


def _print_key(key: dict[str, Any]) -> None:
    state = _key_state(key)
    models = ",".join(key["models"]) if key["models"] is not None else "*"
    print(
        f"{key['id']:<22} {key['prefix']}…  {key['tenant']:<14} {key['name']:<16} "
        f"{key['max_class']:<11} models={models} {state}"
    )


def cmd_keys_create(args: argparse.Namespace) -> int:
    _, key = _admin_api(args).request("POST", "/admin/keys", _key_body(args))
    _print_json(key)
    print("the key is shown this once: store it now", file=sys.stderr)
    return 0


def cmd_keys_list(args: argparse.Namespace) -> int:
    path = "/admin/keys" + (f"?tenant={quote(args.tenant)}" if args.tenant else "")
    _, body = _admin_api(args).request("GET", path)
    if args.json:
        _print_json(body)
        return 0
    for key in body["data"]:
        _print_key(key)
    return 0


def cmd_keys_show(args: argparse.Namespace) -> int:
    _, key = _admin_api(args).request("GET", f"/admin/keys/{quote(args.id)}")
    _print_json(key)
    return 0


def cmd_keys_update(args: argparse.Namespace) -> int:
    _, key = _admin_api(args).request("PATCH", f"/admin/keys/{quote(args.id)}", _key_body(args))
    _print_json(key)
    return 0


def cmd_keys_rotate(args: argparse.Namespace) -> int:
    _, key = _admin_api(args).request("POST", f"/admin/keys/{quote(args.id)}/rotate")
    _print_json(key)
    print("the new key is shown this once; the old one stops working", file=sys.stderr)
    return 0


def cmd_keys_revoke(args: argparse.Namespace) -> int:
    _, key = _admin_api(args).request("DELETE", f"/admin/keys/{quote(args.id)}")
    print(f"key {key['id']} ({key['prefix']}…) revoked at {key['revoked_at']}")
    return 0


def _key_fields_parent(*, creating: bool) -> argparse.ArgumentParser:
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument("--name", required=creating, help="what the key is for")
    parent.add_argument("--tenant", required=creating, help="the team it belongs to")
    parent.add_argument("--models", help="comma-separated models it may use; * for every one")
    parent.add_argument(
        "--max-class",
        choices=["system", "interactive", "batch"],
        help="the highest X-Request-Class it may use; higher is clamped down (default interactive)",
    )
    parent.add_argument("--runners", help="comma-separated runtimes its jobs may name; * for all")
    parent.add_argument(
        "--allow-external",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="whether it may use external upstreams (default no)",
    )
    for flag in _LIMIT_FLAGS:
        kind = float if flag == "daily_cents" else int
        parent.add_argument(f"--{flag.replace('_', '-')}", type=kind, help="a limit (default none)")
    parent.add_argument(
        "--expires-at",
        help="RFC 3339 time it stops working, or never (the default)",
    )
    return parent


def _add_keys_commands(sub: Any) -> None:
    """keys create|list|show|update|rotate|revoke (client keys; the admin API)."""
    p = sub.add_parser("keys", help="client keys of a running gateway (auth.mode: keys)")
    keys = p.add_subparsers(dest="keys_command", required=True, metavar="KEYS_COMMAND")
    admin = _admin_parent()
    p = keys.add_parser(
        "create",
        parents=[admin, _key_fields_parent(creating=True)],
        help="a new key; its secret is printed this once",
    )
    p.set_defaults(func=cmd_keys_create)
    p = keys.add_parser("list", parents=[admin], help="every key: id, prefix, tenant, state")
    p.add_argument("--tenant", help="only this tenant's keys")
    p.add_argument("--json", action="store_true", help="the admin API's JSON as it is")
    p.set_defaults(func=cmd_keys_list)
    p = keys.add_parser("show", parents=[admin], help="one key (JSON; never its secret)")
    p.add_argument("id")
    p.set_defaults(func=cmd_keys_show)
    p = keys.add_parser(
        "update",
        parents=[admin, _key_fields_parent(creating=False)],
        help="change the fields given (limits given replace all limits); audited",
    )
    p.add_argument("id")
    p.set_defaults(func=cmd_keys_update)
    p = keys.add_parser("rotate", parents=[admin], help="a new secret for the key (printed once)")
    p.add_argument("id")
    p.set_defaults(func=cmd_keys_rotate)
    p = keys.add_parser("revoke", parents=[admin], help="stop the key (every replica within 2 s)")
    p.add_argument("id")
    p.set_defaults(func=cmd_keys_revoke)


def _admin_parent() -> argparse.ArgumentParser:
    """``--gateway`` plus the admin token and the audit log's actor."""
    parent = argparse.ArgumentParser(add_help=False, parents=[_gateway_parent()])
    parent.add_argument(
        "--token-env",
        default="GPUGATE_ADMIN_TOKEN",
        help="the environment variable holding the admin token (default GPUGATE_ADMIN_TOKEN)",
    )
    parent.add_argument(
        "--actor",
        default=os.environ.get("USER"),
        help="your name in the audit log (default $USER)",
    )
    return parent


def _add_runtimes_commands(sub: Any) -> None:
    """runtimes list|show|enable|disable|drain (the admin API of a running gateway)."""
    p = sub.add_parser("runtimes", help="see and steer the runtimes of a running gateway")
    runtimes = p.add_subparsers(dest="runtimes_command", required=True, metavar="RUNTIMES_COMMAND")
    admin = _admin_parent()
    p = runtimes.add_parser(
        "list", parents=[admin], help="every runtime: state, queue, in flight, last submit"
    )
    p.add_argument("--json", action="store_true", help="the admin API's JSON as it is")
    p.set_defaults(func=cmd_runtimes_list)
    p = runtimes.add_parser("show", parents=[admin], help="one runtime in detail (JSON)")
    p.add_argument("runtime")
    p.set_defaults(func=cmd_runtimes_show)
    verbs = {
        "enable": "let the runtime take new dispatch again",
        "disable": "take the runtime out of dispatch (persisted, every replica, audited)",
        "drain": "take no new dispatch; calls in flight are wound down (persisted, audited)",
    }
    for verb, what in verbs.items():
        p = runtimes.add_parser(verb, parents=[admin], help=what)
        p.add_argument("runtime")
        p.add_argument("--reason", help="why, for the audit log and the runtime's detail")
        p.set_defaults(func=cmd_runtimes_set)


def _add_config_commands(sub: Any) -> None:
    """config export|import|versions|rollback (the admin API of a running gateway)."""
    p = sub.add_parser("config", help="export, import and roll back a running gateway's config")
    config = p.add_subparsers(dest="config_command", required=True, metavar="CONFIG_COMMAND")
    admin = _admin_parent()
    p = config.add_parser(
        "export", parents=[admin], help="the current version, in the config file's schema"
    )
    p.add_argument("--format", choices=["yaml", "json"], default="yaml")
    p.add_argument("--output", "-o", help="write to this file instead of stdout")
    p.set_defaults(func=cmd_config_export)
    p = config.add_parser(
        "import",
        parents=[admin],
        help="replace the gateway config with a whole document (validated first)",
        description="Replace the gateway config (upstreams, runtimes, chain, stop conditions) "
        "with the document in FILE. Every problem is reported and nothing changes if any; "
        "otherwise it becomes a new version, in effect at once on every replica.",
    )
    p.add_argument("file", help="a YAML or JSON document (as `config export` writes)")
    p.add_argument("--format", choices=["yaml", "json"], help="default: by the file's suffix")
    p.set_defaults(func=cmd_config_import)
    p = config.add_parser("versions", parents=[admin], help="stored versions, newest first")
    p.add_argument("--limit", type=int, default=20)
    p.set_defaults(func=cmd_config_versions)
    p = config.add_parser(
        "rollback", parents=[admin], help="make an earlier version current again (a new version)"
    )
    p.add_argument("version", type=int)
    p.set_defaults(func=cmd_config_rollback)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpugate", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"gpugate {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    _add_process_commands(sub)
    _add_gpus_commands(sub)
    _add_jobs_commands(sub)
    _add_runtimes_commands(sub)
    _add_config_commands(sub)
    _add_keys_commands(sub)
    _add_worker_command(sub)
    p = sub.add_parser("version", help="print the version")
    p.set_defaults(func=cmd_version)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        result = args.func(args)
        sys.stdout.flush()  # here, so that a reader gone away is the except below
    except BrokenPipeError:  # `gpugate keys list | head`: stop quietly, as other Unix tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no error at exit
        return 128 + signal.SIGPIPE
    except ConfigError as exc:
        _print_problems(
            exc, sys.stdout if args.func is cmd_check_config else sys.stderr, sys.stderr
        )
        return 1
    except GpugateError as exc:
        print(f"gpugate: error: {_no_token_hint(args, exc)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    assert isinstance(result, int)
    return result


if __name__ == "__main__":
    raise SystemExit(main())
