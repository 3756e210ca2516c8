"""A fake OpenAI-compatible model server (vLLM-like), steerable at runtime.

Routes: ``POST /v1/chat/completions``, ``POST /v1/completions``, ``POST /v1/embeddings``,
``GET /v1/models``, ``GET /health``, ``GET /metrics`` (vLLM's gauges); and for tests
``GET|POST /_control``, ``POST /_control/reset``, ``GET /_stats``, ``GET|POST|DELETE
/_control/faults`` (fault rules, :mod:`gpugate.fleet.faults`), ``GET /_control/log`` (the
requests it saw) and ``POST /_control/down`` (stop listening for a while).
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, Self

from aiohttp import web

from gpugate.fleet import engine, faults, replies
from gpugate.fleet.behaviour import ServerBehaviour
from gpugate.fleet.control import ControlError, number
from gpugate.fleet.engine import Engine, EngineSpec
from gpugate.fleet.faults import Fault, FaultBook, RequestLog
from gpugate.fleet.replies import Completion, InvalidRequestError
from gpugate.fleet.server_stats import ServerStats
from gpugate.fleet.site import LocalSite, abort

if TYPE_CHECKING:
    import socket

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
EMBEDDINGS = "/v1/embeddings"
MODELS = "/v1/models"
HEALTH = "/health"
METRICS = "/metrics"
ROUTES = (CHAT, COMPLETIONS, EMBEDDINGS, MODELS, HEALTH, METRICS)

_JSON = "application/json"
_MAX_BODY = 64 * 1024 * 1024
_SSE_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}
_KEY_HEADERS = ("Idempotency-Key", "X-Gpugate-Job")


class _RefusalError(Exception):
    """A model request answered with an OpenAI-shaped error instead of a completion."""

    def __init__(self, status: int, message: str, kind: str, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.body = replies.error_body(message, kind, code)


Build = Callable[[dict[str, Any], str, ServerBehaviour], Completion | bytes]


class ModelServer:
    """A fake model server named `name` serving `models`.

    Use it as an async context manager (``async with ModelServer(["m"], name="a") as s``), or
    `start`/`stop` it; `make_app()` gives a fresh aiohttp application for other runners (give
    them ``handler_cancellation=True`` so a held request notices its client leaving).
    `update(**fields)` and `reset()` are the in-process form of the control API.
    """

    def __init__(
        self,
        models: Sequence[str],
        *,
        name: str,
        behaviour: ServerBehaviour | None = None,
        embedding_dim: int = 8,
        engine: EngineSpec | None = None,
        faults: Sequence[Fault] = (),
    ) -> None:
        if not models:
            raise ValueError("a model server serves at least one model")
        self.name = name
        self.models = tuple(models)
        self._served = frozenset(self.models)
        self.embedding_dim = embedding_dim
        self._initial = behaviour or ServerBehaviour()
        self._behaviour = self._initial
        self._stats = ServerStats(ROUTES, self.models)
        self._initial_faults = tuple(faults)
        self._faults = FaultBook(self._initial_faults)
        self._log = RequestLog()
        self._down: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._unhung = asyncio.Event()
        self._unhung.set()
        self._ids = itertools.count(1)
        self._site = LocalSite(self.make_app)
        self._models_body = replies.models_body(self.models, int(time.time()), "gpugate-fleet")
        self._headers = {"X-Fleet-Server": name}
        #: With an `EngineSpec`, chat and completions are timed by a simulated engine with a
        #: prefix cache (`gpugate.fleet.engine`), and /metrics is the engine's.
        self.engine = Engine(engine) if engine is not None else None
        self._apply(self._initial)

    def __repr__(self) -> str:
        where = self._site.url if self._site.running else "stopped"
        stats = self._stats
        return (
            f"<ModelServer {self.name} {where} models={list(self.models)}"
            f" open={stats.open_requests} requests={sum(stats.requests.values())}>"
        )

    # -- in-process control ---------------------------------------------------------------

    @property
    def behaviour(self) -> ServerBehaviour:
        return self._behaviour

    @property
    def stats(self) -> ServerStats:
        return self._stats

    @property
    def log(self) -> RequestLog:
        """The model requests this server saw (``GET /_control/log``)."""
        return self._log

    @property
    def faults(self) -> FaultBook:
        return self._faults

    def inject(self, kind: str, **fields: Any) -> int:
        """Arm a fault rule (validated like ``POST /_control/faults``); returns its id."""
        return self._faults.arm(Fault.from_json({"kind": kind, **fields}))

    def arm(self, fault: Fault) -> int:
        """Arm a fault rule built in process; returns its id."""
        return self._faults.arm(fault)

    def clear_faults(self) -> None:
        """Disarm every fault rule, those it was built with too."""
        self._faults.clear()

    async def down_for(self, seconds: float) -> None:
        """Go down now — stop listening (connections refused, open streams cut) — and listen
        again on the same port after `seconds`: a server that crashed and came back. Returns
        once it is down."""
        self._cancel_down()
        stopped = asyncio.Event()
        self._down = asyncio.create_task(self._outage(seconds, stopped), name=f"{self.name}-down")
        await stopped.wait()

    @property
    def up(self) -> bool:
        """Whether it listens now (False while `down_for` runs, or stopped)."""
        return self._site.running

    async def _outage(self, seconds: float, stopped: asyncio.Event) -> None:
        try:
            await self._site.stop()
        finally:
            stopped.set()
        await asyncio.sleep(seconds)
        await self._site.start(None)
        self._down = None

    def _cancel_down(self) -> None:
        if self._down is not None:
            self._down.cancel()
            self._down = None

    def update(self, **fields: Any) -> ServerBehaviour:
        """Change some behaviour fields (validated like ``POST /_control``)."""
        return self._apply(self._behaviour.patched(fields))

    def reset(self) -> None:
        """Back to the behaviour and faults it was built with, counters and log zeroed, the
        engine's cache emptied (``POST /_control/reset``)."""
        self._apply(self._initial)
        self._stats = ServerStats(ROUTES, self.models)
        self._faults = FaultBook(self._initial_faults)
        self._log = RequestLog()
        if self.engine is not None:  # an empty cache and queue, the spec kept
            self.engine = Engine(self.engine.spec)

    def _apply(self, behaviour: ServerBehaviour) -> ServerBehaviour:
        self._behaviour = behaviour
        if behaviour.hang:
            self._unhung.clear()
        else:
            self._unhung.set()
        return behaviour

    # -- running ----------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """Its base URL; while `down_for` holds it down, the URL it listens on again."""
        return self._site.last_url if self._down is not None else self._site.url

    async def start(self, host: str = "127.0.0.1", port: int | socket.socket | None = None) -> str:
        return await self._site.start(host, port)

    async def stop(self) -> None:
        self._cancel_down()
        await self._site.stop()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    def make_app(self) -> web.Application:
        app = web.Application(client_max_size=_MAX_BODY)
        app.router.add_post(CHAT, self._chat)
        app.router.add_post(COMPLETIONS, self._completions)
        app.router.add_post(EMBEDDINGS, self._embeddings)
        app.router.add_get(MODELS, self._models)
        app.router.add_get(HEALTH, self._health)
        app.router.add_get(METRICS, self._metrics)
        app.router.add_get("/_control", self._get_control)
        app.router.add_post("/_control", self._post_control)
        app.router.add_post("/_control/reset", self._post_reset)
        app.router.add_get("/_stats", self._get_stats)
        app.router.add_post("/_control/engine", self._post_engine)
        app.router.add_get("/_control/faults", self._get_faults)
        app.router.add_post("/_control/faults", self._post_faults)
        app.router.add_delete("/_control/faults", self._delete_faults)
        app.router.add_get("/_control/log", self._get_log)
        app.router.add_post("/_control/down", self._post_down)
        return app

    # -- model routes -----------------------------------------------------------------------

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, CHAT, self._build_chat)

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, COMPLETIONS, self._build_text)

    async def _embeddings(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, EMBEDDINGS, self._build_embeddings)

    def _build_chat(self, body: dict[str, Any], model: str, b: ServerBehaviour) -> Completion:
        prompt, used = replies.chat_prompt(body)
        prefill = faults.prefill_of(body)
        if b.answer_tokens is not None:
            full = replies.token_pieces(model, prompt, b.answer_tokens)
            pieces = replies.continued(full, prefill)
        elif prefill is None:
            pieces = replies.cut(replies.answer_text(self.name, prompt), b.chunks)
        else:  # go on after the prefill where it is the start of the answer, else answer whole
            text = replies.answer_text(self.name, prompt).removeprefix(prefill)
            pieces = replies.cut(text, min(b.chunks, len(text))) if text else ()
        ident = f"chatcmpl-{self.name}-{next(self._ids)}"
        return Completion("chat", ident, int(time.time()), model, (pieces,), used)

    def _build_text(self, body: dict[str, Any], model: str, b: ServerBehaviour) -> Completion:
        prompts = replies.completion_prompts(body)
        pieces = tuple(replies.cut(replies.answer_text(self.name, p), b.chunks) for p in prompts)
        used = sum(replies.tokens(prompt) for prompt in prompts)
        ident = f"cmpl-{self.name}-{next(self._ids)}"
        return Completion("text", ident, int(time.time()), model, pieces, used)

    def _build_embeddings(self, body: dict[str, Any], model: str, _: ServerBehaviour) -> bytes:
        inputs = replies.embedding_inputs(body)
        as_base64 = body.get("encoding_format") == "base64"
        return replies.embeddings_body(model, inputs, self.embedding_dim, as_base64=as_base64)

    async def _serve(self, request: web.Request, route: str, build: Build) -> web.StreamResponse:
        stats = self._stats
        stats.requests[route] += 1
        key = next(filter(None, map(request.headers.get, _KEY_HEADERS)), None)
        if key is not None:
            stats.arrived(key)
        try:
            body = await self._body(request)
            model = body["model"]
            answer = build(body, model, self._behaviour)
        except _RefusalError as refusal:
            return self._refuse(refusal)
        except InvalidRequestError as exc:
            return self._refuse(_RefusalError(400, str(exc), "invalid_request_error"))
        stream = body.get("stream") is True and isinstance(answer, Completion)
        seen = self._log.record(route, body, replies.prompt_of(body), key)
        fault = self._faults.take(model, stream=stream, prefill=seen["prefill"] is not None)
        seen["fault"] = None if fault is None else fault.kind
        stats.opened(model, stream=stream)
        try:
            return await self._perform(
                request, answer, stream=stream, body=body, seen=seen, fault=fault
            )
        except asyncio.CancelledError:
            stats.disconnects += 1
            raise
        finally:
            stats.closed(model, stream=stream)

    async def _body(self, request: web.Request) -> dict[str, Any]:
        try:
            body = json.loads(await request.read())
        except (ValueError, UnicodeDecodeError) as exc:
            raise _RefusalError(
                400, f"the body is not valid JSON: {exc}", "invalid_request_error"
            ) from exc
        if not isinstance(body, dict):
            raise _RefusalError(400, "the body must be a JSON object", "invalid_request_error")
        model = body.get("model")
        if not isinstance(model, str):
            raise _RefusalError(400, "model: expected a string", "invalid_request_error")
        if model not in self._served:
            message = f"The model `{model}` does not exist."
            raise _RefusalError(404, message, "invalid_request_error", "model_not_found")
        return body

    def _refuse(self, refusal: _RefusalError) -> web.Response:
        return web.Response(
            status=refusal.status, body=refusal.body, content_type=_JSON, headers=self._headers
        )

    async def _perform(
        self,
        request: web.Request,
        answer: Completion | bytes,
        *,
        stream: bool,
        body: dict[str, Any],
        seen: dict[str, Any],
        fault: Fault | None,
    ) -> web.StreamResponse:
        behaviour = self._behaviour
        if behaviour.hang:
            await self._held(self._unhung.wait())
            behaviour = self._behaviour
        if behaviour.delay_s > 0:
            await asyncio.sleep(behaviour.delay_s)
        if behaviour.fail_status is not None:
            message = f"{self.name}: injected failure (fail_status={behaviour.fail_status})"
            seen["status"] = behaviour.fail_status
            return self._refuse(
                _RefusalError(behaviour.fail_status, message, "server_error", "injected")
            )
        if fault is not None:
            early = await self._before_answer(request, fault, answer, stream=stream, seen=seen)
            if early is not None:
                return early
        if behaviour.drop_connection:
            return self._reset(request, web.StreamResponse())
        key = seen["key"]
        if self.engine is not None and isinstance(answer, Completion):
            return await engine.serve(self.engine, request, answer, body, self._headers, stream)
        if stream and isinstance(answer, Completion):
            options = body.get("stream_options")
            include_usage = isinstance(options, dict) and options.get("include_usage") is True
            events = answer.stream(include_usage=include_usage)
            seen["status"] = 200
            return await self._stream(request, events, behaviour, key, fault)
        if key is not None:
            self._stats.executed(key)
        payload = answer if isinstance(answer, bytes) else answer.body()
        if fault is not None and fault.kind == "malformed":
            payload = payload[: len(payload) // 2]
        seen["status"] = 200
        return web.Response(body=payload, content_type=_JSON, headers=self._headers)

    async def _before_answer(
        self,
        request: web.Request,
        fault: Fault,
        answer: Completion | bytes,
        *,
        stream: bool,
        seen: dict[str, Any],
    ) -> web.StreamResponse | None:
        """What `fault` does before an answer starts: a response instead of it, or None."""
        prompt_tokens = answer.prompt_tokens if isinstance(answer, Completion) else 0
        refusal = faults.refusal(fault, server=self.name, prompt_tokens=prompt_tokens)
        if refusal is not None:
            seen["status"] = refusal.status
            return web.Response(
                status=refusal.status,
                body=refusal.body,
                content_type=_JSON,
                headers={**self._headers, **refusal.headers},
            )
        if fault.kind == "reset" or (fault.kind == "cut" and not stream):
            return self._reset(request, web.StreamResponse())
        if fault.kind == "silent":
            await self._held(asyncio.Event().wait())
        if fault.kind in ("slow_first_token", "stall") and not stream:
            await asyncio.sleep(fault.seconds)
        return None

    async def _held(self, waiting: Awaitable[object]) -> None:
        self._stats.held += 1
        try:
            await waiting
        finally:
            self._stats.held -= 1

    async def _stream(
        self,
        request: web.Request,
        events: replies.Stream,
        behaviour: ServerBehaviour,
        key: str | None,
        fault: Fault | None,
    ) -> web.StreamResponse:
        response = web.StreamResponse(headers={**_SSE_HEADERS, **self._headers})
        await response.prepare(request)
        reset_after = behaviour.reset_after_chunks
        act = None if fault is None or fault.kind not in faults.STREAM_KINDS else fault
        try:
            if act is not None and act.kind == "slow_first_token":
                await self._pause(act.seconds)
            for event in events.head:
                await response.write(event)
            for sent, event in enumerate((*events.steps, b"")):
                if sent == reset_after:
                    return self._reset(request, response)
                if (
                    act is not None
                    and sent == act.after
                    and await self._midway(request, response, act)
                ):
                    return response
                await self._pause(behaviour.chunk_delay_s)
                if event:
                    await response.write(event)
            if key is not None:  # the last token is out: the generation ran to its end
                self._stats.executed(key)
            tail = events.tail
            if act is not None and act.kind == "no_done":
                tail = tail[:-1]
            for event in tail:
                await response.write(event)
            await response.write_eof()
        except ConnectionResetError:
            self._stats.disconnects += 1
        return response

    async def _midway(self, request: web.Request, response: web.StreamResponse, act: Fault) -> bool:
        """Do what `act` does at its point of a stream; True when that ended the stream."""
        if act.kind == "cut":
            self._reset(request, response)
            return True
        if act.kind == "no_done":  # a clean end, mid-answer
            await response.write_eof()
            return True
        if act.kind == "stall":
            await self._pause(act.seconds)
        elif act.kind == "malformed":
            await response.write(faults.MALFORMED_EVENT)
        return False

    def _reset(self, request: web.Request, response: web.StreamResponse) -> web.StreamResponse:
        self._stats.resets += 1
        abort(request)
        return response

    @staticmethod
    async def _pause(seconds: float) -> None:
        if seconds > 0:
            await asyncio.sleep(seconds)

    # -- other routes -----------------------------------------------------------------------

    async def _models(self, _: web.Request) -> web.Response:
        self._stats.requests[MODELS] += 1
        return web.Response(body=self._models_body, content_type=_JSON, headers=self._headers)

    async def _health(self, _: web.Request) -> web.Response:
        self._stats.requests[HEALTH] += 1
        return web.Response(status=self._behaviour.health_status, headers=self._headers)

    async def _metrics(self, _: web.Request) -> web.Response:
        self._stats.requests[METRICS] += 1
        text = (
            self.engine.exposition(self.models)
            if self.engine is not None
            else self._stats.exposition(self._behaviour.max_running)
        )
        return web.Response(
            text=text, content_type="text/plain", charset="utf-8", headers=self._headers
        )

    async def _get_control(self, _: web.Request) -> web.Response:
        return web.json_response(self._behaviour.as_json())

    async def _post_control(self, request: web.Request) -> web.Response:
        try:
            patch = json.loads(await request.read() or b"{}")
            behaviour = self._apply(self._behaviour.patched(patch))
        except (ValueError, ControlError) as exc:
            return web.json_response({"error": str(exc)}, status=400)
        return web.json_response(behaviour.as_json())

    async def _post_engine(self, request: web.Request) -> web.Response:
        if self.engine is None:
            return web.json_response({"error": "this server runs no engine"}, status=404)
        try:
            spec = self.engine.update(json.loads(await request.read() or b"{}"))
        except (ValueError, ControlError) as exc:
            return web.json_response({"error": str(exc)}, status=400)
        return web.json_response(dataclasses.asdict(spec))

    async def _post_reset(self, _: web.Request) -> web.Response:
        self.reset()
        return web.json_response(self._behaviour.as_json())

    async def _get_stats(self, _: web.Request) -> web.Response:
        return web.json_response(self._stats.as_json())

    async def _get_faults(self, _: web.Request) -> web.Response:
        return web.json_response({"faults": self._faults.as_json()})

    async def _post_faults(self, request: web.Request) -> web.Response:
        try:
            rules = faults.parse_rules(json.loads(await request.read() or b"null"))
            ids = [self._faults.arm(rule) for rule in rules]
        except (ValueError, ControlError) as exc:
            return web.json_response({"error": str(exc)}, status=400)
        return web.json_response({"armed": ids, "faults": self._faults.as_json()})

    async def _delete_faults(self, _: web.Request) -> web.Response:
        self.clear_faults()
        return web.json_response({"faults": []})

    async def _get_log(self, request: web.Request) -> web.Response:
        since = request.query.get("since", "0")
        if not since.isdigit() or len(since) > 18:
            return web.json_response({"error": "since: expected a sequence number"}, status=400)
        return web.json_response({"requests": self._log.entries(since=int(since))})

    async def _post_down(self, request: web.Request) -> web.Response:
        try:
            body = json.loads(await request.read() or b"null")
            seconds = _down_seconds(body)
        except (ValueError, ControlError) as exc:
            return web.json_response({"error": str(exc)}, status=400)
        # runs once this answer is out: the site lets running handlers finish before it closes
        task = asyncio.get_running_loop().create_task(self.down_for(seconds))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return web.json_response({"down_for_s": seconds}, status=202)


def _down_seconds(body: object) -> float:
    if not isinstance(body, dict) or set(body) != {"for_s"}:
        raise ControlError('expected {"for_s": seconds}')
    return float(number(0.0, 3600.0)("for_s", body["for_s"]))
