"""dcgm-exporter samples → one :class:`GpuReading` per GPU and per MIG instance. Pure.

What a scrape holds, and how it is read (``shared/reference/dcgm-semantics.md``):

* A GPU is any ``DCGM_*`` sample with a ``gpu`` index label, keyed by host, index and, under MIG,
  the GPU instance (``GPU_I_ID``): every MIG row carries its parent's ``gpu`` and ``UUID``, so
  those are not unique. The host is the ``Hostname`` label (``hostname`` from dcgm-exporter HEAD
  on), or the operator's name for the exporter when given. Samples without a ``gpu`` label (e.g.
  Datadog's unlabeled dummies) and non-DCGM families (a vLLM ``/metrics``) belong to no GPU.
* A series that is absent is *unknown* (None), never 0: most exporters print no XID series at
  all, MIG rows have no ``DCGM_FI_DEV_GPU_UTIL``. DCGM's blank sentinels (int ≥
  0x7ffffffffffffff0, double ≥ 2**47), NaN and infinities are missing values too.
* ``DCGM_FI_DEV_XID_ERRORS`` is the *last* XID code (sticky), not a count. The opt-in
  ``DCGM_EXP_XID_ERRORS_COUNT{xid="N"}`` counts XIDs per code in a sliding window; its zero
  series without an ``xid`` label says "none in the window" and adds nothing.
* Clock-event reasons are one bitmask, under the current name or the deprecated one.
* ``DCGM_EXP_GPU_HEALTH_STATUS`` is one series per health watch: 0 PASS, 10 WARN, 20 FAIL; the
  reading keeps the worst and the watches that reported it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol

from gpugate.errors import NoGpuSeries

INT64_BLANK = 0x7FFFFFFFFFFFFFF0
"""DCGM_INT64_BLANK; +1 NOT_FOUND, +2 NOT_SUPPORTED, +3 NOT_PERMISSIONED."""
FP64_BLANK = 2.0**47
"""DCGM_FP64_BLANK (140737488355328.0); smaller than INT64_BLANK, so one bound covers both."""

GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"
GPU_TEMP = "DCGM_FI_DEV_GPU_TEMP"
XID_ERRORS = ("DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_XID_ERROR")  # DCGM 4.6 renamed the field
XID_ERRORS_COUNT = "DCGM_EXP_XID_ERRORS_COUNT"
CLOCK_EVENT_REASONS = ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS")
ROW_REMAP_FAILURE = "DCGM_FI_DEV_ROW_REMAP_FAILURE"
GPU_HEALTH_STATUS = "DCGM_EXP_GPU_HEALTH_STATUS"

HEALTH_PASS, HEALTH_WARN, HEALTH_FAIL = 0, 10, 20
HEALTH_NAMES = MappingProxyType({HEALTH_PASS: "PASS", HEALTH_WARN: "WARN", HEALTH_FAIL: "FAIL"})

_HOST_LABELS = ("Hostname", "hostname")
_MAX_INDEX_DIGITS = 9  # of a GPU index, instance id or XID code; int() refuses 4301 digits
_K8S_LABELS = ("pod", "namespace", "container")


class Sample(Protocol):
    """What this module reads of a sample (:class:`gpugate.adapters.exposition.Sample` is one)."""

    @property
    def name(self) -> str: ...
    @property
    def labels(self) -> Mapping[str, str]: ...
    @property
    def value(self) -> float: ...


@dataclass(frozen=True, slots=True)
class GpuKey:
    """One GPU, or one MIG instance of it (``instance`` = its ``GPU_I_ID``)."""

    host: str | None
    gpu: int
    instance: str | None = None

    @property
    def sort_key(self) -> tuple[str, int, int, str]:
        """Host, index, then the whole GPU before its instances in numeric order."""
        instance = self.instance
        if instance is None:
            return (self.host or "", self.gpu, -1, "")
        number = _index(instance)
        if number is None:
            number = 1 << 31  # a GPU_I_ID that is not a number sorts after those that are
        return (self.host or "", self.gpu, number, instance)

    def __str__(self) -> str:
        where = f"{self.host}/{self.gpu}" if self.host else str(self.gpu)
        return where if self.instance is None else f"{where} MIG {self.instance}"


@dataclass(frozen=True, slots=True)
class GpuReading:
    """What one scrape says about one GPU (or MIG instance). None = the series is absent."""

    key: GpuKey
    uuid: str | None = None
    model: str | None = None
    profile: str | None = None  # GPU_I_PROFILE of a MIG instance, e.g. "1g.5gb"
    util_pct: float | None = None
    temp_c: float | None = None
    last_xid: int | None = None
    xid_counts: Mapping[int, int] = field(default_factory=lambda: MappingProxyType({}))
    clock_reasons: int | None = None
    row_remap_failure: bool | None = None
    health: int | None = None  # the worst DCGM health watch result: 0, 10 or 20
    health_watches: tuple[str, ...] = ()  # the watches reporting that worst result
    pod: str | None = None
    namespace: str | None = None
    container: str | None = None


def is_blank(value: float) -> bool:
    """Whether ``value`` is no value: a DCGM blank sentinel, NaN or an infinity.

    Every field read here (util, temperature, XID code, bitmask, flags) is far below 2**47, so
    anything at or beyond it (either sign) is treated as a sentinel.
    """
    return not -FP64_BLANK < value < FP64_BLANK


def readings(samples: Iterable[Sample], *, host: str | None = None) -> list[GpuReading]:
    """One reading per GPU and MIG instance in ``samples``, sorted by key.

    ``host`` (the operator's name for this exporter) replaces the host label when given (an
    empty name is none); otherwise the host is the ``Hostname``/``hostname`` label, or None
    when neither is there.
    """
    builders: dict[tuple[str | None, int, str | None], _Builder] = {}
    # A scrape repeats one label set for every series of a GPU, and the exposition parser hands
    # out one shared mapping per label set: the GPU a mapping names is worked out once per call.
    # Keyed by id, each entry holding its mapping alive, so no id is reused during the call.
    by_labels: dict[int, tuple[Mapping[str, str], _Builder | None]] = {}
    for sample in samples:
        name = sample.name
        if not name.startswith("DCGM_"):
            continue
        labels = sample.labels
        known = by_labels.get(id(labels))
        if known is None:
            known = by_labels[id(labels)] = (labels, _builder_for(builders, labels, host))
        builder = known[1]
        if builder is not None:
            take = _TAKE.get(name)
            if take is not None:
                take(builder, labels, sample.value)
    found = [builder.build(GpuKey(*where)) for where, builder in builders.items()]
    found.sort(key=lambda reading: reading.key.sort_key)
    return found


def _builder_for(
    builders: dict[tuple[str | None, int, str | None], _Builder],
    labels: Mapping[str, str],
    host: str | None,
) -> _Builder | None:
    """The builder of the GPU (or MIG instance) these labels name; None without a ``gpu`` index."""
    gpu = _index(labels.get("gpu"))
    if gpu is None:
        return None
    where = (host or _host(labels), gpu, labels.get("GPU_I_ID") or None)
    builder = builders.get(where)
    if builder is None:
        builder = builders[where] = _Builder(labels)
    return builder


def require_gpus(found: Sequence[GpuReading]) -> Sequence[GpuReading]:
    """``found``, or :class:`~gpugate.errors.NoGpuSeries` when a scrape held no GPU at all.

    A monitor counts that as a failed scrape: the body parsed (an empty page, another
    service's ``/metrics``) but says nothing about any GPU, so it must not refresh anything.
    """
    if not found:
        raise NoGpuSeries
    return found


class _Builder:
    """The values gathered for one key while walking a scrape."""

    __slots__ = (
        "clock",
        "counts",
        "health",
        "labels",
        "row_remap",
        "temp",
        "util",
        "watches",
        "xid",
    )

    def __init__(self, labels: Mapping[str, str]) -> None:
        self.labels = labels  # of the key's first sample: uuid, model, profile, k8s
        self.util: float | None = None
        self.temp: float | None = None
        self.xid: int | None = None
        self.counts: dict[int, int] = {}
        self.clock: int | None = None
        self.row_remap: bool | None = None
        self.health: int | None = None
        self.watches: list[str] = []

    # One method per series read: _TAKE, after the class, is the list of what a reading is made of.
    def take_util(self, _: Mapping[str, str], value: float) -> None:
        self.util = _measure(value)

    def take_temp(self, _: Mapping[str, str], value: float) -> None:
        self.temp = _measure(value)

    def take_xid(self, _: Mapping[str, str], value: float) -> None:
        self.xid = _code(value)

    def take_xid_count(self, labels: Mapping[str, str], value: float) -> None:
        xid, count = _index(labels.get("xid")), _code(value)
        if xid is not None and count is not None:
            self.counts[xid] = max(count, self.counts.get(xid, 0))

    def take_clock(self, _: Mapping[str, str], value: float) -> None:
        mask = _code(value)
        if mask is not None:  # both names are one field: OR them if both are printed
            self.clock = mask if self.clock is None else self.clock | mask

    def take_row_remap(self, _: Mapping[str, str], value: float) -> None:
        flag = _code(value)
        self.row_remap = {0: False, 1: True}.get(flag) if flag is not None else None

    def take_health(self, labels: Mapping[str, str], value: float) -> None:
        self._health(labels.get("health_watch") or "?", _code(value))

    def _health(self, watch: str, result: int | None) -> None:
        if result is None or result not in HEALTH_NAMES:
            return
        if self.health is None or result > self.health:
            self.health, self.watches = result, [watch]
        elif result == self.health and watch not in self.watches:
            self.watches.append(watch)

    def build(self, key: GpuKey) -> GpuReading:
        labels = self.labels
        pod, namespace, container = (labels.get(name) or None for name in _K8S_LABELS)
        return GpuReading(
            key=key,
            uuid=labels.get("UUID") or labels.get("uuid") or None,
            model=labels.get("modelName") or None,
            profile=labels.get("GPU_I_PROFILE") or None,
            util_pct=self.util,
            temp_c=self.temp,
            last_xid=self.xid,
            xid_counts=MappingProxyType({x: n for x, n in sorted(self.counts.items()) if n > 0}),
            clock_reasons=self.clock,
            row_remap_failure=self.row_remap,
            health=self.health,
            health_watches=tuple(sorted(self.watches)),
            pod=pod,
            namespace=namespace,
            container=container,
        )


_TAKE: Mapping[str, Callable[[_Builder, Mapping[str, str], float], None]] = MappingProxyType(
    {
        GPU_UTIL: _Builder.take_util,
        GPU_TEMP: _Builder.take_temp,
        **dict.fromkeys(XID_ERRORS, _Builder.take_xid),
        XID_ERRORS_COUNT: _Builder.take_xid_count,
        **dict.fromkeys(CLOCK_EVENT_REASONS, _Builder.take_clock),
        ROW_REMAP_FAILURE: _Builder.take_row_remap,
        GPU_HEALTH_STATUS: _Builder.take_health,
    }
)
"""The series a reading is made of, by name, and how each is taken into a :class:`_Builder`."""


def _host(labels: Mapping[str, str]) -> str | None:
    for name in _HOST_LABELS:
        value = labels.get(name)
        if value:
            return value
    return None


def _index(label: str | None) -> int | None:
    """A non-negative decimal label value (``gpu``, ``xid``) as an int, else None."""
    if label is None or not 0 < len(label) <= _MAX_INDEX_DIGITS:
        return None
    if not label.isascii() or not label.isdigit():
        return None
    return int(label)


def _measure(value: float) -> float | None:
    return None if is_blank(value) else float(value)


def _code(value: float) -> int | None:
    """A non-negative whole number (XID code, bitmask, flag, count), else None."""
    if is_blank(value) or value < 0 or not float(value).is_integer():
        return None
    return int(value)
