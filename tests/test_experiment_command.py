"""`python -m loopwright_refunds.experiments` as a user or a script runs it: bad input is one
line and exit 2 before anything starts; `--json` is one `loopwright.experiment/1` document with
the fields docs/experiments.md lists; the plots label their axes, count their trials and show their zeros.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from matplotlib.collections import LineCollection

from loopwright_refunds.experiments.metrics import slices
from loopwright_refunds.experiments.plots import ZERO_BARS, figures
from loopwright_refunds.experiments.report import (
    HEADLINE_FIELDS,
    SCENARIO_FIELDS,
    SCHEMA,
    experiment_document,
)
from loopwright_refunds.experiments.scenarios import SKIPS_POLICY
from loopwright_refunds.experiments.trials import TrialResult
from tests import docs_pages
from tests.runtime_fixtures import DURATION, PATIENCE_S, REPO
from tests.test_experiment_parts import trial

PROG = (sys.executable, "-m", "loopwright_refunds.experiments")


def experiment(*args: str, timeout: float = PATIENCE_S) -> subprocess.CompletedProcess[str]:
    """The experiment in a new process, piped, as CI or `| tee` runs it."""
    return subprocess.run(
        [*PROG, *args],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.parametrize(
    ("option", "named"),
    [
        (("--scenario", "partiel"), "argument --scenario: invalid choice: 'partiel'"),
        (("--fault", "crash@nowhere"), "argument --fault: unknown fault 'crash@nowhere'"),
        (("--system", "langgraph"), "argument --system: invalid choice: 'langgraph'"),
        (("-n", "0"), "argument -n/--repetitions: 0 is not at least 1"),
    ],
)
def test_a_bad_filter_is_one_line_and_exit_2(option: tuple[str, ...], named: str) -> None:
    result = experiment("-n", "1", *option) if option[0] != "-n" else experiment(*option)
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr, result.stderr
    assert named in result.stderr and result.stdout == ""


def test_the_valid_values_are_listed_in_help() -> None:
    shown = " ".join(experiment("--help").stdout.split())
    assert "eligible, ineligible, partial," in shown and f"{SKIPS_POLICY}." in shown
    assert "by kind: none, accept_then_timeout," in shown
    assert "crash@executor:after_send," in shown  # whole: a name cut in two cannot be copied
    assert "loopwright, prebuilt, plain_loop." in shown


def test_an_out_that_cannot_be_written_is_refused_before_the_run(tmp_path: Path) -> None:
    """Not after 14 minutes of trials: the directory is made before any service starts."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    result = experiment("-n", "1", "--scenario", SKIPS_POLICY, "--out", str(blocker / "out"))
    assert result.returncode == 2
    assert result.stderr.startswith("python -m loopwright_refunds.experiments: error: cannot")
    assert result.stderr.count("\n") == 1 and "trials 0/" not in result.stderr, result.stderr


def mixed_trials() -> list[TrialResult]:
    """loopwright and prebuilt, with and without a timeout; prebuilt refunds twice after it."""
    return [
        trial(True, 0, False, system="loopwright"),
        trial(
            True,
            0,
            False,
            "partial",
            "accept_then_timeout",
            "accept_then_timeout",
            system="loopwright",
        ),
        trial(True, 0, False),
        trial(False, 1, False, "partial", "accept_then_timeout", "accept_then_timeout"),
        trial(False, 0, False, SKIPS_POLICY, policy_violations=2),
    ]


