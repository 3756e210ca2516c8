"""Per-GPU health state and verdicts: readings in, faulted / saturated / stale out (DESIGN §4).

One :class:`GpuState` per :class:`~gpugate.core.gpu.dcgm.GpuKey`, fed by :func:`observe` on every
successful scrape and read by :func:`assess`. Times are seconds on a monotonic clock.

* **Fault evidence.** XID: a *change* of the last-XID value to a fatal code, or a fatal code on
  the first value this gateway sees for the GPU ("seen at start"). The value is sticky, so an
  unchanged value is never new evidence — not after the hold runs out, not after an operator's
  :func:`clear`; an exporter restart resets it to 0, so the same code afterwards is a change
  again. The remembered value survives exporter outages (a GPU's state is dropped only when an
  operator clears it while it is missing, see below). A change of the value is an event; a
  positive windowed count of a fatal code (``DCGM_EXP_XID_ERRORS_COUNT{xid}``), HW
  thermal/slowdown clock events, ``temp ≥ max_temp_c``, a row-remap failure and DCGM health FAIL
  are continuing evidence, refreshed on every scrape that shows them — a GPU throwing the same
  fatal XID every minute keeps a positive count, so it stays faulted. An operator's clear
  dismisses the counts it saw: a count is evidence again once it rises above the one cleared
  (or above the lower value it drained to since). A fault holds while the newest fresh scrape
  of the row still shows its evidence, then for ``fault_hold_s`` after its last evidence, or
  until cleared (so a ``fault_hold_s`` shorter than ``poll_s``, or 0, still keeps a GPU that
  throttles on every scrape out of rotation).
* **A GPU missing from its exporter's scrape.** A GPU that falls off the bus (XID 79) often
  vanishes from dcgm-exporter's output instead of reporting the XID (dcgm-exporter issue #348). So
  when a successful scrape shows other GPUs of a host but no row at all of a GPU it showed before,
  that is continuing evidence (:func:`observe_missing`), refreshed on every such scrape, and the
  GPU is not stale. One MIG instance gone while its GPU still shows others is a reconfiguration,
  not evidence: that row only ages. An operator's clear of a missing GPU forgets it.
* **Saturation.** The last ``sustained_samples`` utils, all ≥ ``shed_util_pct``, the newest fresh.
  A missed poll keeps the ring; a gap longer than ``staleness_s`` empties it.
* **Staleness fails open.** Staleness is the exporter's, not the row's: a row is fresh while its
  exporter's successful scrapes (at least one GPU) keep judging it, whether they show it or miss
  it. When the exporter has answered no successful scrape for longer than ``staleness_s`` (down,
  timing out, garbage, no GPU series), every row of it is stale and nothing new is faulted or
  saturated. Fail open is for *no* evidence, not for *old* evidence of a fault (issue #14
  defect 12b): a fault still inside its hold keeps holding while the data is stale — until
  ``fault_hold_s`` after its last evidence, or an operator's clear — so a faulted GPU behind a
  hung exporter does not return to rotation because the exporter stopped answering.

:class:`GpuFleetState` holds the states of every exporter and answers per configured GPU id
(``0`` for the one exporter of ``dcgm_url``; ``"node-a/0"`` with many), folding MIG instances
into their GPU.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

from gpugate.core.gpu.dcgm import HEALTH_FAIL, GpuKey, GpuReading
from gpugate.core.gpu.xid import XidTable

CLOCK_EVENT_NAMES = (
    "gpu_idle",  # 0x001
    "clocks_setting",  # 0x002
    "power_cap",  # 0x004
    "hw_slowdown",  # 0x008
    "sync_boost",  # 0x010
    "sw_thermal",  # 0x020
    "hw_thermal",  # 0x040
    "hw_power_brake",  # 0x080
    "display_clocks",  # 0x100
)
"""dcgm-exporter's names of the clock-event reason bits, in bit order."""
HW_SLOWDOWN = 0x08
HW_THERMAL = 0x40
_THERMAL_FAULT_BITS = ((HW_SLOWDOWN, "hw_slowdown"), (HW_THERMAL, "hw_thermal"))


