from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from gpugate.store import AuditEvent, AuditRecord

if TYPE_CHECKING:
    from gpugate.clock import ManualClock
    from gpugate.store import Store


def audit_event(
    action: str = "runtime.disabled", subject: str = "home-1", **detail: Any
) -> AuditEvent:
    return AuditEvent(actor="operator", action=action, subject=subject, detail=detail)


async def append_all(store: Store, events: list[AuditEvent]) -> list[AuditRecord]:
    return [await store.append_audit(event) for event in events]


async def test_append_returns_the_stored_record_with_the_clock_time(
    store: Store, clock: ManualClock
) -> None:
    clock.advance(12)

    record = await store.append_audit(audit_event(reason="max_stuck", stuck=4))

    expected = AuditRecord(
        record.id,
        clock.now(),
        "operator",
        "runtime.disabled",
        "home-1",
        {"reason": "max_stuck", "stuck": 4},
    )
    assert expected == record
    assert [record] == await store.list_audit()


async def test_audit_ids_grow_and_the_list_is_newest_first(store: Store) -> None:
    records = await append_all(store, [audit_event(n=n) for n in range(4)])

    assert sorted(r.id for r in records) == [r.id for r in records]
    assert list(reversed(records)) == await store.list_audit()


async def test_audit_is_filtered_by_action_by_subject_and_by_both(store: Store) -> None:
    records = await append_all(
        store,
        [
            audit_event("runtime.disabled", "home-1"),
            audit_event("runtime.enabled", "home-1"),
            audit_event("runtime.disabled", "modal-beta"),
            audit_event("gpu.cleared", "0"),
        ],
    )

    by_action = await store.list_audit(action="runtime.disabled")
    by_subject = await store.list_audit(subject="home-1")
    by_both = await store.list_audit(action="runtime.disabled", subject="home-1")

    assert [records[2], records[0]] == by_action
    assert [records[1], records[0]] == by_subject
    assert [records[0]] == by_both
    assert [] == await store.list_audit(action="no.such.action")


async def test_before_id_pages_back_through_the_trail_without_gaps_or_overlap(
    store: Store,
) -> None:
    records = await append_all(store, [audit_event(n=n) for n in range(7)])
    pages: list[list[AuditRecord]] = []
    cursor: int | None = None

    while page := await store.list_audit(limit=3, before_id=cursor):
        pages.append(page)
        cursor = page[-1].id

    assert [3, 3, 1] == [len(page) for page in pages]
    assert list(reversed(records)) == [record for page in pages for record in page]


async def test_before_id_combines_with_a_filter(store: Store) -> None:
    records = await append_all(
        store, [audit_event("a.x" if n % 2 else "b.y", n=n) for n in range(6)]
    )

    page = await store.list_audit(action="a.x", before_id=records[5].id)

    assert [records[3], records[1]] == page


async def test_the_limit_caps_the_page_and_must_be_positive(store: Store) -> None:
    await append_all(store, [audit_event(n=n) for n in range(5)])

    assert 2 == len(await store.list_audit(limit=2))
    with pytest.raises(ValueError, match="limit"):
        await store.list_audit(limit=0)


async def test_nested_detail_round_trips(store: Store) -> None:
    detail = {"errors": [{"runtime": "home-1", "code": 401}], "ratio": 0.5, "why": "ünïcode"}

    await store.append_audit(AuditEvent("gateway", "job.failed", "job-1", detail))

    [record] = await store.list_audit(subject="job-1")
    assert detail == record.detail
