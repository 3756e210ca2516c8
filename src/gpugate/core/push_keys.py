"""Who sent a worker route's request: the keys of the push runtimes, and the nonces seen.

A push runtime with ``push.auth: signed`` (the default) is known by its two derived keys
(:mod:`gpugate.push_signature`): a report must be signed with its worker-to-gateway key, within
the time window, with a nonce this process has not seen (:class:`~gpugate.push_signature.
NonceCache`), and the answer is signed with its gateway-to-worker key. A runtime with
``push.auth: bearer`` (a wave-1 worker) is known by its secret as a bearer token, compared in
constant time — and only such a runtime: a signed runtime's secret as a bearer is refused.

Replays across replicas: each process keeps its own nonces, so a report replayed to another
replica within the window passes this check — and then meets the lease-token fencing of every
write (DESIGN §5): a report already applied is stale there (409), and one not yet applied is the
worker's own report. Keeping the nonces in the store instead would cost a write per report.
"""

from __future__ import annotations

import hmac

from gpugate import push_signature
from gpugate.errors import Unauthorized


class PushKeys:
    """The credentials of every push runtime; see the module docstring."""

    def __init__(self, *, window_s: float = push_signature.WINDOW_S) -> None:
        self._window_s = window_s
        self._signed: dict[str, tuple[bytes, bytes]] = {}  # runtime -> (from worker, to worker)
        self._bearer: dict[str, bytes] = {}
        self.nonces = push_signature.NonceCache(window_s=window_s)

    def set(self, runtime_id: str, secret: str, *, auth: str) -> None:
        """Runtime ``runtime_id`` authenticates with ``secret`` the ``auth`` way from now on."""
        self._signed.pop(runtime_id, None)
        self._bearer.pop(runtime_id, None)
        if not secret:
            return
        if auth == "bearer":
            self._bearer[runtime_id] = secret.encode()
            return
        self._signed[runtime_id] = (
            push_signature.derive_key(secret, push_signature.WORKER_TO_GATEWAY),
            push_signature.derive_key(secret, push_signature.GATEWAY_TO_WORKER),
        )

    def authenticate(
        self,
        signature: str | None,
        authorization: str | None,
        *,
        method: str,
        target: str,
        body: bytes,
        lease_token: str | None,
        now: float,
    ) -> tuple[frozenset[str], str | None]:
        """The runtimes that sent this request, and its nonce (None for a bearer request,
        whose answer is not signed); :class:`Unauthorized` otherwise."""
        if signature is not None:
            hint = push_signature.key_hint(signature)
            if hint in self._signed:  # one HMAC instead of one per runtime
                keys = [(hint, self._signed[hint][0])]
            else:
                keys = [(runtime, pair[0]) for runtime, pair in self._signed.items()]
            try:
                runtimes, signed = push_signature.verify_request(
                    keys,
                    push_signature.WORKER_TO_GATEWAY,
                    signature,
                    method=method,
                    target=target,
                    body=body,
                    lease_token=lease_token,
                    now=now,
                    window_s=self._window_s,
                )
            except push_signature.BadSignature as exc:
                raise Unauthorized(f"the report's signature does not hold: {exc}") from exc
            if not self.nonces.admit(signed, now):
                raise Unauthorized("a replayed report: its nonce was seen already")
            return self._sharing(runtimes), signed.nonce
        return self._bearer_runtimes(authorization), None

    def _sharing(self, runtimes: frozenset[str]) -> frozenset[str]:
        """``runtimes`` and every runtime with the same key (runtimes sharing a secret)."""
        keys = {self._signed[runtime][0] for runtime in runtimes}
        return frozenset(r for r, (key, _) in self._signed.items() if key in keys)

    def sign_answer(self, runtimes: frozenset[str], nonce: str, status: int, body: bytes) -> str:
        """The gateway's signature of its answer to the signed request with ``nonce``."""
        _, to_worker = self._signed[min(runtimes)]
        return push_signature.sign_response(
            to_worker,
            push_signature.GATEWAY_TO_WORKER,
            request_nonce=nonce,
            status=status,
            body=body,
        )

    def _bearer_runtimes(self, authorization: str | None) -> frozenset[str]:
        scheme, _, offered = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not offered:
            raise Unauthorized(
                f"a push worker signs its reports ({push_signature.HEADER}); a worker of a "
                "push.auth: bearer runtime sends Authorization: Bearer <secret>"
            )
        offered_bytes = offered.strip().encode()
        # Every secret is compared, so the time taken does not tell which one came close.
        matches = {
            runtime
            for runtime, secret in self._bearer.items()
            if hmac.compare_digest(offered_bytes, secret)
        }
        if not matches:
            raise Unauthorized("the secret is not that of any push.auth: bearer runtime")
        return frozenset(matches)

    def __repr__(self) -> str:
        return f"<PushKeys signed={sorted(self._signed)} bearer={sorted(self._bearer)}>"
