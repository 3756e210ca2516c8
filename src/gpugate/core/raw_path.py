"""``/u/{upstream}/{path}``: which requests the raw pass-through may forward, and to what path
(issue #15 finding 1). Pure: bytes and config in, a path or a refusal out.

The path sent upstream is the client's **raw** path (``scope["raw_path"]``, as it arrived, still
percent-encoded) after ``/u/{upstream}``, appended to the endpoint's base URL. It is refused
(400 ``BAD_REQUEST``) when it could mean anything but "below the base":

- a dot segment (``.`` or ``..``, also percent-encoded: ``%2e``), which a URL library or the
  upstream would resolve out of the base path;
- an encoded ``/``, ``\\``, ``?`` or ``#`` (``%2f %5c %3f %23``), which a server that decodes
  before routing reads as another path, a query or a fragment;
- a control character, a space, a non-ASCII byte or a malformed ``%`` escape.

As Envoy's ``normalize_path`` + ``path_with_escaped_slashes_action: REJECT_REQUEST`` and nginx's
``merge_slashes``/no-decode ``proxy_pass``: the gateway never rewrites a path it forwards, it
only refuses the ones whose meaning depends on who decodes them.

Who may be reached: an internal, keyless ``openai`` upstream as before (any method, any path),
unless its config has a ``raw:`` block, which then holds it to its methods and path prefixes. An
``azure-di``, ``external`` or keyed upstream only when its config opts in with ``raw:``; and the
upstream's key is added only with ``raw.send_key: true``.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from gpugate.errors import BadRequest, RawForbidden

if TYPE_CHECKING:
    from gpugate.config import UpstreamConfig

PREFIX = b"/u/"
_ESCAPE = re.compile(rb"%(?![0-9A-Fa-f]{2})")  # a '%' not followed by two hex digits
_FORBIDDEN_ESCAPES = re.compile(rb"%(2[fF]|5[cC]|3[fF]|23)")
_UNSAFE_BYTES = re.compile(rb"[^\x21-\x7e]")  # controls, space, DEL, non-ASCII
_DOT = re.compile(rb"(\.|%2[eE])+")


def split(raw_path: bytes) -> tuple[str, str]:
    """``/u/{upstream}/{rest}`` (raw, percent-encoded) → the upstream id and the path to send
    below its base (``/`` + rest), or :class:`BadRequest` naming what is wrong."""
    assert raw_path.startswith(PREFIX)
    upstream, _, rest = raw_path[len(PREFIX) :].partition(b"/")
    if not upstream or _UNSAFE_BYTES.search(upstream) or b"%" in upstream:
        raise BadRequest("/u/ needs an upstream id: /u/{upstream_id}/{path}")
    return upstream.decode("ascii"), check_path(b"/" + rest)


def check_path(path: bytes) -> str:
    """The raw path to append to the upstream's base URL, or :class:`BadRequest`."""
    if _UNSAFE_BYTES.search(path):
        raise BadRequest("the /u/ path holds a space, a control character or a non-ASCII byte")
    if _ESCAPE.search(path):
        raise BadRequest("the /u/ path holds a '%' that is not a percent-escape")
    if _FORBIDDEN_ESCAPES.search(path):
        raise BadRequest(
            "the /u/ path holds an encoded '/', '\\', '?' or '#' (%2F %5C %3F %23): refused,"
            " since the upstream may decode it into another path"
        )
    if any(_DOT.fullmatch(segment) for segment in path.split(b"/")):
        raise BadRequest(
            "the /u/ path holds a dot segment ('.' or '..'): a /u/ request stays below the"
            " upstream's base path"
        )
    return path.decode("ascii")


def needs_opt_in(upstream: UpstreamConfig) -> bool:
    """Whether ``/u/`` reaches this upstream only through its ``raw:`` opt-in."""
    return upstream.kind != "openai" or upstream.external or upstream.api_key_env is not None


def check_allowed(upstream: UpstreamConfig, method: str, path: str) -> None:
    """Refuse (403 ``RAW_FORBIDDEN``) what the upstream's ``raw:`` does not allow; ``path`` is
    :func:`check_path`'s result (its query, if any, is not part of the prefix match). An
    upstream with a ``raw:`` block is held to it, whatever its kind; one without it is reached
    only when it needs no opt-in (:func:`needs_opt_in`)."""
    raw = upstream.raw
    if raw is None:
        if not needs_opt_in(upstream):
            return
        why = (
            "an azure-di upstream"
            if upstream.kind != "openai"
            else "an external upstream"
            if upstream.external
            else "an upstream with a key"
        )
        raise RawForbidden(
            f"/u/{upstream.id}/ is not served: {why} is reached through /u/ only when its"
            " config opts in with raw: {methods, path_prefixes}"
        )
    if method not in raw.methods:
        raise RawForbidden(f"/u/{upstream.id}/ does not allow {method} (raw.methods)")
    below = path.partition("?")[0]
    if not any(below.startswith(prefix) for prefix in raw.path_prefixes):
        raise RawForbidden(f"/u/{upstream.id}/ does not serve this path (raw.path_prefixes)")


def sends_key(upstream: UpstreamConfig) -> bool:
    """Whether a ``/u/`` request to this upstream carries the upstream's key."""
    return upstream.raw is not None and upstream.raw.send_key
