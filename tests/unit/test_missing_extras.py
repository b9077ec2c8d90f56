"""A DynamoDB store whose extra is not installed fails at construction, naming the pip
command, instead of with a bare ``ModuleNotFoundError`` (``botocore``, ``aioboto3``) at
first use; importing the package, and the stores that need nothing, keep working.

Each case runs in a fresh interpreter where the libraries are made unimportable, as if never
installed: by ``sys.modules[name] = None``, or by an import hook refusing them.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

# Refuses the named top-level modules (and their submodules) before any other finder looks.
REFUSING_FINDER = """
import sys

class Refuse:
    def __init__(self, names):
        self.names = names

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in self.names:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, Refuse(REFUSED))
"""


def run_python(script: str, refused: tuple[str, ...]) -> subprocess.CompletedProcess[str]:
    prelude = REFUSING_FINDER.replace("REFUSED", repr(set(refused)))
    return subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(script)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ},
        check=False,
    )


def test_the_async_store_without_aioboto3_names_the_dynamodb_extra() -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                """
                import sys
                sys.modules["aioboto3"] = None  # as if not installed
                from idempotency_middleware import AsyncDynamoDBStore
                try:
                    AsyncDynamoDBStore("idempotency", region_name="eu-west-1")
                except ImportError as error:
                    print(type(error).__name__, error.name)
                    print(error)
                """
            ),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "ModuleNotFoundError aioboto3",
        "AsyncDynamoDBStore needs aioboto3, which is not installed: "
        'pip install "idempotency-middleware[dynamodb]"',
    ]


def test_with_only_the_boto3_extra_the_async_store_fails_at_construction() -> None:
    result = run_python(
        """
        from idempotency_middleware import AsyncDynamoDBStore, DynamoDBStore
        DynamoDBStore("idempotency", region_name="eu-west-1").close()  # boto3 is there
        try:
            AsyncDynamoDBStore("idempotency", region_name="eu-west-1")
        except ModuleNotFoundError as error:
            print(error)
        """,
        refused=("aioboto3", "aiobotocore"),
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == (
        "AsyncDynamoDBStore needs aioboto3, which is not installed: "
        'pip install "idempotency-middleware[dynamodb]"'
    )


def test_without_boto3_the_package_imports_and_the_sync_store_names_its_extra() -> None:
    result = run_python(
        """
        import sys
        import idempotency_middleware
        from idempotency_middleware import DynamoDBStore, MemoryStore, idempotent

        @idempotent(store=MemoryStore(), key="key")
        def double(key: str, amount: int) -> int:
            return amount * 2

        print(double(key="k", amount=21), "botocore" in sys.modules)
        try:
            DynamoDBStore("idempotency", region_name="eu-west-1")
        except ModuleNotFoundError as error:
            print(error.name, error)
        """,
        refused=("boto3", "botocore", "aioboto3", "aiobotocore"),
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "42 False",
        "boto3 DynamoDBStore needs boto3, which is not installed: "
        'pip install "idempotency-middleware[boto3]"',
    ]


@pytest.mark.parametrize("command", ["create-table", "show"])
def test_the_cli_without_boto3_says_what_to_install_and_exits_4(command: str) -> None:
    arguments = ["--table", "idempotency", "--region", "eu-west-1"]
    if command == "show":
        arguments = ["k", "--route", "/orders", *arguments]
    result = run_python(
        f"""
        import sys
        from idempotency_middleware.cli.main import main
        sys.exit(main({[command, *arguments]!r}))
        """,
        refused=("boto3", "botocore"),
    )
    assert result.returncode == 4, result.stderr
    assert result.stderr.strip() == (
        "DynamoDBStore needs boto3, which is not installed: "
        'pip install "idempotency-middleware[boto3]"'
    )


@pytest.mark.parametrize(
    ("module", "library", "extra"),
    [
        ("idempotency_middleware.faststream", "faststream", "faststream"),
        ("idempotency_middleware.celery", "celery", "celery"),
    ],
)
def test_a_broker_integration_without_its_library_names_its_extra(
    module: str, library: str, extra: str
) -> None:
    result = run_python(
        f"""
        import sys
        import idempotency_middleware  # the package itself needs neither
        print({library!r} in sys.modules)
        try:
            import {module}
        except ModuleNotFoundError as error:
            print(error.name, error)
        """,
        refused=(library,),
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "False",
        f"{library} {module} needs {library}, which is not installed: "
        f'pip install "idempotency-middleware[{extra}]"',
    ]
