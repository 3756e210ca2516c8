"""The commands that talk to a gateway, given bad input: one line saying what is wrong, exit 1.

Each of these was a Python traceback once: a URL that is not one, a server that is not a
gateway, a file that cannot be read or written.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from gpugate.cli import main

PAGE = b"<!doctype html><title>Sign in</title><p>Please sign in."


class _HtmlPage(BaseHTTPRequestHandler):
    """Answers every request 200 with an HTML page, as a proxy's login page does."""

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(PAGE)))
        self.end_headers()
        self.wfile.write(PAGE)

    def do_PUT(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.do_GET()

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the stdlib's name
        """Quiet: the test reads the CLI's output, not the server's."""


@pytest.fixture
def not_a_gateway() -> Iterator[str]:
    """The URL of a web server that is not a gateway."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _HtmlPage)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("not-a-url", "it must start with http:// or https://"),
        ("", "it must start with http:// or https://"),
        ("http://[::1", "Invalid IPv6 URL"),
        ("http://127.0.0.1:x", "Port could not be cast to integer value as 'x'"),
        ("http://", "it names no host"),
    ],
    ids=["no-scheme", "empty", "open-bracket", "port-not-a-number", "no-host"],
)
def test_a_gateway_url_that_is_not_one_is_named_with_what_is_wrong(
    capsys: pytest.CaptureFixture[str], url: str, reason: str
) -> None:
    code, out, err = run(capsys, "runtimes", "list", "--gateway", url)

    expected = f"gpugate: error: --gateway: not an http(s) URL: {url!r}: {reason}\n"
    assert (1, "", expected) == (code, out, err)


def test_a_bad_gpugate_url_is_named_as_the_variable_it_came_from(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUGATE_URL", "not-a-url")

    code, out, err = run(capsys, "keys", "list")

    expected = (
        "gpugate: error: $GPUGATE_URL (the default of --gateway): not an http(s) URL: "
        "'not-a-url': it must start with http:// or https://\n"
    )
    assert (1, "", expected) == (code, out, err)


def test_an_answer_that_is_not_json_names_its_status_and_content_type(
    capsys: pytest.CaptureFixture[str], not_a_gateway: str
) -> None:
    code, out, err = run(capsys, "runtimes", "list", "--gateway", not_a_gateway)

    expected = (
        "gpugate: error: the answer to GET /admin/runtimes was not JSON (200, text/html; "
        f"charset=utf-8): is {not_a_gateway} a gpugate gateway?\n"
    )
    assert (1, "", expected) == (code, out, err)


def test_config_import_of_a_file_that_does_not_exist_names_it(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, not_a_gateway: str
) -> None:
    missing = tmp_path / "nonexist.yaml"

    code, out, err = run(capsys, "config", "import", "--gateway", not_a_gateway, str(missing))

    expected = f"gpugate: error: cannot read {missing}: No such file or directory\n"
    assert (1, "", expected) == (code, out, err)


def test_config_export_into_a_directory_that_does_not_exist_names_the_file(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, not_a_gateway: str
) -> None:
    target = tmp_path / "nonexistent-dir" / "x.yaml"

    code, out, err = run(capsys, "config", "export", "--gateway", not_a_gateway, "-o", str(target))

    expected = f"gpugate: error: cannot write {target}: No such file or directory\n"
    assert (1, "", expected) == (code, out, err)


def test_jobs_submit_with_an_input_file_that_does_not_exist_names_it(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, not_a_gateway: str
) -> None:
    missing = tmp_path / "body.json"

    argv = ["jobs", "submit", "--gateway", not_a_gateway, "--model", "m", "--input", f"@{missing}"]
    code, out, err = run(capsys, *argv)

    expected = f"gpugate: error: cannot read {missing}: No such file or directory\n"
    assert (1, "", expected) == (code, out, err)


@pytest.mark.parametrize("flag", ["--ca-file", "--cert-file"])
def test_a_tls_file_for_the_gateway_that_does_not_exist_names_it(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, flag: str
) -> None:
    missing = tmp_path / "absent.pem"

    code, out, err = run(capsys, "runtimes", "list", flag, str(missing))

    what = "the CA bundle" if flag == "--ca-file" else "the client certificate"
    expected = f"gpugate: error: cannot load {what} {missing}: No such file or directory\n"
    assert (1, "", expected) == (code, out, err)