def test_the_json_document_has_the_headline_per_system_and_a_row_per_scenario(
    tmp_path: Path,
) -> None:
    document = experiment_document(mixed_trials(), tmp_path)
    assert json.loads(json.dumps(document)) == document  # JSON all the way down
    assert document["schema"] == SCHEMA == "loopwright.experiment/1"
    assert (document["trials"], document["repetitions"]) == (5, 1)
    assert document["results"] == str(tmp_path / "results.json")
    ours, theirs = document["systems"]
    assert list(ours) == ["system", *HEADLINE_FIELDS, "outcomes"]
    assert (ours["system"], ours["trials"], ours["duplicate_trials"]) == ("loopwright", 2, 0)
    assert ours["outcomes"] == {"done": 2}
    assert (theirs["system"], theirs["duplicate_effects"], theirs["policy_violations"]) == (
        "prebuilt",
        1,
        2,
    )
    assert theirs["outcomes"] == {
        "done": 1,
        "duplicate refund": 1,
        "policy-violating refund": 1,
    }
    rows = [(r["scenario"], r["system"]) for r in document["scenarios"]]
    assert rows == [
        ("partial", "loopwright"),
        ("partial", "prebuilt"),
        (SKIPS_POLICY, "prebuilt"),
    ]
    assert all(list(r) == ["scenario", "system", *SCENARIO_FIELDS] for r in document["scenarios"])


def test_the_experiments_page_lists_every_field_of_the_json_document() -> None:
    page = docs_pages.text("docs/experiments.md")
    [row] = [line for line in page.splitlines() if line.startswith(f"| `{SCHEMA}`")]
    for name in ("trials", "repetitions", "results", "report", "systems", "scenarios"):
        assert f"`{name}`" in row, name
    for name in (*HEADLINE_FIELDS, *SCENARIO_FIELDS, "outcomes"):
        assert f"`{name}`" in row, name


def test_the_bar_plots_label_axes_count_trials_and_show_their_zeros() -> None:
    trials = mixed_trials()
    drawn = figures(trials, slices(trials))
    assert set(drawn) == {"effects", "success", "latency", "unknown", "chain"}
    for figure in drawn.values():
        for ax in figure.axes:
            assert ax.get_xlabel() and ax.get_ylabel(), ax.get_title()
    duplicates = drawn["effects"].axes[0]
    # Each system's trials in its legend entry, each bar's counts on it.
    legend = duplicates.get_legend()
    assert legend is not None
    assert [t.get_text() for t in legend.get_texts()] == ["loopwright (n=2)", "prebuilt (n=3)"]
    labels = [t.get_text() for t in duplicates.texts]
    assert sorted(labels) == ["0/1", "0/1", "0/2", "1/1"]
    # loopwright's two zero bars and prebuilt's one have a visible stub on the axis.
    stubs = [c for c in duplicates.collections if isinstance(c, LineCollection)]
    assert [c.get_label() for c in stubs] == [ZERO_BARS, ZERO_BARS]
    assert [len(c.get_segments()) for c in stubs] == [2, 1]
    assert all(np.min(c.get_linewidth()) > 1 for c in stubs)  # thicker than the axis


@pytest.mark.slow
@pytest.mark.postgres
def test_the_experiments_page_reads_the_json_document_while_progress_goes_to_stderr_in_lines(
    postgres_server_url: str, tmp_path: Path
) -> None:
    """docs/experiments.md's `--json` pipe, as a user pastes it in a directory of their own: stdout must
    be the one document `json.load` reads, and piped progress whole lines on stderr."""
    env = {
        **os.environ,
        "DATABASE_URL": postgres_server_url,
        "PYTHONPATH": str(REPO),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
    }
    result = subprocess.run(
        [
            "bash",
            "-o",
            "pipefail",
            "-c",
            docs_pages.block_with("docs/experiments.md", "sh", "--system loopwright --json"),
        ],
        cwd=tmp_path,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=PATIENCE_S,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "loopwright 0\n", result.stdout + result.stderr
    assert (tmp_path / ".loopwright" / "experiment" / "report.md").is_file()
    lines = result.stderr.splitlines()
    assert re.fullmatch(rf"trials 0/1 \(0%\), {DURATION} elapsed", lines[0]), result.stderr
    assert re.fullmatch(
        rf"trials 1/1 \(100%\), {DURATION} elapsed, not done: loopwright 0/1; "
        rf"last: loopwright {SKIPS_POLICY} none: done",
        lines[-1],
    ), result.stderr
    assert "\r" not in result.stderr and "\x1b" not in result.stderr
