"""`gpugate check-config`, `db upgrade`, `version` and `--help`, as a user runs them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from gpugate.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def test_check_config_reports_a_wrong_type_an_unknown_key_and_a_missing_runtime_with_lines(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main(["check-config", str(EXAMPLES / "invalid.yaml")])
    captured = capsys.readouterr()  # a linter's findings go to stdout, the count to stderr
    lines = captured.out.splitlines()
    assert 1 == code
    assert "upstreams[0].max_inflight: expected an integer, got 'lots' (line 11)" == lines[0]
    assert lines[1].startswith("upstreams[0].gpu_id: unknown key (allowed: id, url, ")
    assert lines[1].endswith(") (line 12)")
    unknown_runtime = "names runtime 'nope', which is not defined (defined: local, home-1)"
    assert [f"fallback_chain[1]: {unknown_runtime} (line 22)"] == lines[2:]
    assert f"{EXAMPLES / 'invalid.yaml'}: 3 problems\n" == captured.err


def test_serve_prints_the_problems_of_a_bad_config_as_check_config_does(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME1_WORKER_SECRET", "s3cret")  # serve also needs the secrets
    main(["check-config", str(EXAMPLES / "invalid.yaml")])
    checked = capsys.readouterr()

    code = main(["serve", "--config", str(EXAMPLES / "invalid.yaml")])

    assert (1, "", checked.out + checked.err) == (code, *capsys.readouterr())


def test_the_design_example_validates_with_a_summary(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["check-config", str(EXAMPLES / "gateway.yaml")])
    out = capsys.readouterr().out
    assert 0 == code
    assert "fallback chain  local -> home-1 -> modal-beta" in out
    assert out.rstrip().endswith("examples/gateway.yaml: valid")


def test_unset_secrets_are_warnings_for_check_config_and_errors_with_strict_env(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("HOME1_WORKER_SECRET", "MODAL_TOKEN_ID", "MODAL_TOKEN_SECRET"):
        monkeypatch.delenv(name, raising=False)
    assert 0 == main(["check-config", str(EXAMPLES / "gateway.yaml")])
    assert "warning: runtimes[1].push.secret_env" in capsys.readouterr().out
    assert 1 == main(["check-config", "--strict-env", str(EXAMPLES / "gateway.yaml")])
    err = capsys.readouterr().out
    assert "runtimes[1].push.secret_env: environment variable HOME1_WORKER_SECRET is not set" in err


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (None, "no such file"),
        ("upstreams: [\n", "invalid YAML"),
    ],
    ids=["missing-file", "malformed-yaml"],
)
def test_a_missing_file_or_malformed_yaml_is_one_clear_line_and_no_traceback(
    tmp_path: Path, content: str | None, expected: str
) -> None:
    path = tmp_path / "gateway.yaml"
    if content is not None:
        path.write_text(content)
    result = subprocess.run(
        [sys.executable, "-m", "gpugate", "check-config", str(path)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert 1 == result.returncode
    lines = result.stdout.strip().splitlines()
    assert 1 == len(lines), result.stdout
    assert expected in lines[0]
    assert "" == result.stderr


def test_db_upgrade_applies_migrations_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dsn = f"sqlite:///{tmp_path / 'store.db'}"
    assert 0 == main(["db", "upgrade", "--store", dsn])
    assert "applied: 0001_initial" in capsys.readouterr().out
    assert 0 == main(["db", "upgrade", "--store", dsn])
    assert "the store is up to date" in capsys.readouterr().out


def test_db_upgrade_names_a_bad_dsn(capsys: pytest.CaptureFixture[str]) -> None:
    assert 1 == main(["db", "upgrade", "--store", "mysql://x/y"])
    assert "sqlite:///" in capsys.readouterr().err


def test_version_prints_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    from gpugate import __version__

    assert 0 == main(["version"])
    assert f"gpugate {__version__}\n" == capsys.readouterr().out


def _subcommands(parser: object) -> list[list[str]]:
    """Every command path of the CLI, e.g. ["serve"], ["db", "upgrade"]."""
    import argparse

    assert isinstance(parser, argparse.ArgumentParser)
    paths: list[list[str]] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                paths.append([name])
                paths.extend([name, *rest] for rest in _subcommands(sub))
    return paths


@pytest.mark.parametrize("command", _subcommands(build_parser()), ids=" ".join)
def test_every_command_has_help(command: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main([*command, "--help"])
    assert 0 == exit_info.value.code
    assert "usage: gpugate " + " ".join(command) in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (
            ["demo", "--listen", "127.0.0.1:99999"],
            "the port must be 0-65535, got '127.0.0.1:99999'",
        ),
        (["demo", "--listen", "8080"], "--listen must be HOST:PORT, got '8080'"),
        (["serve", "--config", "gw.yaml", "--listen", "[::1]:70000"], "the port must be 0-65535"),
    ],
    ids=["demo-port-too-big", "demo-no-host", "serve-port-too-big"],
)
def test_a_listen_address_that_cannot_be_one_is_one_clear_error(
    argv: list[str], expected: str, tmp_path: Path
) -> None:
    (tmp_path / "gw.yaml").write_text(
        "upstreams: [{id: a, url: 'http://127.0.0.1:9', models: [m]}]\n"
    )
    argv = [str(tmp_path / part) if part == "gw.yaml" else part for part in argv]

    result = subprocess.run(  # not main(): demo and serve set up logging on the process's stderr
        [sys.executable, "-m", "gpugate", *argv],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        cwd=tmp_path,
    )

    assert (1, "") == (result.returncode, result.stdout)
    assert result.stderr.startswith("gpugate: error: "), result.stderr
    assert expected in result.stderr
    assert 1 == len(result.stderr.splitlines()), result.stderr


def test_fleet_help_says_how_many_ports_and_which_members_from_the_demo_spec(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from gpugate.fleet import EXPORTER, demo_spec

    members = [*(server.name for server in demo_spec().servers), EXPORTER]

    with pytest.raises(SystemExit):
        main(["fleet", "--help"])

    text = " ".join(capsys.readouterr().out.split())  # as argparse wraps it
    assert f"{len(members)} fixed ports, one per member in this order: {', '.join(members)}" in text
    assert f"{len(members)} consecutive fixed ports from P up (P to P+{len(members) - 1})" in text


def test_the_command_line_does_not_import_the_fleet_until_a_command_needs_it() -> None:
    """The fleet's members in ``fleet --help`` are read when it is shown: not on every run."""
    probe = "import sys; from gpugate.cli import build_parser; build_parser(); "
    probe += "print('gpugate.fleet' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=30, check=True
    )
    assert "False" == result.stdout.strip()


