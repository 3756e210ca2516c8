"""The candidate walk as pure decisions: no store, no sockets."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta

import pytest

from gpugate.config import GatewayConfig
from gpugate.core.jobs import (
    ChainWalk,
    Defer,
    Exhausted,
    LearnedConcurrency,
    RuntimeView,
    Submit,
    Walk,
    candidates,
    reaches,
    runtime_views,
    skip_reason,
)
from harness import make_config, upstream

NOW = datetime(2026, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class Job:
    model: str = "qwen"
    runner: str = "local"
    allow_external: bool = True
    attempts: dict[str, int] = field(default_factory=dict)


def view(runtime_id: str, kind: str = "push", **facts: object) -> RuntimeView:
    return replace(RuntimeView(runtime_id, kind, models=frozenset({"qwen"})), **facts)  # type: ignore[arg-type]


def walk_of(job: Job, chain: list[str], *views: RuntimeView, max_attempts: int = 2) -> ChainWalk:
    return ChainWalk(
        job,
        chain,
        {v.id: v for v in views},
        now=NOW,
        max_attempts=max_attempts,
        capacity_backoff_s=5.0,
    )


def test_candidates_are_the_runner_then_the_chain_each_once() -> None:
    assert ["home-1", "local", "modal"] == candidates("home-1", ["local", "home-1", "modal"])
    assert ["local", "modal"] == candidates("local", ["local", "modal", "local"])


@pytest.mark.parametrize(
    ("facts", "job", "reason"),
    [
        ({"enabled": False}, Job(), "disabled"),
        ({"models": frozenset({"bge-m3"})}, Job(), "model_mismatch"),
        ({"implemented": False}, Job(), "no_implementation"),
        ({"reachable": False}, Job(), "unreachable"),
        ({"unreachable_models": frozenset({"qwen"})}, Job(), "unreachable"),
        ({"over_budget": True}, Job(), "over_budget"),
        ({"kind": "modal"}, Job(allow_external=False), "external_forbidden"),
        ({"external": True}, Job(allow_external=False), "external_forbidden"),
        ({"external_models": frozenset({"qwen"})}, Job(allow_external=False), "external_forbidden"),
        ({}, Job(attempts={"rt": 2}), "attempts_spent"),
    ],
    ids=lambda value: value if isinstance(value, str) else "",
)
def test_each_skip_reason_is_given_for_the_runtime_it_describes(
    facts: dict[str, object], job: Job, reason: str
) -> None:
    assert reason == skip_reason(job, "rt", view("rt", **facts), max_attempts=2)


def test_a_runtime_without_a_view_has_no_implementation_and_a_fit_one_is_not_skipped() -> None:
    assert "no_implementation" == skip_reason(Job(), "ghost", None)
    assert skip_reason(Job(), "rt", view("rt", models=None)) is None
    assert skip_reason(Job(allow_external=True), "rt", view("rt", kind="modal")) is None


def test_a_retryable_failure_is_retried_once_in_place_then_the_walk_goes_on() -> None:
    walk = walk_of(Job(runner="a"), ["a", "b"], view("a"), view("b"))
    assert Submit("a") == walk.next()
    assert Submit("a") == walk.failed("a", "RUNTIME_UNREACHABLE: down", retryable=True)
    assert Walk("a", "RUNTIME_UNREACHABLE: down") == walk.failed(
        "a", "RUNTIME_UNREACHABLE: down", retryable=True
    )
    assert Submit("b") == walk.next()


def test_a_non_retryable_failure_walks_on_at_once() -> None:
    walk = walk_of(Job(runner="a"), ["a", "b"], view("a"), view("b"))
    assert Submit("a") == walk.next()
    assert isinstance(walk.failed("a", "RUNTIME_REJECTED: no", retryable=False), Walk)
    assert Submit("b") == walk.next()


def test_no_retry_in_place_when_the_runtimes_attempts_would_be_spent() -> None:
    walk = walk_of(Job(runner="a", attempts={"a": 1}), ["a"], view("a"))
    assert Submit("a") == walk.next()
    assert isinstance(walk.failed("a", "RUNTIME_TIMEOUT: slow", retryable=True), Walk)


def test_after_the_last_candidate_the_job_is_exhausted_with_each_runtimes_last_error() -> None:
    walk = walk_of(Job(runner="a"), ["a", "b", "c"], view("a"), view("b"), view("c", enabled=False))
    walk.next()
    walk.failed("a", "RUNTIME_AUTH_FAILED: 401", retryable=False)
    walk.next()
    walk.failed("b", "RUNTIME_REJECTED: bad input", retryable=False)
    end = walk.next()
    assert (
        Exhausted(
            "CHAIN_EXHAUSTED",
            {
                "a": "RUNTIME_AUTH_FAILED: 401",
                "b": "RUNTIME_REJECTED: bad input",
                "c": "skipped (disabled)",
            },
        )
        == end
    )
    assert isinstance(end, Exhausted)
    assert "a: RUNTIME_AUTH_FAILED: 401; b: RUNTIME_REJECTED: bad input" in end.message


def test_every_candidate_at_capacity_defers_the_job_instead_of_failing_it() -> None:
    full = {"max_concurrency": 2, "leased": 2}
    walk = walk_of(
        Job(runner="a"), ["a", "b", "c"], view("a", **full), view("b", **full),
        view("c", enabled=False),
    )  # fmt: skip
    assert (
        Defer(
            "AT_CAPACITY",
            NOW + timedelta(seconds=5),
            {
                "a": "AT_CAPACITY: 2 of 2 calls in flight",
                "b": "AT_CAPACITY: 2 of 2 calls in flight",
                "c": "disabled",
            },
        )
        == walk.next()
    )


def test_a_runtime_at_capacity_is_passed_over_for_the_next_one_with_room_and_says_so() -> None:
    walk = walk_of(Job(runner="a"), ["a", "b"], view("a", max_concurrency=1, leased=1), view("b"))
    assert Submit("b") == walk.next()
    assert "AT_CAPACITY: 1 of 1 calls in flight" == walk.why("a")


def test_a_refused_slot_is_at_capacity_and_a_refused_budget_over_budget() -> None:
    """The reservation before the submit is the atomic check: what it refuses is the reason."""
    walk = walk_of(
        Job(runner="a"), ["a", "b"], view("a", max_concurrency=2, leased=2), view("b"),
        max_attempts=2,
    )  # fmt: skip
    walk.refused("a", over_budget=False)
    walk.refused("b", over_budget=True)
    assert ("AT_CAPACITY: 2 of 2 calls in flight", "over_budget") == (walk.why("a"), walk.why("b"))


def test_each_reason_the_walk_gives_is_the_one_that_kept_the_runtime_from_the_job() -> None:
    walk = walk_of(
        Job(runner="a"), ["a", "b", "c", "d"],
        view("a"), view("b", max_concurrency=1, leased=1), view("c", reachable=False),
        view("d", over_budget=True),
    )  # fmt: skip
    assert Submit("a") == walk.next()
    walk.failed("a", "RUNTIME_REJECTED: no", retryable=False)
    end = walk.next()
    assert isinstance(end, Defer)
    assert {
        "a": "RUNTIME_REJECTED: no",
        "b": "AT_CAPACITY: 1 of 1 calls in flight",
        "c": "unreachable",
        "d": "over_budget",
    } == end.why


def test_a_busy_runtime_that_stays_busy_defers_like_one_at_capacity() -> None:
    walk = walk_of(Job(runner="a"), ["a"], view("a"))
    walk.next()
    assert isinstance(walk.failed("a", "RUNTIME_BUSY: 429", retryable=True, busy=True), Walk)
    end = walk.next()
    assert isinstance(end, Defer)
    assert "RUNTIME_BUSY" == end.reason


def test_busy_is_not_a_failed_attempt_so_a_job_busy_many_times_is_never_spent() -> None:
    """Issue 14 defect 3: a worker at its concurrency answers 429; the job's attempts on it
    are its stored count, untouched, and the walk defers rather than failing."""
    job = Job(runner="a", attempts={"a": 1})
    for _ in range(5):
        walk = walk_of(job, ["a"], view("a"), max_attempts=2)
        assert Submit("a") == walk.next()
        walk.failed("a", "RUNTIME_BUSY: 429", retryable=True, busy=True)
        assert isinstance(walk.next(), Defer)


def test_a_busy_walk_waits_the_given_backoff_until_its_deadline_then_fails_busy_deadline() -> None:
    def walk(now: datetime) -> ChainWalk:
        w = ChainWalk(
            Job(runner="a"),
            ["a"],
            {"a": view("a")},
            now=now,
            max_attempts=2,
            capacity_backoff_s=5.0,
            busy_backoff_s=1.25,
            busy_deadline=NOW + timedelta(seconds=60),
        )
        w.next()
        w.failed("a", "RUNTIME_BUSY: 429", retryable=True, busy=True)
        return w

    before = walk(NOW + timedelta(seconds=59)).next()
    after = walk(NOW + timedelta(seconds=60)).next()
    assert Defer("RUNTIME_BUSY", NOW + timedelta(seconds=60.25), {"a": "RUNTIME_BUSY: 429"}) == (
        before
    )
    assert isinstance(after, Exhausted)
    assert "BUSY_DEADLINE" == after.code
    assert "a: busy past the deadline (RUNTIME_BUSY: 429)" == after.message


def test_the_learned_limit_halves_on_a_429_and_never_stays_above_what_was_in_flight() -> None:
    learned = LearnedConcurrency(8)
    learned.refused(in_flight=6)
    assert 4 == learned.limit
    learned.refused(in_flight=1)
    assert 1 == learned.limit
    learned.refused(in_flight=0)  # the worker is busy with someone else's calls: floor 1
    assert 1 == learned.limit


def test_the_learned_limit_grows_back_after_successes_at_it_but_never_past_the_ceiling() -> None:
    learned = LearnedConcurrency(2, probe_after=3)
    learned.refused(in_flight=1)
    for _ in range(2):
        learned.accepted(in_flight=0)
    assert 1 == learned.limit
    learned.accepted(in_flight=0)
    assert 2 == learned.limit
    for _ in range(100):
        learned.accepted(in_flight=1)
    assert 2 == learned.limit


def test_successes_below_the_learned_limit_teach_nothing() -> None:
    learned = LearnedConcurrency(4, probe_after=1)
    learned.refused(in_flight=2)
    for _ in range(10):
        learned.accepted(in_flight=0)  # one call of two allowed: the limit was not tested
    assert 2 == learned.limit


def test_a_job_that_may_not_leave_the_building_fails_forbidden_when_only_that_stopped_it() -> None:
    job = Job(runner="local", allow_external=False)
    walk = walk_of(
        job,
        ["local", "modal", "home"],
        view("local", kind="upstream", external_models=frozenset({"qwen"})),
        view("modal", kind="modal"),
        view("home", models=frozenset({"other"})),
    )
    end = walk.next()
    assert isinstance(end, Exhausted)
    assert "EXTERNAL_UPSTREAM_FORBIDDEN" == end.code
    assert ["local", "modal"] == list(end.errors)


def test_forbidden_mixed_with_another_reason_is_plain_chain_exhaustion() -> None:
    job = Job(runner="local", allow_external=False)
    walk = walk_of(job, ["local", "home"], view("local", kind="modal"), view("home", enabled=False))
    end = walk.next()
    assert isinstance(end, Exhausted)
    assert "CHAIN_EXHAUSTED" == end.code


def views_config() -> GatewayConfig:
    return make_config(
        "sqlite:///unused.db",
        [
            upstream("in", ["http://127.0.0.1:9001"], ["qwen"]),
            upstream("out", ["http://127.0.0.1:9002"], ["gpt"], external=True),
        ],
        runtimes=[
            {"id": "local", "kind": "upstream"},
            {
                "id": "home",
                "kind": "push",
                "models": ["qwen"],
                "push": {"url": "http://127.0.0.1:9100/calls", "secret_env": "HOME_SECRET"},
                "max_concurrency": 3,
            },
            {
                "id": "beta",
                "kind": "modal",
                "models": ["qwen"],
                "modal": {"app": "a", "function": "f"},
            },
        ],
        fallback_chain=["local", "home", "beta"],
    )


def test_runtime_views_describe_each_configured_runtime() -> None:
    views = runtime_views(
        views_config(), {"local", "home"}, disabled={"home"}, over_budget={"beta"}
    )
    assert frozenset({"qwen", "gpt"}) == views["local"].models
    assert frozenset({"gpt"}) == views["local"].external_models
    assert (False, 3, True) == (views["home"].enabled, views["home"].max_concurrency, True)
    assert (True, False, True) == (
        views["beta"].external,
        views["beta"].implemented,
        views["beta"].over_budget,
    )


def test_an_upstream_runtime_is_unreachable_when_none_of_its_models_is_live_and_per_model() -> None:
    """What ``GET /admin/runtimes/{id}`` shows (:func:`reaches`) is what the walk skips; a
    runtime that reaches some of its models is unreachable for the others only."""
    config = views_config()
    none_live = runtime_views(config, {"local", "home"}, live_models=frozenset())
    gpt_live = runtime_views(config, {"local", "home"}, live_models=frozenset({"gpt"}))
    assert (False, False) == (none_live["local"].reachable, reaches(["qwen", "gpt"], []))
    assert (True, True) == (gpt_live["local"].reachable, reaches(["qwen", "gpt"], ["gpt"]))
    assert frozenset({"qwen"}) == gpt_live["local"].unreachable_models
    assert "unreachable" == skip_reason(Job(model="qwen"), "local", gpt_live["local"])
    assert skip_reason(Job(model="gpt"), "local", gpt_live["local"]) is None
    assert none_live["home"].reachable  # nothing probes a push runtime: not judged here


def test_a_new_max_concurrency_is_the_new_ceiling_at_once_and_a_learned_limit_stays_below_it() -> (
    None
):
    untaught = LearnedConcurrency(1)
    untaught.rebase(3)  # nothing learned: the limit was the old max, it is the new one
    taught = LearnedConcurrency(4)
    taught.refused(in_flight=2)
    taught.rebase(8)  # learned from a 429: it stays what the worker took
    kept = taught.limit
    taught.rebase(1)  # never above the ceiling
    assert (3, 3) == (untaught.limit, untaught.ceiling)
    assert 2 == kept
    assert (1, 1) == (taught.limit, taught.ceiling)
    untaught.rebase(2)  # at the ceiling, so down with it too
    assert 2 == untaught.limit
