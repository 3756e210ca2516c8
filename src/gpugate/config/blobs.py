"""``blobs``: where large job results (and serverless results) are kept.

``local`` (the default) keeps them in a directory of the gateway's host. ``s3`` keeps them in an
S3-compatible bucket (AWS S3, Cloudflare R2 with ``endpoint_url`` and ``region_name: auto``,
MinIO, ...) and hands serverless calls presigned URLs to write them directly.
"""

from __future__ import annotations

from typing import Literal, Self

from pydantic import Field, model_validator

from gpugate.config.fields import ConfigModel, EnvName, HttpUrl, Name, PositiveSeconds


class S3Config(ConfigModel):
    """An S3-compatible bucket; credentials from the named variables, or boto3's own chain
    (instance role, ``~/.aws``) when they are unset."""

    bucket: Name
    prefix: str = "gpugate/"
    endpoint_url: HttpUrl | None = None
    region_name: str | None = None
    access_key_id_env: EnvName | None = None
    secret_access_key_env: EnvName | None = None


class BlobsConfig(ConfigModel):
    """Results larger than ``inline_max_bytes`` go to the blob store; presigned URLs live
    ``presign_s``."""

    kind: Literal["local", "s3"] = "local"
    dir: str = "./gpugate-blobs"
    s3: S3Config | None = None
    inline_max_bytes: int = Field(256 * 1024, ge=0)
    presign_s: PositiveSeconds = 3600.0

    @model_validator(mode="after")
    def _s3_needs_its_block(self) -> Self:
        if self.kind == "s3" and self.s3 is None:
            raise ValueError("kind s3 needs an s3 block: {bucket: ..., endpoint_url: ...}")
        return self
