"""The S3-compatible blob store (extra ``gpugate[s3]``): the only module importing boto3.

Works with AWS S3, Cloudflare R2 (``endpoint_url`` + ``region_name: auto``), MinIO and moto's
server. boto3 is synchronous: each call runs in a worker thread. With an ``endpoint_url`` the
bucket is addressed by path (``{endpoint}/{bucket}/{key}``), which every S3-compatible server
accepts; presigned URLs are SigV4.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from gpugate.adapters.blobs import check_key
from gpugate.config import S3Config
from gpugate.errors import BlobError, BlobNotFound

_MISSING = frozenset({"NoSuchKey", "404", "NotFound"})


class S3Blobs:
    """Blobs in one bucket under ``prefix``."""

    presigns = True

    def __init__(self, client: Any, bucket: str, prefix: str = "") -> None:
        self._client = client
        self._bucket = bucket
        self._prefix = prefix

    @classmethod
    def from_config(cls, config: S3Config, environ: Mapping[str, str]) -> S3Blobs:
        """A client for ``config``; keys from the named variables, else boto3's own chain."""
        options: dict[str, Any] = {
            "region_name": config.region_name,
            "config": Config(
                signature_version="s3v4",
                s3={"addressing_style": "path" if config.endpoint_url else "auto"},
                retries={"max_attempts": 3, "mode": "standard"},
            ),
        }
        if config.endpoint_url:
            options["endpoint_url"] = config.endpoint_url
        if config.access_key_id_env and config.secret_access_key_env:
            options["aws_access_key_id"] = environ.get(config.access_key_id_env)
            options["aws_secret_access_key"] = environ.get(config.secret_access_key_env)
        client = boto3.session.Session().client("s3", **options)
        return cls(client, config.bucket, config.prefix)

    @property
    def bucket(self) -> str:
        return self._bucket

    async def put(self, key: str, data: bytes, *, content_type: str) -> None:
        await self._call(
            "put_object",
            key,
            Bucket=self._bucket,
            Key=self._key(key),
            Body=data,
            ContentType=content_type,
        )

    async def get(self, key: str) -> bytes:
        answer = await self._call("get_object", key, Bucket=self._bucket, Key=self._key(key))
        body = answer["Body"]
        try:
            return await asyncio.to_thread(body.read)
        finally:
            body.close()

    async def delete(self, key: str) -> None:
        await self._call("delete_object", key, Bucket=self._bucket, Key=self._key(key))

    async def presign_put(self, key: str, *, expires_s: float, content_type: str) -> str:
        params = {"Bucket": self._bucket, "Key": self._key(key), "ContentType": content_type}
        return self._presign("put_object", params, expires_s)

    async def presign_get(self, key: str, *, expires_s: float) -> str:
        return self._presign(
            "get_object", {"Bucket": self._bucket, "Key": self._key(key)}, expires_s
        )

    async def close(self) -> None:
        await asyncio.to_thread(self._client.close)

    def _key(self, key: str) -> str:
        return self._prefix + check_key(key)

    def _presign(self, operation: str, params: dict[str, str], expires_s: float) -> str:
        # Signing is local (no request): no thread needed.
        url: str = self._client.generate_presigned_url(
            operation, Params=params, ExpiresIn=max(1, int(expires_s))
        )
        return url

    async def _call(self, operation: str, key: str, **params: Any) -> Any:
        try:
            return await asyncio.to_thread(getattr(self._client, operation), **params)
        except ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code", ""))
            if code in _MISSING:
                raise BlobNotFound(f"no blob {key!r} in bucket {self._bucket}") from None
            raise BlobError(f"S3 {operation} of {key!r} failed: {code or exc}") from exc
        except BotoCoreError as exc:
            raise BlobError(f"S3 {operation} of {key!r} failed: {exc}") from exc

    def __repr__(self) -> str:
        return f"<S3Blobs {self._bucket}/{self._prefix}>"
