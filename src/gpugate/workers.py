"""``gpugate serve --workers N``: a supervisor and N worker processes on one listen address.

The supervisor binds the address once (a taken port is one clear error, and port 0 becomes a
port every worker shares), then forks N workers after every import, so they share its pages
until they write them. Each worker is a whole gateway (its own event loop, store connection,
loops and registry; docs/decisions.md §21 says what stays per process) and binds the address
again with ``SO_REUSEPORT``: the kernel spreads new connections among the workers' sockets. A
worker's socket listens only once its gateway is built, so a restarting worker takes no
connection before it can serve it.

- The first worker starts alone, the others once it serves: it applies the store's migrations
  and seeds the config version, which N processes racing on a new SQLite file would fail
  ("database is locked" while switching it to WAL), and on SQLite it alone takes back the
  leases a previous run left (every later worker, restarts included, starts beside live
  siblings and leaves their leases alone: only lapsed ones are reaped, as between replicas).
- A worker that dies is restarted (its index, so its private metrics socket stays the same)
  after a backoff that doubles from 0.5 s to 30 s while it keeps dying within 30 s of its start;
  each restart is logged and counted (``gateway_worker_restarts_total``). A worker that dies
  before the *first* start of all of them completed stops the whole command (a config the store
  refuses, say, fails once instead of looping).
- SIGTERM or SIGINT is forwarded to every worker, which drains as a single process does
  (:class:`gpugate.server.DrainingServer`: ``/readyz`` 503, serving ``drain_delay_s``, then the
  grace); the supervisor exits once all have, 0 when every worker shut down clean. A second
  signal is forwarded too (each worker then stops at once).
- Workers are in a process group of their own (a terminal's Ctrl-C reaches the supervisor only,
  which forwards it once) and are killed (SIGKILL) by the kernel when the supervisor dies
  (``PR_SET_PDEATHSIG``): ``kill -9`` of the gateway kills all of it, as a container's end
  would, and none outlives it. The supervisor's own failure (a bug) drains them first.

``/metrics`` is one view: every worker answers a snapshot of its registry on a private unix
socket and the worker that gets the scrape merges the others' (:mod:`gpugate.web.listeners`).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import select
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

from gpugate.config import GatewayConfig
from gpugate.errors import ConfigError, GpugateError
from gpugate.listen import bind
from gpugate.server import serve_gateway
from gpugate.web.listeners import Peers

log = logging.getLogger("gpugate.workers")

BACKOFF_FIRST_S = 0.5
BACKOFF_MAX_S = 30.0
STABLE_AFTER_S = 30.0
"""A worker that lived this long before it died is restarted after the first backoff again."""

_PR_SET_PDEATHSIG = 1
_HANDLED = (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD)


def default_workers() -> int:
    """The cores this process may run on (its affinity mask, not the machine's count)."""
    return len(os.sched_getaffinity(0))


WorkerMain = Callable[[GatewayConfig, socket.socket, socket.socket | None, Peers, int], int]
"""A worker's life: (config, its socket, its admin socket, its peers, the fd of its "ready"
byte) to its exit code."""


@dataclass
class _Worker:
    index: int
    pid: int = 0
    ready_fd: int = -1
    started_at: float = 0.0
    ready: bool = False
    backoff_s: float = BACKOFF_FIRST_S
    restart_at: float | None = None


@dataclass
class Supervisor:
    """Runs ``workers`` copies of the gateway on ``host:port`` (and ``admin``) until a signal."""

    config: GatewayConfig
    workers: int
    host: str
    port: int
    admin: tuple[str, int] | None = None
    run_worker: WorkerMain | None = None  # default: :func:`run_worker`
    announce: str = ""  # printed once the signals are handled
    _children: dict[int, _Worker] = field(default_factory=dict)
    _stopping: int = 0  # signals received
    _restarts: int = 0
    _all_ready: bool = False
    _failed: bool = False

    def __post_init__(self) -> None:
        _remove_stale_dirs()
        self._dir = Path(tempfile.mkdtemp(prefix=f"{_DIR_PREFIX}{os.getpid()}-"))  # mode 0700
        self._peers = tuple(str(self._dir / f"worker-{i}.sock") for i in range(self.workers))
        self._restarts_path = str(self._dir / "restarts")

    def peers(self, index: int, *, takes_over: bool = False) -> Peers:
        return Peers(index, self._peers, self._restarts_path, takes_over)

    def run(self) -> int:
        """Fork the workers, keep them running until a signal, then wait for every one: the
        exit code (0: every worker shut down clean)."""
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        os.set_blocking(wake_r, False)
        previous = signal.set_wakeup_fd(wake_w)
        handlers = {sig: signal.signal(sig, self._on_signal) for sig in _HANDLED}
        clean = True
        try:
            if self.announce:  # once a signal can no longer kill the supervisor unheard
                print(self.announce, flush=True)  # noqa: T201 - the command's one stdout line
            if not self._stopping:  # a signal before this: nothing to start
                self._start(_Worker(0))  # the others once it is serving (see _note_ready)
            clean = self._loop(wake_r)
        except BaseException:  # a bug of ours: the workers drain before we go (and kill them)
            self._signal_all(signal.SIGTERM)
            for pid in list(self._children):
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, 0)
            raise
        finally:
            signal.set_wakeup_fd(previous)
            for sig, handler in handlers.items():
                signal.signal(sig, handler)
            for fd in (wake_r, wake_w):
                os.close(fd)
            shutil.rmtree(self._dir, ignore_errors=True)
        return 0 if clean and not self._failed else 1

    def _on_signal(self, sig: int, frame: FrameType | None) -> None:
        del frame
        if sig == signal.SIGCHLD:
            return  # the wake-up fd already woke the loop
        self._stopping += 1
        if self._stopping == 1:
            log.info("%s: draining the workers", signal.Signals(sig).name)
        self._signal_all(sig)

    def _signal_all(self, sig: int) -> None:
        for worker in self._children.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker.pid, sig)

    def _loop(self, wake_r: int) -> bool:
        """Until every worker has exited after a signal (or a failed first start): wait for a
        signal, a worker's "ready" byte or the next restart that is due."""
        clean = True
        pending: dict[int, _Worker] = {}  # by index: a dead worker waiting for its restart
        while self._children or (pending and not self._stopping):
            due = [w.restart_at for w in pending.values() if w.restart_at is not None]
            timeout = max(0.0, min(due) - time.monotonic()) if due else None
            fds = [wake_r, *(w.ready_fd for w in self._children.values() if w.ready_fd >= 0)]
            readable, _, _ = select.select(fds, [], [], timeout)
            if wake_r in readable:
                with contextlib.suppress(BlockingIOError):
                    os.read(wake_r, 512)
            self._note_ready(readable)
            for worker, status in self._reap():
                code = os.waitstatus_to_exitcode(status)
                if self._stopping:  # stopped by the signal before it served: nothing lost
                    stopped = not worker.ready and -code in (signal.SIGTERM, signal.SIGINT)
                    clean = clean and (code == 0 or stopped)
                elif not self._all_ready:
                    self._first_start_failed(worker, code)
                else:
                    pending[worker.index] = self._schedule(worker, code)
            if self._stopping:
                pending.clear()
            for index, worker in list(pending.items()):
                if worker.restart_at is not None and worker.restart_at <= time.monotonic():
                    del pending[index]
                    self._start(worker)
        return clean

    def _note_ready(self, readable: list[int]) -> None:
        for worker in self._children.values():
            if worker.ready_fd in readable:
                self._read_ready(worker)
        if not self._all_ready:
            started = [w for w in self._children.values() if w.ready]
            if started and len(self._children) == 1 and not self._stopping:
                for index in range(1, self.workers):
                    self._start(_Worker(index))
            self._all_ready = len(started) == self.workers
            if self._all_ready:
                log.info("all %d workers are serving", self.workers)

    def _first_start_failed(self, worker: _Worker, code: int) -> None:
        log.error(
            "worker %d exited (%s) before every worker had started: stopping the others",
            worker.index,
            _how(code),
        )
        self._failed = True
        self._stopping = 1
        self._signal_all(signal.SIGTERM)

    def _read_ready(self, worker: _Worker) -> None:
        try:
            data = os.read(worker.ready_fd, 16)
        except BlockingIOError:
            return
        if data:
            worker.ready = True
        os.close(worker.ready_fd)  # one byte, or EOF: either way, done with it
        worker.ready_fd = -1

    def _reap(self) -> list[tuple[_Worker, int]]:
        dead = []
        while self._children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            worker = self._children.pop(pid, None)
            if worker is None:
                continue
            if worker.ready_fd >= 0:
                self._read_ready(worker)  # it may have started before it died
            dead.append((worker, status))
        return dead

    def _schedule(self, worker: _Worker, code: int) -> _Worker:
        lived = time.monotonic() - worker.started_at
        if lived >= STABLE_AFTER_S:
            worker.backoff_s = BACKOFF_FIRST_S
        self._restarts += 1
        Path(self._restarts_path).write_text(str(self._restarts), encoding="ascii")
        log.warning(
            "worker %d (pid %d) exited (%s) after %.1f s; restarting it in %.1f s (restart %d)",
            worker.index,
            worker.pid,
            _how(code),
            lived,
            worker.backoff_s,
            self._restarts,
        )
        worker.restart_at = time.monotonic() + worker.backoff_s
        worker.backoff_s = min(BACKOFF_MAX_S, worker.backoff_s * 2)
        return worker

    def _start(self, worker: _Worker) -> None:
        ready_r, ready_w = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        # No handler of the supervisor's may run in the child: block the signals across the
        # fork; the child unblocks them once its own dispositions are in place.
        signal.pthread_sigmask(signal.SIG_BLOCK, _HANDLED)
        pid = os.fork()
        if pid == 0:  # the worker
            code = 1
            try:
                signal.set_wakeup_fd(-1)
                for sig in _HANDLED:
                    signal.signal(sig, signal.SIG_DFL)
                signal.pthread_sigmask(signal.SIG_UNBLOCK, _HANDLED)
                os.close(ready_r)
                code = self._in_worker(worker.index, ready_w)
            finally:
                logging.shutdown()
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _HANDLED)
        os.close(ready_w)
        os.set_blocking(ready_r, False)
        worker.pid, worker.ready_fd, worker.ready = pid, ready_r, False
        worker.started_at, worker.restart_at = time.monotonic(), None
        self._children[pid] = worker
        if self._stopping:  # the signal came during the fork, before it was in _children
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)

    def _in_worker(self, index: int, ready_w: int) -> int:
        os.setpgid(0, 0)
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() == 1:  # the supervisor died before the line above
            return 1
        sock = bind(self.host, self.port, reuse_port=True, listen=False)
        admin_sock = bind(*self.admin, reuse_port=True, listen=False) if self.admin else None
        main = self.run_worker or run_worker
        first = index == 0 and not self._all_ready and not self._restarts
        peers = self.peers(index, takes_over=first)
        return main(self.config, sock, admin_sock, peers, ready_w)


