from __future__ import annotations

from pathlib import Path

import pytest

from gpugate.adapters.blobs import BlobStore, LocalBlobs
from s3_server import s3, s3_blobs

__all__ = ["blobs", "s3", "s3_blobs"]


@pytest.fixture(params=["local", "s3"])
def blobs(request: pytest.FixtureRequest, tmp_path: Path) -> BlobStore:
    if request.param == "local":
        return LocalBlobs(tmp_path / "blobs")
    store: BlobStore = request.getfixturevalue("s3_blobs")
    return store
