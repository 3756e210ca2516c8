"""Where large job results live: a :class:`BlobStore` — a local directory by default, or an
S3-compatible bucket (:mod:`gpugate.adapters.s3_blobs`).

Keys are relative paths of ``[A-Za-z0-9._-]`` segments (``results/<slug>/<call>.json``), so a key
can never leave the store's directory or prefix. ``presign_put`` / ``presign_get`` hand a
serverless call URLs to write and read one blob without credentials; only the S3 store has them
(a local directory is not reachable from someone else's cloud), ``presigns`` says which.
"""

from __future__ import annotations

import asyncio
import os
import re
import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

from gpugate.config import BlobsConfig
from gpugate.errors import BlobError, BlobNotFound

_SEGMENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def check_key(key: str) -> str:
    """``key`` if it is a relative path of safe segments; :class:`BlobError` otherwise."""
    parts = key.split("/")
    if not key or not all(_SEGMENT.fullmatch(part) and part not in {".", ".."} for part in parts):
        raise BlobError(f"invalid blob key {key!r}: relative segments of [A-Za-z0-9._-] only")
    return key


class BlobStore(Protocol):
    """Bytes under keys; see the module docstring."""

    @property
    def presigns(self) -> bool:
        """Whether :meth:`presign_put` and :meth:`presign_get` work."""
        ...

    async def put(self, key: str, data: bytes, *, content_type: str) -> None:
        """Store ``data`` under ``key``, replacing what was there."""
        ...

    async def get(self, key: str) -> bytes:
        """The blob; :class:`BlobNotFound` if there is none."""
        ...

    async def delete(self, key: str) -> None:
        """Remove the blob; harmless if there is none."""
        ...

    async def presign_put(self, key: str, *, expires_s: float, content_type: str) -> str:
        """A URL that accepts one ``PUT`` of the blob, without credentials, for ``expires_s``."""
        ...

    async def presign_get(self, key: str, *, expires_s: float) -> str:
        """A URL that answers ``GET`` with the blob, without credentials, for ``expires_s``."""
        ...

    async def close(self) -> None:
        """Release what the store holds open."""
        ...


class LocalBlobs:
    """Blobs as files under one directory; writes are atomic (a temporary file, then rename)."""

    presigns = False

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self._root = Path(directory)

    @property
    def root(self) -> Path:
        return self._root

    async def put(self, key: str, data: bytes, *, content_type: str) -> None:  # noqa: ARG002
        await asyncio.to_thread(self._write, self._path(key), data)

    async def get(self, key: str) -> bytes:
        path = self._path(key)
        try:
            return await asyncio.to_thread(path.read_bytes)
        except FileNotFoundError:
            raise BlobNotFound(f"no blob {key!r}") from None
        except OSError as exc:
            raise BlobError(f"blob {key!r} could not be read: {exc}") from exc

    async def delete(self, key: str) -> None:
        await asyncio.to_thread(self._path(key).unlink, missing_ok=True)

    async def presign_put(self, key: str, *, expires_s: float, content_type: str) -> str:  # noqa: ARG002
        raise _no_presigning(key)

    async def presign_get(self, key: str, *, expires_s: float) -> str:  # noqa: ARG002
        raise _no_presigning(key)

    async def close(self) -> None:
        return None

    def _path(self, key: str) -> Path:
        return self._root.joinpath(*check_key(key).split("/"))

    @staticmethod
    def _write(path: Path, data: bytes) -> None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            partial = path.with_name(f".{path.name}.{secrets.token_hex(4)}.part")
            partial.write_bytes(data)
            partial.replace(path)
        except OSError as exc:
            raise BlobError(f"blob {path.name!r} could not be written: {exc}") from exc

    def __repr__(self) -> str:
        return f"<LocalBlobs {self._root}>"


def _no_presigning(key: str) -> BlobError:
    return BlobError(f"a local blob directory has no presigned URLs ({key!r}); use blobs: s3")


def open_blobs(config: BlobsConfig, environ: Mapping[str, str]) -> BlobStore:
    """The blob store ``config`` names (``s3`` needs the ``gpugate[s3]`` extra: boto3)."""
    if config.kind == "local":
        return LocalBlobs(config.dir)
    assert config.s3 is not None, "validated: kind s3 has its block"
    from gpugate.adapters.s3_blobs import S3Blobs

    return S3Blobs.from_config(config.s3, environ)
