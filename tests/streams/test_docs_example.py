"""The streams example of docs/streams.md must keep working."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "docs" / "streams.md"


def test_readme_example_runs(capsys) -> None:
    section = README.read_text().partition("# Reactive Streams (`openroute.streams`)")[2]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code is not None, "docs/streams.md lost its example"
    exec(compile(code.group(1), str(README), "exec"), {"__name__": "docs_example"})
    assert capsys.readouterr().out.split() == ["a", "b"]
