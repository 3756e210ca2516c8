"""The blob store contract, on a local directory and on an S3-compatible server (moto)."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest

from gpugate.adapters.blobs import BlobStore, LocalBlobs, open_blobs
from gpugate.adapters.s3_blobs import S3Blobs
from gpugate.config import BlobsConfig
from gpugate.errors import BlobError, BlobNotFound


async def test_a_blob_reads_back_what_was_put_and_a_second_put_replaces_it(
    blobs: BlobStore,
) -> None:
    await blobs.put("results/j1/a.json", b'{"n": 1}', content_type="application/json")
    assert b'{"n": 1}' == await blobs.get("results/j1/a.json")
    await blobs.put("results/j1/a.json", b'{"n": 2}', content_type="application/json")
    assert b'{"n": 2}' == await blobs.get("results/j1/a.json")


async def test_a_missing_blob_is_blob_not_found_and_deleting_it_is_harmless(
    blobs: BlobStore,
) -> None:
    with pytest.raises(BlobNotFound):
        await blobs.get("results/none.json")
    await blobs.put("results/x.json", b"x", content_type="application/json")
    await blobs.delete("results/x.json")
    await blobs.delete("results/x.json")
    with pytest.raises(BlobNotFound):
        await blobs.get("results/x.json")


@pytest.mark.parametrize("key", ["", "../etc/passwd", "a/../../b", "/abs", "a//b", "a/.", "a b"])
async def test_a_key_that_could_leave_the_store_is_refused(blobs: BlobStore, key: str) -> None:
    with pytest.raises(BlobError, match="invalid blob key"):
        await blobs.put(key, b"x", content_type="application/json")


async def test_local_blobs_land_under_their_directory_and_leave_no_partial_file(
    tmp_path: Path,
) -> None:
    store = LocalBlobs(tmp_path / "blobs")
    await store.put("results/j1/c1.json", b"{}", content_type="application/json")
    files = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file())
    assert ["blobs/results/j1/c1.json"] == files


async def test_a_local_directory_has_no_presigned_urls(tmp_path: Path) -> None:
    store = LocalBlobs(tmp_path)
    assert not store.presigns
    with pytest.raises(BlobError, match="use blobs: s3"):
        await store.presign_put("r.json", expires_s=60, content_type="application/json")


async def test_presigned_urls_let_a_caller_without_credentials_put_and_get_one_blob(
    s3_blobs: S3Blobs,
) -> None:
    """(moto does not check signatures, so a forged URL is not tested here.)"""
    put_url = await s3_blobs.presign_put(
        "results/j2/c.json", expires_s=60, content_type="application/json"
    )
    get_url = await s3_blobs.presign_get("results/j2/c.json", expires_s=60)
    async with aiohttp.ClientSession() as http:
        async with http.put(
            put_url, data=b'{"ok": true}', headers={"Content-Type": "application/json"}
        ) as put:
            assert 200 == put.status
        async with http.get(get_url) as got:
            assert (200, b'{"ok": true}') == (got.status, await got.read())
    assert b'{"ok": true}' == await s3_blobs.get("results/j2/c.json")


def test_the_config_picks_the_store_and_s3_needs_its_block(tmp_path: Path) -> None:
    local = open_blobs(BlobsConfig(dir=str(tmp_path)), {})
    assert isinstance(local, LocalBlobs)
    assert tmp_path == local.root
    with pytest.raises(ValueError, match="kind s3 needs an s3 block"):
        BlobsConfig(kind="s3")
