"""The README and the pages of docs/ are tested like code: every ```python block runs as written and every relative
link points to a file (and heading) that exists.

Fences: ```python is a block that runs; ```python no-run is an excerpt (a signature, a fragment) and is skipped;
```python services=rabbitmq runs when the service is there (skipped with the reason on a laptop, a failure in CI).
A block whose first line is ``# <name>.py`` is a file of the reader's project: every such file (of every page) is
written into the project directory the blocks run in; the ``test_*.py`` files are run by pytest there, as a user's
project with no pytest configuration at all (so ``asyncio_mode`` is strict), the others are imported. Each block
runs in a subprocess with a fresh temporary directory as its working directory, with ``__name__`` set to
``"docs_example"``: a ``if __name__ == "__main__":`` guard (a server that runs until stopped) is not run.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.services import rabbitmq_problem, require

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RUNNABLE, EXCERPT = "python", "python no-run"
SERVICES = {"rabbitmq": ("RabbitMQ", rabbitmq_problem)}
FILE_NAME = re.compile(r"#\s+(\w+\.py)\b")
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
TIMEOUT = 180


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    info: str
    code: str

    @property
    def file_name(self) -> str | None:
        first = self.code.splitlines()[0] if self.code.strip() else ""
        match = FILE_NAME.match(first)
        return match.group(1) if match else None

    @property
    def services(self) -> list[str]:
        return [word.partition("=")[2] for word in self.info.split()[1:] if word.startswith("services=")]

    def __str__(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def fences(page: Path) -> tuple[list[Block], list[tuple[int, str]]]:
    """The fenced blocks of a page (any language) and the lines outside them (for the link check)."""
    blocks, outside, fence = [], [], None
    for number, line in enumerate(page.read_text().splitlines(), 1):
        if fence is None and line.startswith("```"):
            fence = (number, line[3:].strip(), [])
        elif fence is not None and line.strip() == "```":
            blocks.append(Block(page, fence[0], fence[1], "\n".join(fence[2]) + "\n"))
            fence = None
        elif fence is not None:
            fence[2].append(line)
        else:
            outside.append((number, line))
    assert fence is None, f"{page.relative_to(ROOT)}:{fence[0]}: a code fence is never closed"
    return blocks, outside


def python_blocks() -> list[Block]:
    return [block for page in PAGES for block in fences(page)[0] if block.info.split()[:1] in (["python"], ["py"])]


def runnable(block: Block) -> bool:
    return block.info.split()[1:2] != ["no-run"]


BLOCKS = python_blocks()
PROJECT_FILES = {block.file_name: block for block in BLOCKS if runnable(block) and block.file_name}
SCRIPTS = [block for block in BLOCKS if runnable(block) and not block.file_name]
TEST_FILES = sorted(name for name in PROJECT_FILES if name.startswith("test_"))


def _project(directory: Path) -> dict[str, str]:
    """Write the reader's project files into ``directory``; the environment the blocks run with."""
    for name, block in PROJECT_FILES.items():
        (directory / name).write_text(block.code)
    env = {key: value for key, value in os.environ.items() if not key.startswith("PYTEST_")}
    env["PYTHONPATH"] = str(directory)
    return env


def _require_services(block: Block) -> None:
    for service in block.services:
        require(*SERVICES[service])


def test_the_pages_have_blocks_and_every_python_block_is_runnable_or_marked() -> None:
    assert len(PAGES) > 10 and SCRIPTS and TEST_FILES
    wrong = [f"{block}: ```{block.info}" for block in BLOCKS
             if block.info != RUNNABLE and block.info != EXCERPT
             and not (block.info.startswith(RUNNABLE + " ") and block.services
                      and all(service in SERVICES for service in block.services)
                      and len(block.info.split()) == 1 + len(block.services))]
    assert not wrong, "a python block is ```python (runs), ```python no-run (an excerpt) or " \
                      f"```python services=rabbitmq: {wrong}"
    names = [block.file_name for block in BLOCKS if runnable(block) and block.file_name]
    assert len(names) == len(set(names)), f"two blocks write the same project file: {names}"


@pytest.mark.parametrize("block", SCRIPTS, ids=str)
def test_python_block_runs_as_written(block: Block, tmp_path: Path) -> None:
    _require_services(block)
    env = _project(tmp_path)
    script = tmp_path / "docs_example.py"
    script.write_text(block.code)
    done = subprocess.run(
        [sys.executable, "-c", "import runpy, sys; runpy.run_path(sys.argv[1], run_name='docs_example')", str(script)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=TIMEOUT,
    )
    assert done.returncode == 0, f"{block} failed:\n{done.stdout}\n{done.stderr}"


@pytest.mark.parametrize("name", TEST_FILES)
def test_documented_tests_pass_in_a_project_without_pytest_configuration(name: str, tmp_path: Path) -> None:
    env = _project(tmp_path)
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "my-routes"\nversion = "0.1"\n')  # no [tool.pytest]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", name],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=TIMEOUT,
    )
    output = done.stdout + done.stderr
    assert "asyncio: mode=Mode.STRICT" in output, output  # pytest-asyncio's default: nothing set by the project
    assert done.returncode == 0 and " passed" in output and "skipped" not in output, f"{name}:\n{output}"


@pytest.mark.parametrize("name", sorted(set(PROJECT_FILES) - set(TEST_FILES)))
def test_documented_modules_import(name: str, tmp_path: Path) -> None:
    env = _project(tmp_path)
    done = subprocess.run([sys.executable, "-c", f"import {name.removesuffix('.py')}"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    assert done.returncode == 0, f"{PROJECT_FILES[name]} ({name}) does not import:\n{done.stderr}"


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: markup dropped, lower case, punctuation removed, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "").strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    found, seen = set(), {}
    for _number, line in fences(page)[1]:
        match = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if match:
            base = slug(match.group(1))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
    return found


def test_slug_follows_github() -> None:
    assert slug("Set up") == "set-up"
    assert slug("The message lifecycle (`benchmarks/lifecycle_bench.py`)") == \
        "the-message-lifecycle-benchmarkslifecycle_benchpy"
    assert slug("Admin API (HTTP Basic, role `admin`)") == "admin-api-http-basic-role-admin"


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_relative_link_points_to_an_existing_file_and_heading(page: Path) -> None:
    broken = []
    for number, line in fences(page)[1]:
        for target in LINK.findall(re.sub(r"`[^`]*`", "", line)):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            if ROOT not in file.parents and file != ROOT:
                broken.append(f"{number}: {target} leaves the repository")
            elif not file.exists():
                broken.append(f"{number}: {target} does not exist")
            elif anchor and (file.suffix != ".md" or anchor not in anchors(file)):
                broken.append(f"{number}: {target} has no heading #{anchor}")
    assert not broken, f"{page.relative_to(ROOT)}: {broken}"
