"""The example in docs/readme/streams.md must keep working."""

from __future__ import annotations

import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "readme" / "streams.md"


def test_readme_example_runs(capsys) -> None:
    code = re.search(r"```python\n(.*?)```", DOC.read_text(), re.S)
    assert code is not None, "the streams documentation lost its example"
    exec(compile(code.group(1), str(DOC), "exec"), {"__name__": "docs_example"})
    assert capsys.readouterr().out.split() == ["a", "b"]
