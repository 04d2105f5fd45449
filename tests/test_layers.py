"""The layer contracts of docs/architecture.md, checked by import-linter through ``.ci/layers`` (run by .ci/run).

The check passes on the tree, and fails on a scratch copy where one import up the layers is planted (at module
level, deferred in a function, or under TYPE_CHECKING: every kind counts). Every top-level module and package of the
product is in exactly one layer, so a new module cannot be left out of the contracts.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def _check(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(root / ".ci" / "layers")], capture_output=True, text=True, timeout=120,
                          check=False, env={"PYTHON": sys.executable, "PATH": "/usr/bin:/bin"})


def test_the_tree_keeps_every_layer_contract() -> None:
    done = _check(ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout


def test_a_relative_python_is_found_after_the_check_leaves_for_its_temporary_tree() -> None:
    """``PYTHON=.venv/bin/python .ci/layers`` (or ``.ci/typecheck``), run from the project: the scripts work in a
    temporary tree of symlinks, where a relative interpreter path would name nothing."""
    relative = Path(sys.executable).absolute()
    relative_text = str(relative.relative_to(ROOT)) if relative.is_relative_to(ROOT) else str(relative)
    done = subprocess.run(["bash", ".ci/layers"], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
                          env={"PYTHON": relative_text, "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0 and "0 broken" in done.stdout, done.stdout + done.stderr


PLANTS = [
    # (file, line added, the contract that breaks)
    ("persistence/store.py", "import openroute.confirmation\n", "Layers"),
    ("openroute/definitions/route.py", "import openroute_reference\n", "Layers"),
    ("openroute/dsl.py", "def _late() -> None:\n    from openroute.engine import Engine  # noqa: F401\n",
     "Definitions do not import the runtime"),
    ("openroute/definitions/interceptors.py",
     "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import openroute.engine.states\n",
     "Definitions do not import the runtime"),
    # the definitions sit under the DSL that builds them
    ("openroute/definitions/sub_route.py", "def _late() -> None:\n    import openroute.dsl  # noqa: F401\n", "Layers"),
    ("openroute/streams/protocol.py", "import sqlalchemy  # noqa: F401\n", "streams imports only the standard library"),
    ("openroute/spark/audit.py", "import openroute.admin  # noqa: F401\n", "Edges are independent"),
    ("openroute/definitions/body.py", "def _late() -> None:\n    import openroute.runtime.tracing  # noqa: F401\n",
     "Definitions do not import the runtime"),
    # the wire (the HTTP server's protocol under the app) sits below the definitions and the runtime
    ("openroute/wire/request_deadline.py", "import openroute.engine.core  # noqa: F401\n", "Layers"),
    ("openroute/wire/proxy_headers.py", "def _late() -> None:\n    import openroute.dsl  # noqa: F401\n", "Layers"),
    ("openroute/wire/header_limits.py", "import openroute  # noqa: F401\n",
     "Only the application imports the package root"),
    # outbound and confirmation are edges, independent of the others both ways
    ("openroute/alerts/rules.py", "def _late() -> None:\n    import openroute.outbound.http  # noqa: F401\n",
     "Edges are independent"),
    ("openroute/outbound/soap.py", "import openroute.inbound.parsing  # noqa: F401\n", "Edges are independent"),
    ("openroute/alerts/notifiers.py", "import openroute.confirmation  # noqa: F401\n", "Edges are independent"),
    ("openroute/engine/outcome.py", "import openroute  # noqa: F401\n",
     "Only the application imports the package root"),
    # the shared floor sits below the edges, its two packages independent; a command imports no edge itself
    ("openroute/auth/headers.py", "def _late() -> None:\n    import openroute.confirmation.service  # noqa: F401\n",
     "Layers"),
    ("openroute/queries/messages.py", "import openroute.auth.errors  # noqa: F401\n",
     "The shared parts are independent"),
    ("openroute/commands/db.py", "def _late() -> None:\n    import openroute.admin.api  # noqa: F401\n",
     "The commands import no edge"),
    # confirmation/ imports only the store (DESIGN.md's layout table)
    ("confirmation/policy.py", "def _late() -> None:\n    import openroute.definitions.clock  # noqa: F401\n",
     "confirmation imports only the store"),
    # retry imports errors: errors importing retry closes a circle inside the definitions' package
    ("openroute/definitions/errors.py", "def _late() -> None:\n    import openroute.definitions.retry  # noqa: F401\n",
     "No import cycle"),
]


def test_planted_violations_fail_the_check(tmp_path: Path) -> None:
    """One scratch copy with one violation per contract (a single import-linter run names all of them)."""
    for name in ("openroute", "persistence", "confirmation", "routes", ".ci"):
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    for path, line, _ in PLANTS:
        target = tmp_path / path
        target.write_text(target.read_text(encoding="utf-8") + "\n" + line, encoding="utf-8")
    done = _check(tmp_path)
    assert done.returncode != 0, done.stdout
    broken = done.stdout.split("Broken contracts", 1)[-1]
    for _, _, contract in PLANTS:
        assert contract in broken, f"{contract}: {done.stdout}"
    assert "- .retry -> .errors" in broken  # the cycle, as import-linter names it
    for path, line, contract in PLANTS[:-1]:
        module = path.removesuffix(".py").replace("/", ".")
        if not module.startswith("openroute."):  # persistence/ and confirmation/ install under openroute
            module = f"openroute.{module}"
        target = re.findall(r"^\s*(?:from|import) ([\w.]+)", line, re.MULTILINE)[-1]
        caught = _reported(_section(broken, contract), module, target)
        assert caught, f"{module} -> {target} ({contract}): {done.stdout}"


def _section(broken: str, contract: str) -> str:
    """What import-linter says under one broken contract (from its name to the next contract's)."""
    names = "|".join(re.escape(name) for name in {name for _, _, name in PLANTS} - {contract})
    start = re.search(rf"^{re.escape(contract)}", broken, re.MULTILINE)
    assert start, contract
    end = re.search(rf"^({names})", broken[start.end():], re.MULTILINE)
    return broken[start.end():start.end() + end.start()] if end else broken[start.end():]


def _reported(section: str, module: str, target: str) -> bool:
    """Whether the planted import ``module -> target`` is a link of a chain that starts at ``module`` (or at a
    package holding it): the import itself is caught, not a chain from elsewhere that passes through it."""
    chains: list[list[tuple[str, str]]] = []
    for text in section.splitlines():
        link = re.match(r"^(-)?\s*([\w.]+) (->|imports) ([\w.]+) \(", text)
        if link is None:  # a heading, a blank line, or "& other importer" of the same link
            continue
        if link[1] or link[3] == "imports" or not chains:
            chains.append([])
        chains[-1].append((link[2], link[4]))
    return any((module, target) in chain and (module == chain[0][0] or module.startswith(chain[0][0] + "."))
               for chain in chains)


def _contracts() -> dict[str, dict[str, Any]]:
    with (ROOT / "pyproject.toml").open("rb") as file:
        config = tomllib.load(file)
    return {contract["id"]: contract for contract in config["tool"]["importlinter"]["contracts"]}


def _layers() -> list[list[str]]:
    """The layers contract's layers, top (application) first, each as the modules it names."""
    return [[name.strip() for name in re.split(r"[:|]", layer)] for layer in _contracts()["layers"]["layers"]]


def _layer_of(module: str) -> list[str]:
    return next(layer for layer in _layers() if module in layer)


def test_every_module_of_the_product_is_in_exactly_one_layer() -> None:
    """The top-level modules and packages of ``openroute`` (a package's layer covers its submodules), the store,
    the confirmations and the reference application; the root ``openroute/__init__.py`` is the application's
    surface, kept by its own contract."""
    package = ROOT / "openroute"
    product = {f"openroute.{path.stem}" for path in package.glob("*.py") if path.name != "__init__.py"}
    product |= {f"openroute.{path.name}" for path in package.iterdir() if (path / "__init__.py").is_file()}
    product |= {"openroute.persistence", "openroute.confirmation", "openroute_reference"}
    named = [module for layer in _layers() for module in layer]
    twice = sorted({module for module in named if named.count(module) > 1})
    assert not twice, f"in more than one layer: {twice}"
    missing, unknown = sorted(product - set(named)), sorted(set(named) - product)
    assert not missing, f"in no layer of [tool.importlinter] (pyproject.toml): {missing}"
    assert not unknown, f"layers name modules that do not exist: {unknown}"


def test_the_other_contracts_cover_the_modules_of_their_layers() -> None:
    contracts = _contracts()
    application = _layer_of("openroute.server")
    below_application = {module for layer in _layers() if layer != application for module in layer}
    # each package with its modules (`.**`: the contract does not treat its sources as packages)
    assert {name.removesuffix(".**") for name in contracts["surface"]["source_modules"]} == below_application
    definitions = set(_layer_of("openroute.dsl")) | set(_layer_of("openroute.definitions"))
    assert set(contracts["definitions-no-runtime"]["source_modules"]) == definitions
    assert set(contracts["definitions-no-runtime"]["forbidden_modules"]) == set(_layer_of("openroute.engine"))
    assert set(_layer_of("openroute.inbound")) == set(contracts["edges"]["modules"])
    assert set(contracts["commands-no-edges"]["forbidden_modules"]) == set(_layer_of("openroute.inbound"))
    assert set(contracts["shared"]["modules"]) == set(_layer_of("openroute.queries"))
    every = {module for layer in _layers() for module in layer}
    store_and_itself = {"openroute.persistence", "openroute.confirmation"}
    assert set(contracts["confirmation-imports"]["forbidden_modules"]) == every - store_and_itself


def test_the_edges_contract_keeps_at_most_three_exceptions() -> None:
    """What several edges share lives one floor below them (docs/architecture.md names and explains each
    exception); a fourth one means a shared part is still inside an edge."""
    assert len(_contracts()["edges"].get("ignore_imports", [])) <= 3


def test_the_root_holds_the_entry_points_and_the_layers_are_packages() -> None:
    """A module at the root of ``openroute/`` is an entry point of the application or the DSL that route authors
    write with; every other module lives in the package of its layer (docs/architecture.md, "Layers")."""
    application = set(_layer_of("openroute.server"))
    root = {f"openroute.{path.stem}" for path in (ROOT / "openroute").glob("*.py") if path.name != "__init__.py"}
    assert root - application == {"openroute.dsl"}, sorted(root - application)