def decode_clock_reasons(mask: int) -> list[str]:
    """The reasons set in ``mask``, in bit order; a bit without a name shows as hex (``0x200``)."""
    names = []
    bit = 0
    while mask >> bit:
        if mask >> bit & 1:
            names.append(CLOCK_EVENT_NAMES[bit] if bit < len(CLOCK_EVENT_NAMES) else hex(1 << bit))
        bit += 1
    return names


@dataclass(frozen=True, slots=True)
class Thresholds:
    """``gpu_health``'s knobs that turn readings into verdicts (defaults as in DESIGN §2)."""

    staleness_s: float = 60.0
    sustained_samples: int = 4
    shed_util_pct: float = 95.0
    fault_hold_s: float = 300.0
    max_temp_c: float | None = 90.0  # None: no temperature threshold
    couple_faults: bool = True  # a faulted GPU takes its upstreams out of rotation

    def __post_init__(self) -> None:
        problems = [
            message
            for ok, message in (
                (self.staleness_s > 0, "staleness_s must be positive"),
                (self.sustained_samples >= 1, "sustained_samples must be at least 1"),
                (0 <= self.shed_util_pct <= 100, "shed_util_pct must be in [0, 100]"),
                (self.fault_hold_s >= 0, "fault_hold_s must not be negative"),
            )
            if not ok
        ]
        if problems:
            raise ValueError("; ".join(problems))


Evidence = tuple[str, str]
"""(kind, reason): ``("temp", "temperature 93 °C ≥ 90")``. A newer reason of a kind replaces the
older one, so a fault that holds for hours says what is wrong now, once per kind."""


@dataclass(frozen=True, slots=True)
class Fault:
    """A held fault: why (each kind of evidence seen while it held), since when, last evidence."""

    evidence: tuple[Evidence, ...]
    since: float
    last_evidence: float

    @property
    def reasons(self) -> tuple[str, ...]:
        return tuple(reason for _, reason in self.evidence)

    @property
    def reason(self) -> str:
        return "; ".join(self.reasons)


@dataclass(frozen=True, slots=True)
class GpuVerdict:
    """What routing and shedding act on, for one GPU at one moment."""

    stale: bool
    faulted: bool
    saturated: bool
    reasons: tuple[str, ...] = ()  # why: stale, then the held fault's reasons, then saturated
    fault_reasons: tuple[str, ...] = ()  # the held fault's part of ``reasons``
    fault_reason: str | None = None  # set while a fault is inside its hold (even if stale)
    faulted_since: float | None = None


NEVER_SEEN = GpuVerdict(stale=True, faulted=False, saturated=False, reasons=("stale: no sample",))
"""The verdict of a GPU no scrape has shown yet: stale, so nothing acts on it."""


@dataclass(slots=True, eq=False, repr=False)
class GpuState:
    """Everything remembered about one GPU (or MIG instance) between scrapes. Mutable."""

    key: GpuKey
    util: deque[float] = field(default_factory=deque)  # the last sustained_samples utils
    util_at: float | None = None  # when the newest util arrived
    latest: GpuReading | None = None  # the newest reading, for display
    last_seen: float | None = None  # when the newest reading arrived
    scraped_at: float | None = None  # the last successful scrape that showed or missed it
    missing_since: float | None = None  # missing from its exporter's scrapes since (None: shown)
    samples: int = 0
    last_xid: int | None = None  # the remembered last-XID value (None: never seen one)
    xid_changed_at: float | None = None
    xid_counts: dict[int, int] = field(default_factory=dict)  # the previous scrape's counts
    fault: Fault | None = None
    cleared_xid: int | None = None  # the XID value an operator's clear saw
    cleared_at: float | None = None
    cleared_counts: dict[int, int] = field(default_factory=dict)  # counts a clear dismissed

    @property
    def temp_c(self) -> float | None:
        return self.latest.temp_c if self.latest else None

    @property
    def clock_reasons(self) -> list[str]:
        mask = self.latest.clock_reasons if self.latest else None
        return decode_clock_reasons(mask) if mask is not None else []

    @property
    def row_remap_failure(self) -> bool | None:
        return self.latest.row_remap_failure if self.latest else None

    @property
    def health(self) -> int | None:
        return self.latest.health if self.latest else None

    def __repr__(self) -> str:
        fault = f" fault={self.fault.reason!r}" if self.fault else ""
        missing = f" missing_since={self.missing_since:g}" if self.missing_since is not None else ""
        utils = ",".join(f"{u:g}" for u in self.util)
        return (
            f"<GpuState {self.key} samples={self.samples} util=[{utils}]"
            f" xid={self.last_xid}{missing}{fault}>"
        )


