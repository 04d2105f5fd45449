"""The streams example in the README must keep working."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_example_runs(capsys) -> None:
    section = README.read_text().partition("## Reactive Streams (`openroute.streams`)")[2]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code is not None, "the streams section of the README lost its example"
    exec(compile(code.group(1), str(README), "exec"), {"__name__": "docs_example"})
    assert capsys.readouterr().out.split() == ["a", "b"]
