"""The cross-field rules: what no single block can check on its own.

The rules read the document as plain data, before (and whatever) pydantic makes of it, so a
file with a wrong type in one place and a chain naming a missing runtime in another reports
both. Every rule tolerates garbage: where the data is too broken to judge, it says nothing and
leaves the complaint to the schema.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from gpugate.config.paths import Finding, KeyPath, describe, format_path, quoted_list

IMPLIED_RUNTIME_ID = "local"
_HOST_INDEX = re.compile(r"([^/\s]+)/(\d+)")
_KINDS_WITH_OWN_MODELS = ("push", "modal")


def resolve_implied(doc: Mapping[str, Any]) -> dict[str, Any]:
    """``doc`` with the keys implied by others: the ``local`` runtime, the chain, the default.

    No runtimes → ``[{id: local, kind: upstream}]``; no ``fallback_chain`` → every runtime id in
    order; no ``default_runtime`` → the first chain entry.
    """
    out = dict(doc)
    runtimes = out.get("runtimes")
    if runtimes is None or (isinstance(runtimes, list) and not runtimes):
        runtimes = out["runtimes"] = [{"id": IMPLIED_RUNTIME_ID, "kind": "upstream"}]
    ids = _ids(runtimes) if isinstance(runtimes, list) else []
    if out.get("fallback_chain") is None and isinstance(runtimes, list):
        out["fallback_chain"] = list(dict.fromkeys(ids))
    if out.get("default_runtime") is None:
        chain = out.get("fallback_chain")
        first = chain[0] if isinstance(chain, list) and chain else None
        if isinstance(first, str):
            out["default_runtime"] = first
        elif ids:
            out["default_runtime"] = ids[0]
    return out


def rule_findings(doc: Mapping[str, Any], *, default_implied: bool = False) -> list[Finding]:
    """Every cross-field problem of a document whose implied keys are resolved.

    ``default_implied``: ``default_runtime`` was not given but taken from the chain, so a bad
    value is the chain's problem, reported there once.
    """
    upstreams = doc.get("upstreams")
    runtimes = doc.get("runtimes")
    findings = _gpu_health_findings(doc.get("gpu_health"))
    findings += _admin_listen_findings(doc.get("listen"), doc.get("admin_listen"))
    if isinstance(upstreams, list):
        findings += _upstream_findings(upstreams)
        if isinstance(doc.get("models"), list):
            findings += _model_findings(doc["models"])
        findings += _gpu_id_findings(upstreams, doc.get("gpu_health"))
    if isinstance(runtimes, list):
        findings += _runtime_findings(runtimes, _served_models(upstreams))
        defined = _defined_ids(runtimes)
        if defined is not None:
            default = None if default_implied else doc.get("default_runtime")
            findings += _chain_findings(doc.get("fallback_chain"), default, defined)
    return findings


def _admin_listen_findings(listen: Any, admin_listen: Any) -> list[Finding]:
    """``admin_listen`` needs a port of its own: requests are told apart by the port they came
    in on."""
    if not (isinstance(listen, str) and isinstance(admin_listen, str)):
        return []
    port, admin_port = listen.rpartition(":")[2], admin_listen.rpartition(":")[2]
    if port != admin_port or port == "0":
        return []
    return [Finding(("admin_listen",), f"needs another port than listen ({listen})")]


def _ids(items: list[Any]) -> list[str]:
    found = (_id_of(item) for item in items)
    return [item_id for item_id in found if isinstance(item_id, str)]


def _id_of(item: Any) -> Any:
    return item.get("id") if isinstance(item, Mapping) else getattr(item, "id", None)


def _mappings(items: list[Any]) -> list[tuple[int, Mapping[str, Any]]]:
    return [(index, item) for index, item in enumerate(items) if isinstance(item, Mapping)]


def _duplicates(
    items: list[Any], path: KeyPath, message: Callable[[str, str], str], suffix: KeyPath = ()
) -> list[Finding]:
    """A finding at each string of ``items`` repeating an earlier one: ``message(it, where)``."""
    first: dict[str, int] = {}
    findings = []
    for index, item in enumerate(items):
        if not isinstance(item, str):
            continue
        if item in first:
            earlier = format_path((*path, first[item], *suffix))
            findings.append(Finding((*path, index, *suffix), message(item, earlier)))
        else:
            first[item] = index
    return findings


def _keys_of(items: list[Any], key: str) -> list[Any]:
    return [item.get(key) if isinstance(item, Mapping) else None for item in items]


def _upstream_findings(upstreams: list[Any]) -> list[Finding]:
    findings = _duplicates(
        _keys_of(upstreams, "id"),
        ("upstreams",),
        lambda name, at: f"upstream id '{name}' is defined twice (first at {at})",
        ("id",),
    )
    for index, upstream in _mappings(upstreams):
        path = ("upstreams", index)
        has_url, has_urls = upstream.get("url") is not None, upstream.get("urls") is not None
        if has_url and has_urls:
            findings.append(Finding((*path, "urls"), "give url or urls, not both"))
        elif not has_url and not has_urls:
            findings.append(
                Finding((*path, "url"), "required key is missing: give url, or urls for several")
            )
        for key in ("models", "urls"):
            if isinstance(upstream.get(key), list):
                findings += _duplicates(upstream[key], (*path, key), _listed_twice)
    return findings + _azure_di_findings(upstreams)


def _model_findings(models: list[Any]) -> list[Finding]:
    """``models[]``: each name once, and no fallback listed twice or naming the model itself."""
    findings = _duplicates(
        _keys_of(models, "name"),
        ("models",),
        lambda name, at: f"model '{name}' is listed twice (first at {at})",
        ("name",),
    )
    for index, entry in _mappings(models):
        for key in ("fallbacks", "context_fallbacks"):
            if isinstance(entry.get(key), list):
                findings += _duplicates(entry[key], ("models", index, key), _listed_twice)
    itself = [(path, target) for path, target, name in _fallbacks(models) if target == name]
    return findings + [Finding(path, f"'{target}' is the model itself") for path, target in itself]


def unserved_fallbacks(doc: Mapping[str, Any]) -> list[Finding]:
    """Each fallback (``models[].fallbacks``, ``context_fallbacks``) no upstream serves.

    A warning, not an error: a config import may add its upstream later, and until then the
    walk passes over it as over a model that is out of rotation (DESIGN §2a's example names
    fallbacks its own upstreams do not serve).
    """
    models, served = doc.get("models"), _served_models(doc.get("upstreams"))
    if not isinstance(models, list) or served is None:
        return []
    known = quoted_list(sorted(served))
    return [
        Finding(path, f"no upstream serves model '{target}' (served: {known}); the walk skips it")
        for path, target, name in _fallbacks(models)
        if target != name and target not in served
    ]


def _fallbacks(models: list[Any]) -> Iterator[tuple[KeyPath, str, Any]]:
    """Every fallback named in ``models[]``: its key path, the model it names, whose it is."""
    for index, entry in _mappings(models):
        for key in ("fallbacks", "context_fallbacks"):
            targets = entry.get(key)
            if isinstance(targets, list):
                for position, target in enumerate(targets):
                    if isinstance(target, str):
                        yield ("models", index, key, position), target, entry.get("name")


def _azure_di_findings(upstreams: list[Any]) -> list[Finding]:
    """An ``azure-di`` upstream is one external Azure resource (one URL: its polls must come
    back to the resource that took the analyze), and each DI model id has one such upstream."""
    findings = []
    owner: dict[str, str] = {}
    for index, upstream in _mappings(upstreams):
        if upstream.get("kind") != "azure-di":
            continue
        path = ("upstreams", index)
        if upstream.get("external") is False:
            findings.append(
                Finding((*path, "external"), "an azure-di upstream is a third-party service")
            )
        if upstream.get("gpu_ids"):
            message = "an azure-di upstream runs on no GPU of ours: it takes no gpu_ids"
            findings.append(Finding((*path, "gpu_ids"), message))
        urls = upstream.get("urls")
        if isinstance(urls, list) and len(urls) > 1:
            message = "an azure-di upstream is one resource: give one url (polls return to it)"
            findings.append(Finding((*path, "urls"), message))
        models = upstream.get("models")
        for position, model in enumerate(models if isinstance(models, list) else []):
            if not isinstance(model, str):
                continue
            if model in owner:
                message = f"DI model '{model}' is served by azure-di upstream '{owner[model]}'"
                findings.append(Finding((*path, "models", position), message))
            else:
                owner[model] = str(upstream.get("id"))
    return findings


def _gpu_health_findings(gpu_health: Any) -> list[Finding]:
    if not isinstance(gpu_health, Mapping):
        return []
    findings = []
    exporters = gpu_health.get("exporters")
    if gpu_health.get("dcgm_url") and isinstance(exporters, list) and exporters:
        findings.append(
            Finding(
                ("gpu_health", "exporters"),
                "give dcgm_url (one exporter) or exporters (several hosts), not both",
            )
        )
    if isinstance(exporters, list):
        findings += _duplicates(
            _keys_of(exporters, "host"),
            ("gpu_health", "exporters"),
            lambda host, at: f"host '{host}' has an exporter already (at {at})",
            ("host",),
        )
    return findings


def _served_models(upstreams: Any) -> set[str] | None:
    """Every model the upstreams serve, or ``None`` when the upstreams are too broken to tell."""
    if not isinstance(upstreams, list):
        return None
    served: set[str] = set()
    for upstream in upstreams:
        models = upstream.get("models") if isinstance(upstream, Mapping) else None
        if not isinstance(models, list):
            return None
        if upstream.get("kind") == "azure-di":  # DI model ids are not job models
            continue
        served.update(model for model in models if isinstance(model, str))
    return served


def _runtime_findings(runtimes: list[Any], served: set[str] | None) -> list[Finding]:
    findings = _duplicates(
        _keys_of(runtimes, "id"),
        ("runtimes",),
        lambda name, at: f"runtime id '{name}' is defined twice (first at {at})",
        ("id",),
    )
    for index, runtime in _mappings(runtimes):
        kind, models = runtime.get("kind"), runtime.get("models")
        path = ("runtimes", index, "models")
        if kind in _KINDS_WITH_OWN_MODELS and (models is None or models == []):
            message = f"a {kind} runtime needs at least one model: it serves only those listed"
            findings.append(Finding(path, message))
        if isinstance(models, list):
            findings += _duplicates(models, path, _listed_twice)
        if kind == "upstream" and isinstance(models, list) and served is not None:
            findings += [
                Finding(
                    (*path, position),
                    f"model '{model}' is not served by any upstream"
                    f" (served: {quoted_list(sorted(served))})",
                )
                for position, model in enumerate(models)
                if isinstance(model, str) and model not in served
            ]
    return findings


def _defined_ids(runtimes: list[Any]) -> list[str] | None:
    """The runtime ids, or ``None`` when some runtime's id is unreadable (so nothing is judged)."""
    ids = _keys_of(runtimes, "id")
    if not all(isinstance(runtime_id, str) for runtime_id in ids):
        return None
    return list(dict.fromkeys(ids))


