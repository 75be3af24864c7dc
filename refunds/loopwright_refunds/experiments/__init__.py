"""The fault-injection experiment: does the runtime remove duplicate effects and unauthorized
actions, and at what cost, compared with the stock LangGraph agent and a plain agent loop?

One scripted policy (`experiments.policy`) drives three systems (`experiments.systems`) through
a matrix of scenarios and faults (`experiments.matrix`); every trial is judged against the
business system's own storage (`experiments.truth`), aggregated (`experiments.metrics`) and
written as JSON, Markdown and PNG (`experiments.report`, `experiments.plots`).

    python -m loopwright_refunds.experiments --repetitions 3 --out .loopwright/experiment
"""