def observe(
    state: GpuState, reading: GpuReading, now: float, table: XidTable, thresholds: Thresholds
) -> None:
    """Fold a successful scrape's ``reading`` of ``state.key``, taken at ``now``, into ``state``."""
    previous = state.scraped_at
    if reading.util_pct is not None:
        ring = state.util
        if ring.maxlen != thresholds.sustained_samples:  # new state, or the config changed
            ring = state.util = deque(ring, maxlen=thresholds.sustained_samples)
        if state.util_at is not None and now - state.util_at > thresholds.staleness_s:
            ring.clear()  # a gap, not a missed poll: the old utils say nothing about now
        ring.append(reading.util_pct)
        state.util_at = now
    evidence = _xid_evidence(state, reading, now, table) + _continuing_evidence(reading, thresholds)
    state.latest = reading
    state.last_seen = state.scraped_at = now
    state.missing_since = None
    state.samples += 1
    if evidence:
        _hold(state, evidence, now, thresholds, previous)


def observe_missing(state: GpuState, now: float, thresholds: Thresholds) -> None:
    """A successful scrape of ``state``'s exporter at ``now`` shows no row of its GPU at all.

    Fault evidence (the GPU fell off the bus, most likely), refreshed on every such scrape; the
    row is fresh, since its exporter answered. The readings it had stay as they were.
    """
    if state.missing_since is None:
        state.missing_since = now
    previous, state.scraped_at = state.scraped_at, now
    reason = f"GPU {state.key.gpu} missing from its exporter's scrape (fallen off the bus?)"
    _hold(state, [("missing", reason)], now, thresholds, previous)


def assess(state: GpuState | None, now: float, thresholds: Thresholds) -> GpuVerdict:
    """``state``'s verdict at ``now``; a GPU never seen (None) is stale. Pure.

    Stale when no successful scrape of its exporter has judged the row (shown it or missed it)
    for longer than ``staleness_s``. A fault inside its hold is faulted, stale or not; so is one
    whose evidence the newest scrape showed, while that scrape is fresh.
    """
    if state is None or state.scraped_at is None:
        return NEVER_SEEN
    reasons: list[str] = []
    stale = now - state.scraped_at > thresholds.staleness_s
    if stale:
        reasons.append(
            f"stale: no successful scrape of its exporter for {now - state.scraped_at:.0f} s"
        )
    fault = state.fault
    held = fault is not None and _holding(fault, state.scraped_at, now, thresholds)
    fault_reasons = fault.reasons if fault is not None and held else ()
    reasons.extend(fault_reasons)
    saturated = not stale and _saturated(state, now, thresholds)
    if saturated:
        reasons.append(
            f"util ≥ {thresholds.shed_util_pct:g} % in the last {len(state.util)} samples"
        )
    return GpuVerdict(
        stale=stale,
        faulted=held,
        saturated=saturated,
        reasons=tuple(reasons),
        fault_reasons=fault_reasons,
        fault_reason=fault.reason if fault is not None and held else None,
        faulted_since=fault.since if fault is not None and held else None,
    )


def clear(state: GpuState, now: float) -> None:
    """An operator clears ``state``'s held fault.

    The sticky XID value it leaves behind does not fault again (only a change does), nor do the
    XID counts it saw (only a count above them does); other continuing evidence that is still
    there (a GPU still throttling) faults again on the next scrape.
    """
    state.fault = None
    state.cleared_xid = state.last_xid
    state.cleared_at = now
    state.cleared_counts = dict(state.xid_counts)


