"""An agent is named by import path (`--agent module:attribute`, $LOOPWRIGHT_AGENT, or
`[tool.loopwright] agent` in ./pyproject.toml):
a path that names no agent, or an application whose code fails as it loads, is one line and
exit 2 on the command line, saying what failed, where, and how to see the traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from loopwright._loading import AgentNotFound, load_agent
from tests.runtime_fixtures import cli

MODULES = {
    "raises_at_import": 'raise RuntimeError("no credentials for the ledger")\n',
    "bad_syntax": "def agent(:\n",
    "missing_dependency": "import loopwright_no_such_dependency\n",
    "no_agent_here": "agent = None\n",
    "failing_factory": "def agent():\n    return {}['ledger']\n",
}
CASES = [
    (
        "raises_at_import:agent",
        "importing 'raises_at_import' failed: RuntimeError: no credentials for the ledger at"
        " {dir}/raises_at_import.py:1 (python -c 'import raises_at_import' shows the traceback)",
    ),
    (
        "bad_syntax",
        "importing 'bad_syntax' failed: SyntaxError: invalid syntax at {dir}/bad_syntax.py:1"
        " (python -c 'import bad_syntax' shows the traceback)",
    ),
    (
        "missing_dependency:agent",
        "importing 'missing_dependency' failed: ModuleNotFoundError: No module named"
        " 'loopwright_no_such_dependency' at {dir}/missing_dependency.py:1",
    ),
    ("no_agent_here:agent", "'no_agent_here:agent' is NoneType, not a loopwright Agent"),
    (
        "no_agent_here:ops",
        "module 'no_agent_here' has no 'ops': 'no_agent_here:ops' names no agent",
    ),
    (
        "failing_factory:agent",
        "calling 'failing_factory:agent' failed: KeyError: 'ledger' at {dir}/failing_factory.py:2"
        " (python -c 'from failing_factory import agent; agent()' shows the traceback)",
    ),
    ("no_such_package.agents:agent", "no module 'no_such_package.agents': install the application"),
]


@pytest.fixture
def app_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name, source in MODULES.items():
        (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize(("path", "problem"), CASES)
def test_an_agent_that_cannot_be_loaded_is_one_line_saying_why(
    app_dir: Path, path: str, problem: str
) -> None:
    expected = problem.format(dir=app_dir)
    with pytest.raises(AgentNotFound) as refused:
        load_agent(path)
    assert str(refused.value).startswith(expected), str(refused.value)
    home = {"LOOPWRIGHT_AGENT": path, "LOOPWRIGHT_HOME": str(app_dir / "home")}
    result = cli("run", "Read order O-42.", "--user", "u-1", env=home, expect=2, cwd=app_dir)
    [line] = result.stderr.splitlines()
    assert line.startswith(f"loopwright: error: {expected}"), line
    assert not (app_dir / "home").exists()  # refused before anything opened


@pytest.mark.parametrize(
    ("pyproject", "problem"),
    [
        (b"[tool.loopwright\nagent = 1\n", "Expected ']' at the end of a table declaration"),
        (b"[tool.loopwright]\nagent = 1\n", "tool.loopwright.agent is int: an import path like"),
        (b'[tool]\nloopwright = "app:agent"\n', "tool.loopwright is not a table"),
        (b"tool = 3\n", "tool is not a table"),
        (b"\xff\xfe[tool.loopwright]\n", "'utf-8' codec can't decode byte 0xff"),
    ],
)
def test_a_pyproject_that_names_no_agent_is_one_line_not_the_default_agent(
    tmp_path: Path, pyproject: bytes, problem: str
) -> None:
    """A malformed [tool.loopwright] is named, never passed over for the reference agent (an
    `agent = 1` hosted it), nor a traceback."""
    (tmp_path / "pyproject.toml").write_bytes(pyproject)
    # An empty $LOOPWRIGHT_AGENT names none: the pyproject is read.
    home = {"LOOPWRIGHT_AGENT": "", "LOOPWRIGHT_HOME": str(tmp_path / "home")}
    result = cli("runs", env=home, expect=2, cwd=tmp_path)
    [line] = result.stderr.splitlines()
    assert line.startswith(f"loopwright: error: {tmp_path / 'pyproject.toml'}: {problem}"), line