def test_tls_files_check_config_cannot_read_are_warnings_with_lines_and_errors_when_strict(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cert, key = tmp_path / "absent.crt", tmp_path / "absent.key"
    config = tmp_path / "gw.yaml"
    config.write_text(
        "upstreams: [{id: a, url: 'http://127.0.0.1:9', models: [m]}]\n"
        f"tls:\n  cert_file: {cert}\n  key_file: {key}\n"
    )
    cert_problem = f"tls.cert_file: cannot read {cert}: No such file or directory (line 3)"
    key_problem = f"tls.key_file: cannot read {key}: No such file or directory (line 4)"

    assert 0 == main(["check-config", str(config)])
    out = capsys.readouterr().out.splitlines()
    assert [
        f"warning: {cert_problem} (needed at `serve`)",
        f"warning: {key_problem} (needed at `serve`)",
        f"{config}: valid",
    ] == out[-3:]

    assert 1 == main(["check-config", "--strict-env", str(config)])
    captured = capsys.readouterr()
    assert ([cert_problem, key_problem], f"{config}: 2 problems\n") == (
        captured.out.splitlines(),
        captured.err,
    )


def test_demo_with_a_work_directory_it_cannot_make_is_one_error_line_before_it_starts(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    (tmp_path / "a-file").write_text("not a directory")
    workdir = tmp_path / "a-file" / "demo"

    code = main(["demo", "--listen", "127.0.0.1:0", "--workdir", str(workdir)])

    err = capsys.readouterr().err.splitlines()
    assert (1, 1) == (code, len(err))
    assert err[0].startswith(f"gpugate: error: cannot use the work directory {workdir} (--workdir)")


def test_a_reader_that_goes_away_stops_the_command_quietly(tmp_path: Path) -> None:
    """``gpugate gpus inspect … | head -1``: the pipe's reader leaves before the output is
    written; the command ends with the shell's SIGPIPE status and no traceback."""
    scrape = (
        ROOT
        / "tests"
        / "fixtures"
        / "metrics"
        / "dcgm-exporter-aiperf-rtx6000ada-1gpu-violations.prom"
    )
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the command writes a byte
    try:
        done = subprocess.run(
            [sys.executable, "-m", "gpugate", "gpus", "inspect", str(scrape), "--json"],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        os.close(write)
    assert 128 + signal.SIGPIPE == done.returncode
    assert "" == done.stderr
