"""Scripted incidents for ``gpugate demo --scenario NAME``, played against the simulated fleet.

A scenario is a short script over a :class:`Stage`: it steers the fleet only through its control
routes (the fake exporter's ``/_control/gpus/{i}``, a fake server's ``/_control``) and by
restarting the demo's push worker (runtime ``home-1``) with another secret, acts and watches
only through the gateway's public and admin APIs — exactly what an operator would do and see in
the console — narrates each step, holds each state ``pace_s`` so a person can watch it, and ends
with the fleet healthy again (:meth:`Stage.healthy`). Every wait is bounded: a step that does
not happen in ``timeout_s`` raises :class:`ScenarioFailed` naming it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gpugate.adapters.gateway_api import GatewayApi, GatewayApiError
from gpugate.errors import GpugateError

CHAT_MODEL = "qwen-35b"  # served by the upstream on GPU 0 alone, so GPU 0 decides its fate
FALLBACK_MODEL = "qwen-7b"  # on GPU 1: the demo config's fallback of qwen-35b
HOME = "home-1"  # the demo's push runtime: its worker is in front of qwen-35b too
FATAL_XID = 79  # "GPU has fallen off the bus": a fatal XID in NVIDIA's table


class ScenarioFailed(GpugateError):
    """A scenario's step did not happen in time."""

    code = "SCENARIO_FAILED"


