"""``gpugate worker`` on the command line: what ``--help`` promises, and a missing secret."""

from __future__ import annotations

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
