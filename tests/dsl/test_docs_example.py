"""The example of docs/routes.md and docs/testing.md works as written: its route module and its tests run as a
user's project (no conftest: the ``route_test_kit`` fixture comes from the installed pytest11 plugin)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

DOCS = [Path(__file__).resolve().parents[2] / "docs" / name for name in ("routes.md", "testing.md")]


def _blocks() -> dict[str, str]:
    """Python blocks of the pages whose first line is ``# <file name>.py``, by file name."""
    found = {}
    for block in re.findall(r"```python\n(.*?)```", "".join(doc.read_text() for doc in DOCS), flags=re.S):
        first = block.splitlines()[0]
        if first.startswith("# ") and first.split()[1].endswith(".py"):
            found[first.split()[1]] = block
    return found


def test_the_documented_routes_and_their_tests_pass(tmp_path: Path) -> None:
    blocks = {name: code for name, code in _blocks().items() if name in {"crm_routes.py", "test_crm_routes.py"}}
    assert set(blocks) == {"crm_routes.py", "test_crm_routes.py"}
    for name, code in blocks.items():
        (tmp_path / name).write_text(code)
    (tmp_path / "pytest.ini").write_text("[pytest]\nasyncio_mode = auto\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PYTHONPATH"] = str(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0 and "5 passed" in output, output
    # the module loads as `openroute run --routes crm_routes:application` would, up to the WSDL files
    check = subprocess.run(
        [sys.executable, "-c", "import crm_routes; from openroute.dsl import Application; "
         "from openroute.testing import CallRecorder as C; "
         "app = crm_routes.build_application(C(), C(), C()); assert isinstance(app, Application); "
         "print(sorted(r.operation for r in app.routes))"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60, env=env,
    )
    assert check.stdout.strip() == "['createOrder', 'createOrderLine', 'setCustomer']", check.stderr