def _chain_findings(chain: Any, default: Any, defined: list[str]) -> list[Finding]:
    def unknown(name: str) -> str:
        return f"names runtime '{name}', which is not defined (defined: {quoted_list(defined)})"

    findings = []
    if isinstance(chain, list):
        findings += _duplicates(
            chain,
            ("fallback_chain",),
            lambda name, at: f"names runtime '{name}' again (first at {at})",
        )
        findings += [
            Finding(("fallback_chain", index), unknown(name))
            for index, name in enumerate(chain)
            if isinstance(name, str) and name not in defined
        ]
    if isinstance(default, str) and default not in defined:
        findings.append(Finding(("default_runtime",), unknown(default)))
    return findings


def _gpu_id_findings(upstreams: list[Any], gpu_health: Any) -> list[Finding]:
    check = _gpu_id_check(gpu_health)
    findings = []
    for index, upstream in _mappings(upstreams):
        gpu_ids = upstream.get("gpu_ids")
        if not isinstance(gpu_ids, list):
            continue
        for position, gpu_id in enumerate(gpu_ids):
            if isinstance(gpu_id, int | str) and not isinstance(gpu_id, bool):
                message = check(gpu_id)
                if message:
                    findings.append(Finding(("upstreams", index, "gpu_ids", position), message))
    return findings