def upstream_saturated(verdicts: Sequence[GpuVerdict]) -> bool:
    """Whether an upstream's GPUs are all saturated; no GPUs (no ``gpu_ids``) is never saturated."""
    return bool(verdicts) and all(verdict.saturated for verdict in verdicts)


def upstream_faulted(verdicts: Sequence[GpuVerdict], thresholds: Thresholds) -> bool:
    """Whether an upstream leaves rotation: ``couple_faults`` and any of its GPUs faulted."""
    return thresholds.couple_faults and any(verdict.faulted for verdict in verdicts)


def combine(parts: Sequence[tuple[GpuKey, GpuVerdict]]) -> GpuVerdict:
    """One GPU's verdict from its rows: the whole GPU and each MIG instance.

    Faulted when any row is; saturated when a whole-GPU row is (MIG rows have no util); stale
    only when every row is (or there is none). Reasons of an instance row name the instance.
    """
    if not parts:
        return NEVER_SEEN
    reasons: list[str] = []
    fault_reasons: list[str] = []
    for key, verdict in parts:
        prefix = f"MIG {key.instance}: " if key.instance is not None else ""
        reasons.extend(prefix + reason for reason in verdict.reasons)
        fault_reasons.extend(prefix + reason for reason in verdict.fault_reasons)
    held = [verdict for _, verdict in parts if verdict.faulted_since is not None]
    first = min(held, key=lambda verdict: verdict.faulted_since or 0.0) if held else None
    return GpuVerdict(
        stale=all(verdict.stale for _, verdict in parts),
        faulted=any(verdict.faulted for _, verdict in parts),
        saturated=any(verdict.saturated for key, verdict in parts if key.instance is None),
        reasons=tuple(reasons),
        fault_reasons=tuple(fault_reasons),
        fault_reason=first.fault_reason if first else None,
        faulted_since=first.faulted_since if first else None,
    )


def parse_gpu_id(raw: str) -> int | str:
    """A GPU id as a path or an audit subject spells it: ``"0"`` → 0, ``"node-a/0"`` as it is
    (ValueError when it is neither, see :func:`gpu_key_for`)."""
    gpu_id: int | str = int(raw) if raw.isascii() and raw.isdigit() and len(raw) <= 9 else raw
    gpu_key_for(gpu_id)
    return gpu_id


def gpu_key_for(gpu_id: int | str) -> tuple[str | None, int]:
    """A configured GPU id as (host, index): ``0`` → (None, 0), ``"node-a/0"`` → ("node-a", 0).

    Host None matches any host: with one exporter, GPUs are named by index alone.
    """
    if isinstance(gpu_id, int):
        if gpu_id < 0:
            raise ValueError(f"a GPU index is >= 0, got {gpu_id}")
        return None, gpu_id
    host, slash, index = gpu_id.rpartition("/")
    if not slash or not host or not index.isascii() or not index.isdigit():
        raise ValueError(f"expected a GPU index or 'host/index', got {gpu_id!r}")
    return host, int(index)