@dataclass
class Stage:
    """What a scenario acts through: the gateway's APIs, the fleet's control routes, a narrator."""

    gateway_url: str
    token: str
    exporter_url: str
    servers: Mapping[str, str]  # fake model server name -> base URL
    say: Callable[[str], None]
    restart_worker: Callable[[str | None], Awaitable[None]]  # home-1's; None: the right secret
    pace_s: float = 5.0  # how long a state is held for a watcher (0 in tests)
    timeout_s: float = 60.0
    poll_s: float = 0.5

    def __post_init__(self) -> None:
        self._admin = GatewayApi(self.gateway_url, token=self.token, actor="demo")
        self._gateway = GatewayApi(self.gateway_url)

    async def admin(self, method: str, path: str, body: Any = None) -> Any:
        _, answer = await asyncio.to_thread(self._admin.request, method, path, body)
        return answer

    async def config(self) -> dict[str, Any]:
        """The gateway config in effect, as exported (``GET /admin/config``)."""
        return dict(await self.admin("GET", "/admin/config"))

    async def gpu(self, index: int, **readings: Any) -> None:
        """Change what GPU ``index`` reads on the fake exporter."""
        api = GatewayApi(self.exporter_url)
        await asyncio.to_thread(api.request, "POST", f"/_control/gpus/{index}", readings)

    async def server(self, name: str, **behaviour: Any) -> None:
        """Change how the fake model server ``name`` behaves."""
        api = GatewayApi(self.servers[name])
        await asyncio.to_thread(api.request, "POST", "/_control", behaviour)

    async def chat(self, cls: str = "interactive") -> str:
        """One chat request of class ``cls``: ``200 (by MODEL)`` or the error the gateway
        answered (``429 GPU_SATURATED``)."""
        messages = [{"role": "user", "content": "hello"}]
        try:
            reply = await self.converse(messages, cls=cls)
        except GatewayApiError as exc:
            return f"{exc.status} {exc.code}"
        return f"200 (by {reply.model})"

    async def converse(
        self, messages: list[dict[str, str]], *, stream: bool = False, cls: str = "interactive"
    ) -> Reply:
        """One turn of a conversation with qwen-35b (GatewayApiError if refused)."""
        body = {"model": CHAT_MODEL, "messages": messages, "stream": stream}
        data = json.dumps(body).encode()
        headers = {"Content-Type": "application/json", "X-Request-Class": cls}
        _, got, raw = await asyncio.to_thread(
            self._gateway.send, "POST", "/v1/chat/completions", data, headers=headers
        )
        model, attempts = got.get("x-gateway-model", "?"), got.get("x-gateway-attempts", "?")
        if stream:
            return Reply.of_stream(model, raw, attempts)
        answer = json.loads(raw)
        text = str(answer["choices"][0]["message"]["content"])
        return Reply(model, text, done=True, attempts=attempts)

    async def server_log(self, name: str) -> list[dict[str, Any]]:
        """The model requests the fake model server ``name`` saw (its ``/_control/log``)."""
        api = GatewayApi(self.servers[name])
        _, log = await asyncio.to_thread(api.request, "GET", "/_control/log")
        return list(log["requests"])

    async def server_faults(self, name: str, rules: list[dict[str, Any]] | None) -> None:
        """Arm fault rules on the fake model server ``name`` (None: clear them all)."""
        api = GatewayApi(self.servers[name])
        if rules is None:
            await asyncio.to_thread(api.request, "DELETE", "/_control/faults")
        else:
            await asyncio.to_thread(api.request, "POST", "/_control/faults", {"faults": rules})

    async def submit_job(self, *, cls: str = "batch", runner: str | None = None) -> str:
        body: dict[str, Any] = {
            "model": CHAT_MODEL,
            "class": cls,
            "input": {"messages": [{"role": "user", "content": "summarise the incident"}]},
        }
        if runner is not None:
            body["runner"] = runner
        _, job = await asyncio.to_thread(self._gateway.request, "POST", "/v1/jobs", body)
        return str(job["slug"])

    async def job(self, slug: str) -> dict[str, Any]:
        _, job = await asyncio.to_thread(self._gateway.request, "GET", f"/v1/jobs/{slug}")
        return dict(job)

    async def job_state(self, slug: str) -> str:
        return str((await self.job(slug))["state"])

    async def completed_on(self, slug: str) -> str:
        """Wait until job ``slug`` completes; the runtime it completed on."""
        job: dict[str, Any] = {}

        async def completed() -> bool:
            job.update(await self.job(slug))
            if job["state"] in ("failed", "cancelled"):
                raise ScenarioFailed(f"job {slug} {job['state']}: {job['error']}")
            return bool(job["state"] == "completed")

        await self.until(f"job {slug} completes", completed)
        return str(job["runner"])

    async def runtime(self, runtime_id: str) -> dict[str, Any]:
        """``GET /admin/runtimes/{id}``: the runtime's detail, as its console page shows it."""
        return dict(await self.admin("GET", f"/admin/runtimes/{runtime_id}"))

    async def job_events(self, slug: str) -> list[dict[str, Any]]:
        _, events = await asyncio.to_thread(self._gateway.request, "GET", f"/v1/jobs/{slug}/events")
        return list(events["data"])

    async def gpu_rows(self) -> list[dict[str, Any]]:
        return list((await self.admin("GET", "/admin/gpus"))["gpus"])

    async def upstream(self, upstream_id: str) -> dict[str, Any]:
        upstreams = (await self.admin("GET", "/admin/upstreams"))["upstreams"]
        return next(u for u in upstreams if u["id"] == upstream_id)

    async def until(self, what: str, check: Callable[[], Awaitable[bool]]) -> None:
        """Wait until ``check()`` holds, polling; :class:`ScenarioFailed` after ``timeout_s``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_s
        while not await check():
            if loop.time() > deadline:
                raise ScenarioFailed(f"{what}: not within {self.timeout_s:.0f} s")
            await asyncio.sleep(self.poll_s)

    async def hold(self, factor: float = 1.0) -> None:
        """Leave the current state on screen for a watcher."""
        await asyncio.sleep(self.pace_s * factor)

    async def healthy(self) -> bool:
        """Every upstream in rotation, no GPU faulted or saturated, every runtime enabled and
        within its budget."""
        upstreams = (await self.admin("GET", "/admin/upstreams"))["upstreams"]
        gpus = await self.gpu_rows()
        runtimes = (await self.admin("GET", "/admin/runtimes"))["runtimes"]
        return (
            all(u["out_of_rotation"] is None for u in upstreams)
            and all(g["verdict"] != "faulted" and not g["saturated"] for g in gpus)
            and all(r["health"]["state"] == "enabled" for r in runtimes)
            and not any(r["spend"]["over_budget"] for r in runtimes)
        )


@dataclass(frozen=True, slots=True)
class Reply:
    """One answer of a conversation: the model that answered (``X-Gateway-Model``), its text,
    and whether it ended properly (a stream: ``data: [DONE]``, no ``event: error``)."""

    model: str
    text: str
    done: bool
    error: str | None = None
    attempts: str = "?"  # X-Gateway-Attempts

    @classmethod
    def of_stream(cls, model: str, raw: bytes, attempts: str = "?") -> Reply:
        text: list[str] = []
        done, error = False, None
        for event in raw.decode(errors="replace").split("\n\n"):
            lines = event.strip().splitlines()
            data = next((line[6:] for line in lines if line.startswith("data: ")), None)
            if "event: error" in lines:
                error = data
            elif data == "[DONE]":
                done = True
            elif data is not None:
                choices = json.loads(data).get("choices") or ()
                text.extend(choice.get("delta", {}).get("content") or "" for choice in choices)
        return cls(model, "".join(text), done and error is None, error, attempts)


Script = Callable[[Stage], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class Scenario:
    """A named incident: what it shows, and its script."""

    name: str
    shows: str
    script: Script


async def xid(stage: Stage) -> None:
    """A fatal XID on GPU 0 takes qwen-35b out of rotation; an operator clears it; it returns."""
    say = stage.say
    say(f"[xid] GPU 0 reports XID {FATAL_XID} (fallen off the bus): a fatal XID")
    await stage.gpu(0, xid=FATAL_XID)

    async def out() -> bool:
        return (await stage.upstream(CHAT_MODEL))["out_of_rotation"] is not None

    await stage.until("qwen-35b leaves rotation", out)
    answer = await stage.chat()
    say(
        f"[xid] qwen-35b is out of rotation; a chat request for it now answers {answer}:"
        f" its fallback {FALLBACK_MODEL} stands in"
    )
    if answer != f"200 (by {FALLBACK_MODEL})":
        raise ScenarioFailed(f"expected the fallback {FALLBACK_MODEL} to answer: {answer}")
    await stage.hold(2)
    say("[xid] the operator replaced the GPU and clears the fault: POST /admin/gpus/0/clear")
    await stage.admin("POST", "/admin/gpus/0/clear")

    async def back() -> bool:
        return (await stage.upstream(CHAT_MODEL))["out_of_rotation"] is None

    await stage.until("qwen-35b returns to rotation", back)
    await stage.gpu(0, xid=0)  # the replaced GPU: no XID since
    say(f"[xid] qwen-35b is back in rotation; a chat request answers {await stage.chat()}")


async def saturate(stage: Stage) -> None:
    """Sustained 100 % util on GPU 0: batch is shed (sync 429, jobs deferred); then recovery."""
    say = stage.say
    say("[saturate] GPU 0 runs at 100 % util, sample after sample")
    await stage.gpu(0, util=100)

    async def saturated() -> bool:
        return any(g["gpu"] == 0 and g["saturated"] for g in await stage.gpu_rows())

    await stage.until("GPU 0 is saturated", saturated)
    batch, interactive = await stage.chat("batch"), await stage.chat("interactive")
    say(f"[saturate] saturated: a batch request answers {batch}, an interactive one {interactive}")
    if not batch.endswith("GPU_SATURATED") or not interactive.startswith("200"):
        raise ScenarioFailed(f"expected batch shed and interactive served: {batch}, {interactive}")
    slug = await stage.submit_job()

    async def deferred() -> bool:
        events = await stage.job_events(slug)
        return any(e["error_code"] == "GPU_SATURATED" for e in events)

    await stage.until(f"job {slug} is deferred GPU_SATURATED", deferred)
    say(f"[saturate] batch job {slug} is deferred (still queued), not failed")
    await stage.hold(2)
    say("[saturate] the load drops: GPU 0 back to 20 % util")
    await stage.gpu(0, util=20)

    async def done() -> bool:
        return await stage.job_state(slug) == "completed"

    await stage.until("GPU 0 is no longer saturated", lambda: _not(saturated))
    say(f"[saturate] not saturated: a batch request answers {await stage.chat('batch')}")
    await stage.until(f"the deferred job {slug} completes", done)
    say(f"[saturate] job {slug} ran once the GPU had room: completed")


async def budget(stage: Stage) -> None:
    """home-1 spends past twice its daily budget: the walk skips it; the operator raises it."""
    say = stage.say
    document = await stage.config()
    home = next(r for r in document["runtimes"] if r["id"] == HOME)
    say(
        f"[budget] runtime {HOME} (the push worker) costs {home['budget']['cents_per_second']:g}"
        f" cent a second and may spend {home['budget']['daily_cents']:g} cents a day; over budget"
        " at twice that. A long batch arrives: each call now takes 1 s"
    )
    await stage.server(CHAT_MODEL, delay_s=1)
    for _ in range(10):  # ~4 calls of 1 s each cross 2 x daily_cents
        slug = await stage.submit_job(runner=HOME)
        ran_on = await stage.completed_on(slug)
        spend = (await stage.runtime(HOME))["spend"]
        say(
            f"[budget] job {slug} ran on {ran_on}; {HOME} has spent"
            f" {spend['today_cents']:.2f} of {spend['daily_cents']:g} cents today"
            + (" - past the soft cap (runtime.soft_cap, audited once)" if spend["soft_cap"] else "")
        )
        if spend["over_budget"]:
            break
    else:
        raise ScenarioFailed(f"{HOME} did not go over budget")
    await stage.server(CHAT_MODEL, delay_s=0)
    slug = await stage.submit_job(runner=HOME)
    ran_on = await stage.completed_on(slug)
    say(
        f"[budget] {HOME} is over budget (its console page: spend against the budget, badge"
        f" `over budget`): job {slug} asked for it, skipped it and ran on {ran_on}"
    )
    if ran_on == HOME:
        raise ScenarioFailed(f"job {slug} ran on {HOME} although it is over budget")
    await stage.hold(2)
    document = await stage.config()
    raised = 500
    next(r for r in document["runtimes"] if r["id"] == HOME)["budget"]["daily_cents"] = raised
    say(f"[budget] the spend was expected: the operator imports a config with {raised} cents a day")
    await stage.admin("PUT", "/admin/config", document)

    async def within() -> bool:
        return not (await stage.runtime(HOME))["spend"]["over_budget"]

    await stage.until(f"{HOME} is within its budget again", within)
    slug = await stage.submit_job(runner=HOME)
    ran_on = await stage.completed_on(slug)
    say(f"[budget] {HOME} is within its raised budget: job {slug} ran on {ran_on}")
    if ran_on != HOME:
        raise ScenarioFailed(f"job {slug} ran on {ran_on}, not on {HOME}")


async def auth(stage: Stage) -> None:
    """home-1's worker refuses the gateway's secret (401): auto-disabled; fixed and enabled."""
    say = stage.say
    say(
        f"[auth] {HOME}'s worker restarts with a rotated secret: worker.env was edited, the"
        " gateway's secret was not"
    )
    await stage.restart_worker("rotated-on-one-side-only")
    slug = await stage.submit_job(runner=HOME)

    async def disabled() -> bool:
        health = (await stage.runtime(HOME))["health"]
        return bool(health["state"] == "disabled" and health["auto_disables"])

    await stage.until(f"{HOME} is auto-disabled (stop condition auth_error)", disabled)
    health = (await stage.runtime(HOME))["health"]
    say(f"[auth] the gateway disabled {HOME} ({health['actor']}): {health['reason']}")
    query = f"action=runtime.disabled&subject=runtime:{HOME}&actor=gateway:auth_error"
    audit = (await stage.admin("GET", f"/admin/audit?{query}"))["data"]
    if not audit:
        raise ScenarioFailed(f"no runtime.disabled event by gateway:auth_error for {HOME}")
    event = audit[0]
    say(f"[auth] the audit log has it: {event['action']} {event['subject']} at {event['at']}")
    ran_on = await stage.completed_on(slug)
    say(f"[auth] job {slug} asked for {HOME}, walked on and completed on {ran_on}")
    await stage.hold(2)
    say("[auth] the operator puts the gateway's secret back in worker.env, restarts the worker")
    await stage.restart_worker(None)
    say(f"[auth] ... and enables {HOME}: POST /admin/runtimes/{HOME}/enable")
    await stage.admin("POST", f"/admin/runtimes/{HOME}/enable", {"reason": "worker secret fixed"})
    slug = await stage.submit_job(runner=HOME)
    ran_on = await stage.completed_on(slug)
    say(f"[auth] {HOME} is back: job {slug} ran on {ran_on}")
    if ran_on != HOME:
        raise ScenarioFailed(f"job {slug} ran on {ran_on}, not on {HOME}")


async def failover(stage: Stage) -> None:
    """A conversation with qwen-35b; GPU 0 falls off the bus between two turns and its model
    server dies with it; the next turn, streamed, is answered by the fallback qwen-7b as one
    unbroken stream (the gateway holds the headers until a first token is in); while GPU 0 is
    faulted qwen-7b answers at once; the operator replaces the GPU and qwen-35b takes over."""
    say = stage.say
    chat: list[dict[str, str]] = [{"role": "user", "content": "plan the maintenance window"}]
    first = await stage.converse(chat)
    say(f"[failover] turn 1, answered by {first.model}: {first.text!r}")
    if first.model != CHAT_MODEL:
        raise ScenarioFailed(f"turn 1 was answered by {first.model}, not {CHAT_MODEL}")
    chat.append({"role": "assistant", "content": first.text})
    await stage.hold()
    say(
        f"[failover] GPU 0 reports XID {FATAL_XID} (fallen off the bus); qwen-35b's server dies"
        " with it: every request to it is reset, its /health answers 503"
    )
    await stage.server_faults(CHAT_MODEL, [{"kind": "reset"}])
    await stage.server(CHAT_MODEL, health_status=503)
    await stage.gpu(0, xid=FATAL_XID)
    chat.append({"role": "user", "content": "and which GPUs go first"})
    second = await stage.converse(chat, stream=True)
    if not second.done or second.model != FALLBACK_MODEL:
        raise ScenarioFailed(f"turn 2 did not stream whole from {FALLBACK_MODEL}: {second}")
    say(
        f"[failover] turn 2, streamed: one unbroken stream ending in [DONE], answered by"
        f" {second.model} ({second.attempts} tries): {second.text!r}"
    )
    chat.append({"role": "assistant", "content": second.text})

    async def out() -> bool:
        return (await stage.upstream(CHAT_MODEL))["out_of_rotation"] is not None

    await stage.until("qwen-35b leaves rotation", out)
    tried = len(await stage.server_log(CHAT_MODEL))
    chat.append({"role": "user", "content": "thanks, and after that?"})
    third = await stage.converse(chat)
    untouched = len(await stage.server_log(CHAT_MODEL)) == tried
    say(
        f"[failover] qwen-35b is out of rotation: turn 3 is answered by {third.model} at once"
        + (", without a try on the dead server" if untouched else "")
    )
    if third.model != FALLBACK_MODEL or not untouched:
        raise ScenarioFailed(f"turn 3: {third.model}, the dead server tried: {not untouched}")
    chat.append({"role": "assistant", "content": third.text})
    await stage.hold(2)
    say("[failover] the operator replaces GPU 0 and clears the fault: POST /admin/gpus/0/clear")
    await stage.server_faults(CHAT_MODEL, None)
    await stage.server(CHAT_MODEL, health_status=200)
    await stage.gpu(0, xid=0)
    await stage.admin("POST", "/admin/gpus/0/clear")

    async def back() -> bool:
        return (await stage.upstream(CHAT_MODEL))["out_of_rotation"] is None

    await stage.until("qwen-35b returns to rotation", back)
    chat.append({"role": "user", "content": "good, go ahead"})
    fourth = await stage.converse(chat)
    say(f"[failover] qwen-35b is back: turn 4 of the conversation is answered by {fourth.model}")
    if fourth.model != CHAT_MODEL:
        raise ScenarioFailed(f"turn 4 was answered by {fourth.model}, not {CHAT_MODEL}")


async def _not(check: Callable[[], Awaitable[bool]]) -> bool:
    return not await check()


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario(
            "xid",
            "a fatal XID on a GPU takes its upstream out of rotation; the operator clears it",
            xid,
        ),
        Scenario(
            "saturate",
            "a saturated GPU: batch requests shed (429), batch jobs deferred; then recovery",
            saturate,
        ),
        Scenario(
            "budget",
            "a runtime over its daily budget is skipped in the walk; the operator raises it",
            budget,
        ),
        Scenario(
            "failover",
            "a GPU faults mid-conversation: the chat goes on on the fallback model; it returns",
            failover,
        ),
        Scenario(
            "auth",
            "a runtime answering 401 is auto-disabled (stop condition); fixed and re-enabled",
            auth,
        ),
    )
}


def describe() -> str:
    """One line per scenario, for ``--help``."""
    lines = ["scenarios:"]
    lines.extend(f"  {s.name:10}{s.shows}" for s in SCENARIOS.values())
    return "\n".join(lines)


async def play(name: str, stage: Stage) -> None:
    """Play scenario ``name`` to its end; the fleet is healthy again afterwards (checked)."""
    await SCENARIOS[name].script(stage)
    await stage.until("the fleet is healthy again", stage.healthy)
    stage.say(f"[{name}] done: the fleet is healthy again (watch it in the console)")