_DIR_PREFIX = "gpugate-workers-"


def _remove_stale_dirs() -> None:
    """The private directories of supervisors that were killed (``kill -9`` leaves them): each
    is named after its supervisor's pid, removed once no such process exists."""
    for path in Path(tempfile.gettempdir()).glob(f"{_DIR_PREFIX}*-*"):
        pid = path.name.removeprefix(_DIR_PREFIX).split("-", 1)[0]
        if pid.isdigit() and path.owner() == _user() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(path, ignore_errors=True)


def _user() -> str:
    import pwd

    return pwd.getpwuid(os.getuid()).pw_name


def reserve(host: str, port: int) -> socket.socket:
    """The supervisor's hold on ``host:port``: bound with ``SO_REUSEPORT`` and not listening
    (it takes no connection), so the port stays the workers' while one restarts; a taken port
    is the :class:`~gpugate.errors.ListenError` of :func:`gpugate.listen.bind`."""
    return bind(host, port, reuse_port=True, listen=False)


def port_of(sock: socket.socket) -> int:
    """The local port ``sock`` is bound to."""
    return int(sock.getsockname()[1])


def run_worker(
    config: GatewayConfig,
    sock: socket.socket,
    admin_sock: socket.socket | None,
    peers: Peers,
    ready_w: int,
) -> int:
    """One worker's whole life: the gateway served until a signal; its exit code."""
    import uvloop

    async def started() -> None:
        with contextlib.suppress(OSError):
            os.write(ready_w, b"r")
        os.close(ready_w)

    try:
        clean = uvloop.run(
            serve_gateway(config, sock, admin_sock=admin_sock, on_started=started, peers=peers)
        )
    except ConfigError as exc:
        sys.stderr.write(f"gpugate: error: {exc}\n")
        return 1
    except GpugateError as exc:
        sys.stderr.write(f"gpugate: error: {exc.message}\n")
        return 1
    except KeyboardInterrupt:
        return 130
    return 0 if clean else 1


def _how(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"
