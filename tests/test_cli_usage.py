"""Usage errors of every command: one line and the usage, exit 2, never a traceback.

typer ships its own copy of click; the CLI catches the exceptions of the click typer really
uses (`loopwright.cli.errors.CLICK_ERRORS`). Every command and group is tried in a new process
(`runtime_fixtures.cli`), as a user types it: with an option it does not have, and without what
it requires.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.core import TyperOption

from loopwright import __version__
from loopwright.cli import app
from tests.runtime_fixtures import PATIENCE_S, REPO, cli


def command_paths() -> list[tuple[str, ...]]:
    group = typer.main.get_command(app)
    paths: list[tuple[str, ...]] = [()]
    for name, command in group.commands.items():  # type: ignore[attr-defined]
        paths.append((name,))
        for sub in getattr(command, "commands", {}):
            paths.append((name, sub))
    return paths


@pytest.mark.parametrize("path", command_paths(), ids=lambda p: " ".join(p) or "loopwright")
def test_an_unknown_option_is_one_line_and_the_usage(path: tuple[str, ...]) -> None:
    result = cli(*path, "--frobnicate", env={})
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    lines = result.stderr.strip().splitlines()
    assert lines[0] == "loopwright: error: No such option: --frobnicate"
    assert lines[1].startswith("usage: loopwright") and len(lines) == 2


@pytest.mark.parametrize(
    "args",
    [
        ("run",),
        ("run", "a task"),
        ("resume",),
        ("show",),
        ("cancel",),
        ("approvals", "approve", "x"),
    ],
    ids=" ".join,
)
def test_a_missing_argument_or_option_is_one_line_and_the_usage(args: tuple[str, ...]) -> None:
    result = cli(*args, env={})
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines[0].startswith("loopwright: error: Missing ") and len(lines) == 2


@pytest.mark.parametrize("args", [(), ("approvals",)], ids=["loopwright", "approvals"])
def test_a_group_without_a_command_prints_its_help(args: tuple[str, ...]) -> None:
    result = cli(*args, env={})
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "Usage: loopwright" in result.stdout


def test_version() -> None:
    result = cli("--version", env={})
    assert (result.returncode, result.stdout.strip()) == (0, f"loopwright {__version__}")


@pytest.mark.parametrize("args", [("--help",), ("run", "--help"), ("approvals", "list", "--help")])
def test_help_imports_no_runtime(args: tuple[str, ...]) -> None:
    """Help is read before anything runs: it must not wait for LangGraph, LangChain or a
    database driver to import (seconds on a loaded 2-core machine)."""
    probe = (
        "import sys\n"
        "from loopwright.cli import main\n"
        f"sys.argv = ['loopwright', *{list(args)!r}]\n"
        "try:\n    main()\nexcept SystemExit as exc:\n    assert exc.code == 0, exc.code\n"
        "heavy = ('langgraph', 'langchain_core', 'psycopg', 'httpx', 'loopwright.runner')\n"
        "print(sorted(m for m in sys.modules if m.startswith(heavy)))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO, timeout=PATIENCE_S
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]", result.stdout[-500:]


def described(command: typer.core.TyperCommand | typer.core.TyperGroup) -> list[str]:
    """The parameters of `command` and every command under it that have no help text."""
    missing = [f"{command.name} {p.name}" for p in command.params if not getattr(p, "help", "")]
    for sub in getattr(command, "commands", {}).values():
        missing += described(sub)
    return missing


def test_every_argument_and_option_is_described() -> None:
    assert described(typer.main.get_command(app)) == []  # type: ignore[arg-type]


@pytest.mark.parametrize("path", command_paths(), ids=lambda p: " ".join(p) or "loopwright")
def test_help_shows_what_to_type(path: tuple[str, ...]) -> None:
    """A flag takes no value, so its help shows no `<bool>`; an option shows its value's name;
    a group's help lists every command it has."""
    result = cli(*path, "--help", env={})
    assert result.returncode == 0, result.stderr
    assert "<bool>" not in result.stdout and "<str>  " not in result.stdout.split("Options")[-1]
    group = typer.main.get_command(app)
    for name in path:
        group = group.commands[name]  # type: ignore[attr-defined]
    for name in getattr(group, "commands", {}):
        assert f" {name} " in result.stdout, name


