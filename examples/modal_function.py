"""gpugate's reference Modal function: runs the jobs of a ``kind: modal`` runtime.

Deploy it (once per environment) and point a runtime at it::

    modal deploy examples/modal_function.py --env beta

    runtimes:
      - id: modal-beta
        kind: modal
        models: [qwen-35b]
        modal: {app: worker, function: generate, environment: beta}
    blobs: {kind: s3, s3: {bucket: gpugate-results, endpoint_url: https://<account>.r2.cloudflarestorage.com,
            region_name: auto, access_key_id_env: R2_KEY_ID, secret_access_key_env: R2_SECRET}}

The gateway spawns ``generate(payload)`` with ``{"slug", "model", "class", "operation", "input",
"result_put_url", "result_key", "deadline"}``. The function sends ``input`` (with ``model``) to
an OpenAI-compatible server in its container — vLLM, started on the container's first call and
kept while the container lives — PUTs the answer to ``result_put_url`` (a presigned URL: no
credentials here) and returns ``{"duration_s"}``, which the gateway bills at the runtime's
``budget.cents_per_second``. The gateway polls the call; nothing calls back.

Only the standard library is used besides ``modal``, so the same file runs under the tests'
SDK fake with ``INFERENCE_URL`` pointing at the simulated fleet.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.request
from typing import Any

import modal

WEIGHTS = os.environ.get("GPUGATE_MODAL_WEIGHTS", "Qwen/Qwen2.5-7B-Instruct")
PORT = 8000

app = modal.App("worker")
image = modal.Image.debian_slim(python_version="3.11").pip_install("vllm")


@app.function(image=image, gpu="A10G", timeout=900, scaledown_window=60)
def generate(payload: dict[str, Any]) -> dict[str, Any]:
    """Run one gateway job; the result goes to the presigned URL, a summary comes back."""
    started = time.monotonic()
    base = os.environ.get("INFERENCE_URL") or _local_server(payload["model"])
    body = json.dumps({**payload["input"], "model": payload["model"]}).encode()
    answer = _send("POST", f"{base}/v1/{payload['operation']}", body, job=payload["slug"])
    _send("PUT", payload["result_put_url"], answer)
    return {"duration_s": round(time.monotonic() - started, 3), "result_bytes": len(answer)}


def _send(method: str, url: str, body: bytes, *, job: str | None = None) -> bytes:
    headers = {"Content-Type": "application/json"}
    if job is not None:  # as the gateway's own upstream calls: a model server may de-duplicate
        headers["X-Gpugate-Job"] = job
    request = urllib.request.Request(  # noqa: S310 - the gateway's own URLs, http(s) only
        url, data=body, method=method, headers=headers
    )
    with urllib.request.urlopen(request, timeout=600) as response:  # noqa: S310
        return bytes(response.read())


_server: subprocess.Popen[bytes] | None = None


def _local_server(model: str) -> str:
    """vLLM in this container serving ``WEIGHTS`` as the gateway's ``model``, started once and
    kept while the container lives."""
    global _server  # noqa: PLW0603 - one server per container
    base = f"http://127.0.0.1:{PORT}"
    if _server is None:
        _server = subprocess.Popen(  # noqa: S603
            ["vllm", "serve", WEIGHTS, "--port", str(PORT), "--served-model-name", model],  # noqa: S607
        )
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{base}/health", timeout=5):  # noqa: S310
                return base
        except OSError:
            time.sleep(2)
    message = "vLLM did not become healthy within 600 s"
    raise RuntimeError(message)
