"""An S3-compatible server on loopback for the tests: moto's server mode in a thread."""

from __future__ import annotations

import secrets
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import boto3
import pytest
from moto.server import ThreadedMotoServer

from gpugate.adapters.s3_blobs import S3Blobs
from gpugate.config import S3Config

ENVIRON = {"TEST_S3_KEY_ID": "testing", "TEST_S3_SECRET": "testing-secret"}


@dataclass(frozen=True)
class S3Server:
    url: str

    def config(self, bucket: str, prefix: str = "gpugate/") -> S3Config:
        return S3Config(
            bucket=bucket,
            prefix=prefix,
            endpoint_url=self.url,
            region_name="us-east-1",
            access_key_id_env="TEST_S3_KEY_ID",
            secret_access_key_env="TEST_S3_SECRET",
        )

    def create_bucket(self, bucket: str) -> None:
        client = boto3.client(
            "s3",
            endpoint_url=self.url,
            region_name="us-east-1",
            aws_access_key_id=ENVIRON["TEST_S3_KEY_ID"],
            aws_secret_access_key=ENVIRON["TEST_S3_SECRET"],
        )
        client.create_bucket(Bucket=bucket)
        client.close()


@contextmanager
def s3_server() -> Iterator[S3Server]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield S3Server(f"http://127.0.0.1:{port}")
    finally:
        server.stop()


@pytest.fixture(scope="session")
def s3() -> Iterator[S3Server]:
    """One S3-compatible server for the session."""
    with s3_server() as server:
        yield server


@pytest.fixture
def s3_blobs(s3: S3Server) -> S3Blobs:
    """A blob store on a fresh bucket of it."""
    bucket = f"b-{secrets.token_hex(4)}"
    s3.create_bucket(bucket)
    return S3Blobs.from_config(s3.config(bucket), ENVIRON)
