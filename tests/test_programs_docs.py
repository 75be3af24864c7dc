"""docs/programs.md: its example, run as a user would (a script of its own, in a directory of
its own, on the embedded SQLite default), prints what the page says it prints."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests import docs_pages
from tests.runtime_fixtures import PATIENCE_S, REPO

PAGE = (REPO / "docs" / "programs.md").read_text()
SECTION = "An example"


def test_the_programs_page_example_runs_and_prints_what_the_page_says(tmp_path: Path) -> None:
    [example] = docs_pages.blocks("docs/programs.md", "python", SECTION)
    [printed] = re.findall(r"It prints:\n\n```\n(.*?)```", PAGE, re.DOTALL)
    script = tmp_path / "desk.py"
    script.write_text(example)
    ran = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env={"PYTHONPATH": str(REPO), "LOOPWRIGHT_HOME": str(tmp_path / "home"), "PATH": ""},
        capture_output=True,
        text=True,
        timeout=PATIENCE_S,
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout == printed
