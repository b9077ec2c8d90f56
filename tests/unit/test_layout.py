"""The package's layout: subpackages by role, every module under the import contract, and the
documented import paths kept.

The architecture page (docs/architecture.md) says where each kind of change goes; these tests
keep the tree saying the same: a module added at the top level, or left out of the layers
that import-linter checks (`make lint`), fails here.
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
import re
import sys
from pathlib import Path

import pytest

import idempotency_middleware

if sys.version_info >= (3, 11):
    import tomllib
else:  # (make test runs this on 3.11; mypy checks the tests as 3.10)
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "idempotency_middleware"

# What the package's top level holds: the public vocabulary (errors, events, clocks, test
# helpers), the thin modules behind documented paths, and one subpackage per role.
TOP_LEVEL_MODULES = {
    "__main__",
    "clock",
    "errors",
    "events",
    "testing",
    "fastapi",
    "django",
    "faststream",
    "celery",
    "step_functions",
    "mcp",
}
SUBPACKAGES = {
    "actions",
    "agents",
    "cli",
    "consumers",
    "demo",
    "engine",
    "functions",
    "handler",
    "observability",
    "policy",
    "stores",
    "web",
    "workflows",
}
# Documented module paths and the names their pages import from them.
DOCUMENTED_PATHS = {
    "idempotency_middleware.fastapi": ["IdempotencyKey", "document_idempotency", "route_rules"],
    "idempotency_middleware.django": ["IdempotencyDjangoMiddleware"],
    "idempotency_middleware.faststream": [
        "IdempotencyFastStreamMiddleware",
        "header_or_message_id",
        "message_id",
        "broker_delivery_count",
    ],
    "idempotency_middleware.celery": ["idempotent_task", "TaskCall", "header_or_task_id"],
    "idempotency_middleware.step_functions": [
        "start_execution",
        "astart_execution",
        "handle_execution_status_change",
    ],
    "idempotency_middleware.mcp": ["IdempotencyMCPMiddleware", "idempotent_tool"],
    "idempotency_middleware.testing": ["FakeClock"],
    "idempotency_middleware.clock": ["SYSTEM_CLOCK", "Clock"],
    "idempotency_middleware.stores": ["CLAIMED", "TAKEN_OVER", "ClaimRequest", "Held", "Record"],
    "idempotency_middleware.stores.kit": ["Flow", "KitStore", "drive", "LoopLocal"],
    "idempotency_middleware.stores.protocol": ["ClaimResult", "DeferredToken", "awaits_nothing"],
    "idempotency_middleware.stores.records": ["Record", "Status", "StoredResponse"],
    "idempotency_middleware.stores.wakeups": ["Wakeups"],
    "idempotency_middleware.stores.model": ["check_store_against_model"],
    "idempotency_middleware.consumers": ["IdempotentConsumer", "Outcome", "Verdict"],
    "idempotency_middleware.consumers.sqs_worker": ["fit_warnings"],
    "idempotency_middleware.observability": ["OpenTelemetry", "Prometheus"],
}
THIN_MODULES = {
    "fastapi": "web.fastapi",
    "django": "web.django",
    "faststream": "consumers.faststream",
    "celery": "consumers.celery",
    "step_functions": "workflows",
    "mcp": "agents",
}


def _members() -> tuple[set[str], set[str]]:
    modules: set[str] = set()
    packages: set[str] = set()
    for info in pkgutil.iter_modules(idempotency_middleware.__path__):
        (packages if info.ispkg else modules).add(info.name)
    return modules, packages


def _layers_contract() -> list[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contracts = config["tool"]["importlinter"]["contracts"]
    (package_layers,) = [
        contract
        for contract in contracts
        if contract["type"] == "layers" and not contract.get("containers")
    ]
    return list(package_layers["layers"])


def test_the_top_level_holds_the_public_modules_and_one_subpackage_per_role() -> None:
    modules, packages = _members()
    assert modules == TOP_LEVEL_MODULES
    assert packages == SUBPACKAGES


def test_every_module_of_the_package_is_in_the_layers_contract() -> None:
    named = {
        name.removeprefix(f"{PACKAGE}.")
        for layer in _layers_contract()
        for name in re.split(r"\s*[|:]\s*", layer)
    }
    modules, packages = _members()
    assert named == modules | packages


def test_every_module_of_a_store_backend_is_in_the_stores_contract() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    (stores,) = [
        contract
        for contract in config["tool"]["importlinter"]["contracts"]
        if contract.get("containers") == [f"{PACKAGE}.stores"]
    ]
    named = {name for layer in stores["layers"] for name in re.split(r"\s*[|:]\s*", layer)}
    store_package = importlib.import_module(f"{PACKAGE}.stores")
    assert named == {info.name for info in pkgutil.iter_modules(store_package.__path__)}


@pytest.mark.parametrize("path", sorted(DOCUMENTED_PATHS))
def test_a_documented_import_path_still_imports_its_names(path: str) -> None:
    module = importlib.import_module(path)
    missing = [name for name in DOCUMENTED_PATHS[path] if not hasattr(module, name)]
    assert missing == []


@pytest.mark.parametrize("thin", sorted(THIN_MODULES))
def test_a_thin_public_module_gives_the_very_objects_of_its_door(thin: str) -> None:
    public = importlib.import_module(f"{PACKAGE}.{thin}")
    real = importlib.import_module(f"{PACKAGE}.{THIN_MODULES[thin]}")
    assert public.__all__ == real.__all__
    for name in real.__all__:
        assert getattr(public, name) is getattr(real, name), name


def test_every_root_name_is_importable_from_the_root() -> None:
    missing = [
        name for name in idempotency_middleware.__all__ if not hasattr(idempotency_middleware, name)
    ]
    assert missing == []


def test_every_package_import_in_the_pages_resolves() -> None:
    """The pages' and examples' ``from idempotency_middleware... import ...`` lines, and the
    API reference's ``::: idempotency_middleware...`` names, each resolve."""
    sources = [*ROOT.glob("docs/**/*.md"), *ROOT.glob("docs/**/*.py"), *ROOT.glob("examples/*.py")]
    sources.append(ROOT / "README.md")
    imports = re.compile(rf"^\s*from ({PACKAGE}(?:\.\w+)*) import (?:\(([^)]*)\)|([^\n]+))", re.M)
    references = re.compile(rf"^::: ({PACKAGE}(?:\.\w+)+)", re.M)
    unresolved = []
    for source in sources:
        text = source.read_text()
        for match in imports.finditer(text):
            module = importlib.import_module(match.group(1))
            names = (match.group(2) or match.group(3)).split("#")[0]
            for name in (item.split()[0] for item in names.split(",") if item.strip()):
                dotted = f"{match.group(1)}.{name}"
                if not hasattr(module, name) and importlib.util.find_spec(dotted) is None:
                    unresolved.append(f"{source.name}: {dotted}")
        for match in references.finditer(text):
            if not _resolves(match.group(1)):
                unresolved.append(f"{source.name}: {match.group(1)}")
    assert unresolved == []


def _resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for split in range(len(parts), 0, -1):
        try:
            target: object = importlib.import_module(".".join(parts[:split]))
        except ModuleNotFoundError:
            continue
        for attribute in parts[split:]:
            if not hasattr(target, attribute):
                return False
            target = getattr(target, attribute)
        return True
    return False