def _listed_twice(value: str, at: str) -> str:
    return f"'{value}' is listed twice (first at {at})"


def _gpu_id_check(gpu_health: Any) -> Callable[[int | str], str | None]:
    """How ``gpu_ids`` are checked: by index (``dcgm_url``), by host (``exporters``), or either."""
    section = gpu_health if isinstance(gpu_health, Mapping) else {}
    exporters = section.get("exporters")
    exporters = exporters if isinstance(exporters, list) else []
    if section.get("dcgm_url") and not exporters:
        return _index_check
    if exporters and not section.get("dcgm_url"):
        hosts = [host for host in _keys_of(exporters, "host") if isinstance(host, str)]
        return lambda gpu_id: _host_check(gpu_id, hosts)
    return _either_check


def _index_check(gpu_id: int | str) -> str | None:
    if isinstance(gpu_id, int) and gpu_id >= 0:
        return None
    return (
        "expected a GPU index (an integer >= 0) because gpu_health.dcgm_url names a single"
        f" exporter, got {describe(gpu_id)}"
    )


def _host_check(gpu_id: int | str, hosts: list[str]) -> str | None:
    match = _HOST_INDEX.fullmatch(gpu_id) if isinstance(gpu_id, str) else None
    if match is None:
        example = f"{hosts[0] if hosts else 'node-a'}/0"
        return (
            f"expected 'host/index' (e.g. '{example}') because gpu_health.exporters names"
            f" several hosts, got {describe(gpu_id)}"
        )
    if match.group(1) not in hosts:
        return f"names host '{match.group(1)}', which has no exporter (hosts: {quoted_list(hosts)})"
    return None


def _either_check(gpu_id: int | str) -> str | None:
    if isinstance(gpu_id, int) and gpu_id >= 0:
        return None
    if isinstance(gpu_id, str) and _HOST_INDEX.fullmatch(gpu_id):
        return None
    return f"expected a GPU index (an integer >= 0) or 'host/index', got {describe(gpu_id)}"
