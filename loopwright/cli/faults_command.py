"""`loopwright faults`: prove the agent under every fault injected around its writes' sends
(`loopwright.testing.faults`), a line per trial and a verdict; exit 1 if it did not hold."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from loopwright.cli.options import AgentOption, DbOption, JsonOption
from loopwright.cli.output import console, print_json

if TYPE_CHECKING:
    from loopwright.testing.faults import Trial

app = typer.Typer()


def trial_line(trial: Trial) -> str:
    """One trial, as a row of the table the command prints."""
    where = f"write {trial.write} ({trial.tool})" if trial.write else "clean run"
    fault = trial.fault.value if trial.fault else "-"
    effects = ", ".join(f"{n}" for n in trial.effects.values()) or "none"
    return (
        f"{trial.scenario}  {where:<28} {fault:<17} {trial.stop_reason or trial.phase:<14}"
        f" effects per intent: {effects:<6} {trial.verdict}"
    )


@app.command()
def faults(
    agent: AgentOption = None,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Prove the agent before production: its scenarios (else its demo) run once clean, then
    under each fault at each write the clean run sent (request lost, answer lost, answer late,
    request delivered late, delivered twice, a process killed before and after the send and
    the run resumed by another), injected around the send whatever the tool's transport. Each
    trial is judged in the business system: effects per intent and whether the ending is
    truthful. Exits 1 if any trial made a duplicate effect, claimed COMPLETED with an effect
    missing, or never met its fault."""
    from loopwright.checkpoints.database import resolve_database_url
    from loopwright.cli import hosting
    from loopwright.testing.faults import prove, scenarios_of

    hosted = hosting.agent_for(agent)
    path = hosting.configured_agent_path(agent) or hosting.DEFAULT_AGENT
    scenarios_of(hosted)  # an agent with nothing to prove it on is refused before anything runs
    url = resolve_database_url(db)

    def show_trial(trial: Trial) -> None:
        if not as_json:
            console.print(trial_line(trial), markup=False)

    proof = prove(hosted, database_url=url, agent_path=path, on_trial=show_trial)
    if as_json:
        print_json(proof.as_json())
    else:
        for skipped in proof.skipped:
            console.print(f"not tried: {skipped}", markup=False)
        console.print(f"the trials' runs: {proof.proof}-* (loopwright show RUN_ID)", markup=False)
        trials, failed = len(proof.trials), len(proof.failures)
        verdict = (
            f"held under every fault tried: {trials} trials, 0 failed"
            if proof.held
            else f"did not hold: {failed} of {trials} trials failed"
        )
        console.print(f"{hosted.name}: {verdict}", markup=False)
    if not proof.held:
        raise typer.Exit(1)