class GpuFleetState:
    """Every GPU's state across the exporters; what the monitor feeds and routing asks."""

    __slots__ = ("_by_gpu", "_by_host", "states", "table", "thresholds")

    def __init__(self, table: XidTable, thresholds: Thresholds) -> None:
        self.table = table
        self.thresholds = thresholds
        self.states: dict[GpuKey, GpuState] = {}
        self._by_gpu: dict[int, list[GpuKey]] = {}  # index → every key of that index
        self._by_host: dict[str | None, list[GpuKey]] = {}  # host → every key of that host

    def observe_scrape(
        self, readings: Iterable[GpuReading], now: float, host: str | None = None
    ) -> None:
        """Fold in one *successful* scrape of one exporter, taken at ``now``.

        The contract: call it only with the readings of a scrape that answered, parsed and held
        at least one GPU (:func:`~gpugate.core.gpu.dcgm.require_gpus`). A failed scrape — down,
        timed out, garbage, no GPU series — is not reported at all: the rows of that exporter
        keep the time of its last successful scrape and go stale ``staleness_s`` later, and then
        nothing acts on them (fail open). Readings without any GPU change nothing either.

        ``host`` (the operator's name for the exporter) re-keys every reading; without it a
        reading's host is its ``Hostname`` label. For each host the scrape shows, every GPU seen
        before on that host with no row at all in this scrape is missing: fault evidence
        (:func:`observe_missing`), and fresh. Hosts the scrape does not show are not touched.
        """
        shown: dict[str | None, set[int]] = {}
        for reading in readings:
            key = reading.key
            if host and key.host != host:
                key = replace(key, host=host)
                reading = replace(reading, key=key)  # noqa: PLW2901 - the same reading, re-keyed
            state = self.states.get(key)
            if state is None:
                state = self.states[key] = GpuState(key)
                self._by_gpu.setdefault(key.gpu, []).append(key)
                self._by_host.setdefault(key.host, []).append(key)
            observe(state, reading, now, self.table, self.thresholds)
            shown.setdefault(key.host, set()).add(key.gpu)
        for scraped, gpus in shown.items():
            for key in self._by_host[scraped]:
                if key.gpu not in gpus:
                    observe_missing(self.states[key], now, self.thresholds)

    def verdict(self, key: GpuKey, now: float) -> GpuVerdict:
        """The verdict of one row (a GPU or a MIG instance)."""
        return assess(self.states.get(key), now, self.thresholds)

    def keys_for(self, gpu_id: int | str) -> list[GpuKey]:
        """The rows of a configured GPU id: the whole GPU and its MIG instances."""
        host, index = gpu_key_for(gpu_id)
        keys = self._by_gpu.get(index, [])
        return [key for key in keys if host is None or key.host == host]

    def verdicts_for(self, gpu_id: int | str, now: float) -> GpuVerdict:
        """A configured GPU's verdict, its MIG instances folded in (:func:`combine`)."""
        return combine([(key, self.verdict(key, now)) for key in self.keys_for(gpu_id)])

    def upstream_saturated(self, gpu_ids: Sequence[int | str], now: float) -> bool:
        return upstream_saturated([self.verdicts_for(gpu_id, now) for gpu_id in gpu_ids])

    def saturated_until(self, gpu_ids: Sequence[int | str], now: float) -> float | None:
        """Until when the upstream on ``gpu_ids`` is saturated unless a fresh sample says so
        again — when the data of one of its GPUs goes stale — or None when it is not now."""
        if not self.upstream_saturated(gpu_ids, now):
            return None
        ends = []
        for gpu_id in gpu_ids:
            rows = [self.states[key] for key in self.keys_for(gpu_id) if key.instance is None]
            saturated = [s for s in rows if _saturated_at(s, now, self.thresholds)]
            ends.append(max(_fresh_until(s, self.thresholds) for s in saturated))
        return min(ends)

    def upstream_faulted(self, gpu_ids: Sequence[int | str], now: float) -> bool:
        verdicts = [self.verdicts_for(gpu_id, now) for gpu_id in gpu_ids]
        return upstream_faulted(verdicts, self.thresholds)

    def clear(
        self, gpu_id: int | str, now: float, *, issued_at: float | None = None
    ) -> list[GpuKey]:
        """Clear the held faults of a configured GPU (all its rows); the rows that had one.

        A row missing from its exporter's scrape is forgotten, as a restart of the gateway would:
        the operator says that GPU is gone (or renumbered), so its absence is no longer evidence.
        ``issued_at`` (a clear another process took, applied here later): a row whose fault
        began after it is left alone — that fault is not the one the operator cleared.
        """
        cleared = []
        for key in self.keys_for(gpu_id):
            state = self.states[key]
            if issued_at is not None and state.fault is not None and state.fault.since >= issued_at:
                continue
            if state.fault is not None:
                cleared.append(key)
            clear(state, now)
            if state.missing_since is not None:
                self._forget(key)
        return cleared

    def _forget(self, key: GpuKey) -> None:
        del self.states[key]
        self._by_gpu[key.gpu].remove(key)
        self._by_host[key.host].remove(key)

    def __repr__(self) -> str:
        faults = sum(1 for state in self.states.values() if state.fault is not None)
        missing = sum(1 for state in self.states.values() if state.missing_since is not None)
        return f"<GpuFleetState rows={len(self.states)} with_fault={faults} missing={missing}>"


