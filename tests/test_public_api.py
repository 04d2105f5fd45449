"""The public import surface of openroute: route authors need one import line, and the list is pinned."""

from __future__ import annotations

import importlib
import subprocess
import sys
import types

import pytest

import openroute

PUBLIC = [
    "Application", "BusinessError", "ChildMessage", "Clock", "ConfigurationError", "DeploymentError", "Engine",
    "EngineSettings", "Exchange", "ExtCallScope", "InboundMessage", "InterceptionContext", "ManualClock",
    "MessageDroppedByInterceptor", "MessageInterceptor", "MessageState", "OpenrouteError", "ParsedPayload",
    "RetryPolicy", "Route", "RouteBuilder", "RouteDefinition", "RouteRegistry", "Step", "Steps", "SystemClock",
    "TechnicalError", "ValidationError", "__version__", "parsed", "route", "steps",
]


def test_the_public_names_are_pinned() -> None:
    assert sorted(openroute.__all__) == sorted(PUBLIC)
    for name in openroute.__all__:
        assert getattr(openroute, name) is not None, name


def test_public_names_are_the_objects_of_their_home_modules() -> None:
    for name in PUBLIC:
        value = getattr(openroute, name)
        home = getattr(value, "__module__", None)
        if home is not None and home.startswith("openroute"):
            assert getattr(importlib.import_module(home), name) is value, name


def test_route_is_the_dsl_function_even_after_the_definitions_module_is_imported() -> None:
    # the module of Route lives in openroute.definitions: importing it sets no attribute `route` on the package root,
    # so the root needs no module class of its own to keep the DSL's route()
    import openroute.definitions.route as definitions  # noqa: F401
    from openroute import route

    assert callable(route) and route.__module__ == "openroute.dsl"
    assert vars(openroute)["route"] is route  # the package's attribute (spelt so: the DSL's function, not a module)
    assert route("crm", "setCustomer").service == "crm"
    assert type(openroute) is types.ModuleType


def test_one_import_line_is_enough_to_write_and_run_a_route() -> None:
    code = (
        "from openroute import Application, BusinessError, Exchange, RetryPolicy, route, steps\n"
        "def charge(exchange: Exchange) -> None:\n"
        "    raise BusinessError('NO_CREDIT', 'no credit')\n"
        "enrich = steps().process(lambda exchange: None)\n"
        "app = Application(route('crm', 'charge').json().retry(RetryPolicy(max_attempts=2)).call(enrich)"
        ".process(charge))\n"
        "print(sorted(r.operation for r in app.routes))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['charge']"


def _imports(path: str) -> set[str]:
    import ast
    from pathlib import Path

    tree = ast.parse((Path(openroute.__file__).parent / path).read_text(encoding="utf-8"))
    found: set[str] = set()
    # module-level imports (TYPE_CHECKING blocks included); a lazy __getattr__ for old names would not be
    nodes = [node for top in tree.body for node in ([top] if not isinstance(top, ast.If) else ast.walk(top))]
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def test_definitions_do_not_import_the_runtime_or_the_endpoints() -> None:
    # definitions/route.py is what a route is; dsl.py builds definitions; neither reaches into inbound/ (the endpoints)
    for path, forbidden in (("definitions/route.py", ("openroute.engine", "openroute.inbound")),
                            ("dsl.py", ("openroute.inbound",)),
                            ("definitions/binding.py", ("openroute.engine",))):
        bad = {name for name in _imports(path) if name.startswith(forbidden)}
        assert not bad, f"{path} imports {sorted(bad)}"


def test_inbound_and_new_messages_are_one_concept_and_keep_their_positional_order() -> None:
    from datetime import UTC, datetime

    from openroute.persistence import MessageFields, NewMessage

    at = datetime(2030, 1, 1, tzinfo=UTC)
    inbound = openroute.InboundMessage("crm", "setCustomer", "{}", "application/json", "c-1", "CRM", "p-1", at,
                                       object_id="42")
    new = inbound.to_new_message(at, parent_id=7)
    assert isinstance(inbound, MessageFields) and isinstance(new, MessageFields)
    expected = NewMessage("crm", "setCustomer", "{}", "application/json", "c-1", "CRM", at, "p-1", at,
                          object_id="42", entity_type="setCustomer", parent_id=7)
    assert new == expected and repr(new) == repr(expected)
    assert vars(new) == vars(expected), "built without __init__ (the accept path): every field, nothing more"


def _first_lines_printed_by(code: str) -> list[str]:
    """The first two lines ``code`` prints in a fresh interpreter (it must exit 0)."""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout.split("\n")[:2]


def test_import_openroute_streams_loads_no_third_party_module() -> None:
    """The bottom layer is standard library only, and ``import openroute`` (which every submodule import runs)
    loads its public names lazily: a fresh interpreter gains only standard-library and openroute modules."""
    code = (
        "import sys\n"
        "before = set(sys.modules)\n"
        "import openroute.streams\n"
        "new = set(sys.modules) - before\n"
        "third = sorted(m for m in new if m.split('.')[0] not in sys.stdlib_module_names\n"
        "               and m.split('.')[0] != 'openroute')\n"
        "print(third)\n"
        "print('openroute.engine' in sys.modules, 'openroute.dsl' in sys.modules)\n"
    )
    assert _first_lines_printed_by(code) == ["[]", "False False"]


def test_public_names_load_on_first_use() -> None:
    code = (
        "import sys, openroute\n"
        "print('sqlalchemy' in sys.modules)\n"
        "from openroute import Exchange, route\n"
        "import openroute.definitions.route\n"
        "print(vars(openroute)['route'] is route, Exchange.__module__, 'sqlalchemy' in sys.modules)\n"
    )
    assert _first_lines_printed_by(code) == ["False", "True openroute.engine.exchange True"]
    with pytest.raises(AttributeError, match="no attribute 'Nothing'"):
        openroute.Nothing  # noqa: B018


def test_the_tracing_module_is_imported_from_the_root_as_documented() -> None:
    # docs/operations.md: `from openroute import tracing` (its home is openroute/runtime/tracing.py); run as text,
    # which the import rewrite of the layers' move leaves alone
    from openroute.runtime import tracing

    namespace: dict[str, object] = {}
    exec("from openroute import tracing", namespace)
    assert namespace["tracing"] is tracing


#: what the reference application may import of openroute: the root and the packages the docs show route authors
REFERENCE_APP_MAY_IMPORT = ("openroute", "openroute.outbound", "openroute.testing", "openroute.persistence")


def test_the_reference_application_is_written_with_the_public_surface() -> None:
    """routes/ (installed as openroute_reference) imports what a route author can: every import, deferred ones and
    those under TYPE_CHECKING too, names a public package, never the engine, an edge's module or a `_` module."""
    import ast
    from pathlib import Path

    routes = Path(openroute.__file__).resolve().parent.parent / "routes"
    found: dict[str, set[str]] = {}
    for path in sorted(routes.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.setdefault(path.name, set()).add(node.module)
            elif isinstance(node, ast.Import):
                found.setdefault(path.name, set()).update(alias.name for alias in node.names)
    bad = {name: sorted(module for module in modules if module.split(".")[0] == "openroute"
                        and module not in REFERENCE_APP_MAY_IMPORT)
           for name, modules in found.items()}
    assert not {name: modules for name, modules in bad.items() if modules}
    assert "demo.py" in found and "openroute.testing" in found["demo.py"]
