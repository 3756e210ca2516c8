"""``gpugate worker`` on the command line: what ``--help`` promises, a missing secret, a taken
port."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from gpugate.cli import main


def test_help_names_every_option_and_the_push_protocol(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["worker", "--help"])

    text = capsys.readouterr().out
    for option in ("--listen", "--gateway", "--runtime", "--secret-env", "--upstream",
                   "--concurrency", "--idle-exit-s", "--state-dir"):  # fmt: skip
        assert option in text
    assert "/calls" in text


def test_a_worker_whose_secret_variable_is_unset_refuses_to_start(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("NO_SUCH_SECRET", raising=False)

    code = main(["worker", "--listen", "127.0.0.1:0", "--gateway", "http://127.0.0.1:9",
                 "--runtime", "home-1", "--secret-env", "NO_SUCH_SECRET",
                 "--upstream", "http://127.0.0.1:9"])  # fmt: skip

    assert 1 == code
    assert "NO_SUCH_SECRET" in capsys.readouterr().err


def test_a_worker_whose_listen_port_is_taken_is_one_clear_error_and_a_nonzero_exit(
    tmp_path: Path,
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "gpugate", "worker", "--listen", f"127.0.0.1:{port}",
             "--gateway", "http://127.0.0.1:9", "--runtime", "home-1", "--secret-env", "SECRET",
             "--upstream", "http://127.0.0.1:9", "--state-dir", str(tmp_path)],
            capture_output=True, text=True, timeout=30, check=False,
            env={**os.environ, "SECRET": "s3cret"},
        )  # fmt: skip
    assert 1 == result.returncode
    expected = f"gpugate: error: cannot listen on 127.0.0.1:{port}: address already in use"
    assert [expected] == result.stderr.splitlines()


@pytest.mark.parametrize("flag", ["--gateway", "--upstream"])
def test_a_worker_given_a_url_that_is_not_one_refuses_to_start_and_names_the_flag(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path, flag: str
) -> None:
    monkeypatch.setenv("SECRET", "s3cret")
    urls = {"--gateway": "http://127.0.0.1:9", "--upstream": "http://127.0.0.1:9", flag: "gw:8080"}
    given = [part for option in urls.items() for part in option]

    code = main(["worker", "--listen", "127.0.0.1:0", "--runtime", "home-1",
                 "--secret-env", "SECRET", "--idle-exit-s", "0.5",  # the old code started
                 "--state-dir", str(tmp_path), *given])  # fmt: skip

    expected = f"gpugate: error: {flag}: not an http(s) URL: 'gw:8080': it must start with "
    assert (1, expected) == (code, capsys.readouterr().err[: len(expected)])


WORKER = ["worker", "--listen", "127.0.0.1:0", "--runtime", "home-1", "--secret-env", "SECRET"]
WORKER += ["--gateway", "http://127.0.0.1:9", "--upstream", "http://127.0.0.1:9"]


def test_a_worker_whose_state_directory_cannot_be_made_refuses_to_start_naming_the_flag(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("SECRET", "s3cret")
    (tmp_path / "a-file").write_text("not a directory")

    code = main([*WORKER, "--state-dir", str(tmp_path / "a-file" / "state")])

    err = capsys.readouterr().err.splitlines()
    assert (1, 1) == (code, len(err))
    assert err[0].startswith("gpugate: error: cannot use the state directory ")
    assert "(--state-dir)" in err[0]


def test_a_worker_whose_tls_certificate_is_missing_refuses_to_start_naming_the_flags(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("SECRET", "s3cret")

    code = main([*WORKER, "--state-dir", str(tmp_path / "state"),
                 "--tls-cert-file", str(tmp_path / "missing.pem")])  # fmt: skip

    err = capsys.readouterr().err.splitlines()
    assert (1, 1) == (code, len(err))
    assert err[0].startswith("gpugate: error: cannot load the TLS files (--tls-cert-file, ")