def _xid_evidence(
    state: GpuState, reading: GpuReading, now: float, table: XidTable
) -> list[Evidence]:
    found: list[Evidence] = []
    code = reading.last_xid
    if code is not None and code != state.last_xid:  # a change, or the first value seen
        if code and table.is_fatal(code):
            found.append((f"xid {code}", table.describe(code)))
        state.last_xid = code
        state.xid_changed_at = now
    counts = reading.xid_counts
    cleared = state.cleared_counts
    for xid, count in counts.items():
        if not table.is_fatal(xid):
            continue
        dismissed = cleared.get(xid)
        if dismissed is not None and count <= dismissed:
            cleared[xid] = count  # the window drains: a rise from here is a new XID
            continue
        cleared.pop(xid, None)
        window = f"{table.describe(xid)} ({count} in the exporter's count window)"
        found.append((f"xid count {xid}", window))
    for xid in [xid for xid in cleared if xid not in counts]:
        del cleared[xid]  # out of the window: whatever comes next is new
    state.xid_counts = dict(counts)
    return found


def _continuing_evidence(reading: GpuReading, thresholds: Thresholds) -> list[Evidence]:
    found: list[Evidence] = []
    mask = reading.clock_reasons
    if mask is not None:
        found += [(name, f"{name} clock event") for bit, name in _THERMAL_FAULT_BITS if mask & bit]
    temp, limit = reading.temp_c, thresholds.max_temp_c
    if temp is not None and limit is not None and temp >= limit:
        found.append(("temp", f"temperature {temp:g} °C ≥ {limit:g}"))
    if reading.row_remap_failure:
        found.append(("row remap", "row remap failure"))
    if reading.health == HEALTH_FAIL:
        watches = ", ".join(reading.health_watches)
        found.append(("health", f"DCGM health FAIL (watch {watches})"))
    return found


def _holding(fault: Fault, scraped_at: float | None, now: float, thresholds: Thresholds) -> bool:
    """Whether ``fault`` holds at ``now``, the row's newest successful scrape at ``scraped_at``:
    inside ``fault_hold_s`` after its last evidence, or that newest scrape showed the evidence
    and is fresh (a hold shorter than a poll does not release a GPU between two scrapes that
    both show the fault)."""
    if now - fault.last_evidence < thresholds.fault_hold_s:
        return True
    return (
        scraped_at is not None
        and fault.last_evidence == scraped_at
        and now - scraped_at <= thresholds.staleness_s
    )


def _hold(
    state: GpuState,
    evidence: list[Evidence],
    now: float,
    thresholds: Thresholds,
    previous: float | None,
) -> None:
    """Hold ``evidence`` seen at ``now``; ``previous`` is the row's scrape before this one."""
    fault = state.fault
    if fault is None or not _holding(fault, previous, now, thresholds):
        state.fault = Fault(tuple(dict(evidence).items()), since=now, last_evidence=now)
        return
    merged = dict(fault.evidence)
    merged.update(evidence)  # a kind seen before keeps its place and takes the newer reason
    state.fault = Fault(tuple(merged.items()), since=fault.since, last_evidence=now)


def _saturated_at(state: GpuState, now: float, thresholds: Thresholds) -> bool:
    """:func:`assess`'s ``saturated``: fresh, and the ring full at or above the threshold."""
    fresh = state.scraped_at is not None and now - state.scraped_at <= thresholds.staleness_s
    return fresh and _saturated(state, now, thresholds)


def _fresh_until(state: GpuState, thresholds: Thresholds) -> float:
    """When a saturated row's data goes stale: its newest util or scrape, whichever is older."""
    assert state.util_at is not None
    assert state.scraped_at is not None
    return min(state.util_at, state.scraped_at) + thresholds.staleness_s


def _saturated(state: GpuState, now: float, thresholds: Thresholds) -> bool:
    ring = state.util
    return (
        state.util_at is not None
        and now - state.util_at <= thresholds.staleness_s
        and len(ring) == thresholds.sustained_samples
        and all(util >= thresholds.shed_util_pct for util in ring)
    )