def test_shell_completion_completes_commands_and_options() -> None:
    def complete(words: str) -> list[str]:
        result = subprocess.run(
            [sys.executable, "-m", "loopwright"],
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=PATIENCE_S,
            env={
                **os.environ,
                "_LOOPWRIGHT_COMPLETE": "complete_bash",
                "COMP_WORDS": words,
                "COMP_CWORD": str(len(words.split()) - (0 if words.endswith(" ") else 1)),
            },
        )
        assert result.returncode == 0, result.stderr
        return result.stdout.split()

    assert complete("loopwright ap") == ["approvals"]
    assert complete("loopwright approvals ") == ["list", "approve", "reject", "edit"]
    assert "--comment" in complete("loopwright approvals reject apr_1 --c")


def numeric_options() -> list[tuple[tuple[str, ...], str]]:
    """(command path, option) for every option of every command that takes a number."""
    group = typer.main.get_command(app)
    found = []
    for path in command_paths()[1:]:
        command = group
        for name in path:
            command = command.commands[name]  # type: ignore[attr-defined]
        for param in command.params:
            if isinstance(param, TyperOption) and param.type_descriptor.annotation in (int, float):
                found.append((path, max(param.opts, key=len)))
    return found


@pytest.mark.parametrize(
    ("path", "option"), numeric_options(), ids=lambda v: " ".join(v) if isinstance(v, tuple) else v
)
@pytest.mark.parametrize("value", ["nan", "inf", "-1e300", "99999999999999999999"])
def test_a_number_out_of_an_options_range_is_one_line_and_the_usage(
    path: tuple[str, ...], option: str, value: str, tmp_path: Path
) -> None:
    """Not a traceback from wherever it would first overflow (a timer, a date, a socket)."""
    result = cli(*path, f"{option}={value}", env={"LOOPWRIGHT_HOME": str(tmp_path)})
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines[0].startswith(f"loopwright: error: Invalid value for '{option}'"), lines
    assert len(lines) == 2 and lines[1].startswith("usage: loopwright")


@pytest.mark.parametrize("value", ["abc", "0", "-1", "nan", "inf", "1e300"])
def test_a_lease_time_to_live_that_is_no_number_of_seconds_is_one_line(
    value: str, tmp_path: Path
) -> None:
    """LOOPWRIGHT_LEASE_TTL_S is read before anything opens, and named when it is wrong."""
    result = cli(
        "run",
        "Read order O-42.",
        "--user",
        "u-1",
        env={"LOOPWRIGHT_HOME": str(tmp_path), "LOOPWRIGHT_LEASE_TTL_S": value},
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr == (
        f"loopwright: error: LOOPWRIGHT_LEASE_TTL_S={value!r}: a lease's time to live is seconds"
        " above 0, at most 86400\n"
    )
    assert not (tmp_path / "loopwright.sqlite3").exists()  # nothing opened


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("LOOPWRIGHT_TRACE", "maybe"),
        ("LOOPWRIGHT_TRACE", "of"),
        ("LOOPWRIGHT_TRACE_RAW_ARGS", "ture"),
    ],
)
def test_a_tracing_switch_neither_on_nor_off_is_one_line(
    variable: str, value: str, tmp_path: Path
) -> None:
    """A typo in a switch is named, not read as "on": `of` traced every run, and `ture` left
    tool arguments out of the trace while the operator thought them in."""
    result = cli(
        *("run", "Read order O-42.", "--user", "u-1"),
        env={"LOOPWRIGHT_HOME": str(tmp_path), variable: value},
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr == (
        f"loopwright: error: {variable}={value!r}: expected on or off (1 or 0, true or false)\n"
    )
    assert not (tmp_path / "loopwright.sqlite3").exists()  # nothing opened


@pytest.mark.parametrize("command", [("run", "Read order O-42.", "--user", "u-1"), ("worker",)])
def test_a_home_that_cannot_be_a_directory_is_one_line(
    command: tuple[str, ...], tmp_path: Path
) -> None:
    """LOOPWRIGHT_HOME naming a file (or a path no directory can be made at) is named in one
    line, not a FileExistsError's traceback. (The embedded default's home: no DATABASE_URL.)"""
    home = tmp_path / "a-file"
    home.write_text("not a directory")
    result = cli(*command, env={"LOOPWRIGHT_HOME": str(home), "DATABASE_URL": ""})
    assert result.returncode == 2, result.stderr
    assert result.stderr == (
        f"loopwright: error: LOOPWRIGHT_HOME={home} cannot be the directory of loopwright's"
        " files: File exists\n"
    )
