"""What the store-diagnostics tests need to make AWS fail the ways it fails in production,
on 127.0.0.1 only.

- ``aws_environment``: an environment where botocore finds exactly the credentials and region
  a test gives it (or none): the host's AWS config files, profiles and instance metadata are
  shut out, so nothing but the test decides, and botocore never contacts 169.254.169.254.
- ``use_environment``: the same, applied to this process (for servers run in-process).
- ``RejectingEndpoint``: an HTTP server answering every DynamoDB request with one error, as
  DynamoDB does for credentials it does not know (``UnrecognizedClientException``) or a
  principal without permission (``AccessDeniedException``); moto accepts any credentials.
"""

from __future__ import annotations

import os
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import orjson
import pytest

from tests.support.servers import BackgroundHTTPServer

REGION = "us-east-1"

# Variables through which botocore could find credentials, a region or a profile elsewhere.
_AWS_PREFIXES = ("AWS_", "BOTO_")


def aws_environment(
    directory: Path, *, credentials: bool = True, region: str | None = REGION
) -> dict[str, str]:
    """``os.environ`` with every AWS setting replaced: ``credentials`` (moto's test pair)
    or none, ``region`` or none, empty config files, no instance metadata."""
    empty = directory / "empty-aws-config"
    empty.write_text("")
    environment = {
        name: value for name, value in os.environ.items() if not name.startswith(_AWS_PREFIXES)
    }
    environment.update(
        AWS_CONFIG_FILE=str(empty),
        AWS_SHARED_CREDENTIALS_FILE=str(empty),
        BOTO_CONFIG=str(empty),
        AWS_EC2_METADATA_DISABLED="true",
    )
    if credentials:
        environment.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing")
    if region is not None:
        environment["AWS_DEFAULT_REGION"] = region
    return environment


def use_environment(monkeypatch: pytest.MonkeyPatch, environment: dict[str, str]) -> None:
    """Make this process's AWS settings those of ``environment`` for one test."""
    for name in list(os.environ):
        if name.startswith(_AWS_PREFIXES) and name not in environment:
            monkeypatch.delenv(name)
    for name, value in environment.items():
        if name.startswith(_AWS_PREFIXES):
            monkeypatch.setenv(name, value)


class RejectingEndpoint(BackgroundHTTPServer):
    """A DynamoDB endpoint on 127.0.0.1 that answers every request with one error."""

    def __init__(self, error_type: str, message: str, status: int = 400) -> None:
        body = orjson.dumps(
            {"__type": f"com.amazon.coral.service#{error_type}", "message": message}
        )

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.send_response(status)
                self.send_header("Content-Type", "application/x-amz-json-1.0")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass  # quiet: the tests read the store's account of it

        super().__init__(Handler)
