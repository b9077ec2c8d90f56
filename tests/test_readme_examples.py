"""The README quotes the examples in ``examples/`` verbatim (each file after its docstring),
and those files run as tests (tests/test_function_consumers.py; the quick starts in
tests/test_quickstarts.py): a README example that drifts from its tested file fails here."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = [
    "fastapi_quickstart",
    "flask_quickstart",
    "fastapi_routes",
    "sqs_consumer",
    "lambda_batch",
    "celery_task",
    "service_method",
    "exactly_once_orders",
    "long_running_work",
    "one_time_actions",
]


def quoted_part(name: str) -> str:
    """The example's source after its module docstring, as the README shows it."""
    source = (ROOT / "examples" / f"{name}.py").read_text()
    docstring = ast.parse(source).body[0]
    assert isinstance(docstring, ast.Expr) and docstring.end_lineno is not None
    return "\n".join(source.splitlines()[docstring.end_lineno :]).strip() + "\n"


@pytest.mark.parametrize("name", EXAMPLES)
def test_the_readme_quotes_the_tested_example_verbatim(name: str) -> None:
    readme = (ROOT / "README.md").read_text()
    assert f"```python\n# examples/{name}.py\n{quoted_part(name)}```" in readme


def test_the_readme_quotes_the_step_functions_definition_verbatim() -> None:
    readme = (ROOT / "README.md").read_text()
    definition = (ROOT / "examples" / "step_functions_complete.asl.json").read_text()
    assert f"```json\n{definition}```" in readme
