from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest
from s3_server import ENVIRON, S3Server, s3_server

from gpugate.adapters.blobs import BlobStore, LocalBlobs
from gpugate.adapters.s3_blobs import S3Blobs


@pytest.fixture(scope="session")
def s3() -> Iterator[S3Server]:
    with s3_server() as server:
        yield server


@pytest.fixture
def s3_blobs(s3: S3Server) -> S3Blobs:
    bucket = f"b-{secrets.token_hex(4)}"
    s3.create_bucket(bucket)
    return S3Blobs.from_config(s3.config(bucket), ENVIRON)


@pytest.fixture(params=["local", "s3"])
def blobs(request: pytest.FixtureRequest, tmp_path: Path) -> BlobStore:
    if request.param == "local":
        return LocalBlobs(tmp_path / "blobs")
    store: BlobStore = request.getfixturevalue("s3_blobs")
    return store
