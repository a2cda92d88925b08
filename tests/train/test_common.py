"""The training loop both models share: schedule, skipped steps, logging and the time cap."""

from __future__ import annotations

import torch

from dflash_chat.train.common import Schedule, run_steps


def _quadratic():
    weight = torch.nn.Parameter(torch.tensor([3.0, -2.0]))

    def step(i: int):
        if i == 1:
            return None  # nothing to train on this step
        loss = (weight**2).sum()
        return loss, {"norm": weight.detach().norm()}

    return weight, step


def test_run_steps_trains_logs_and_skips():
    weight, step = _quadratic()
    logs: list[str] = []
    losses = run_steps("toy", [weight], Schedule(steps=6, lr=0.1, warmup=1, log_every=3), step, logs.append)
    assert len(losses) == 5 and losses[-1] < losses[0] == 13.0
    assert [line.split(" (")[0].split(" loss")[0] for line in logs] == ["toy step 3/6", "toy step 6/6"]
    assert all(" norm " in line for line in logs)


def test_run_steps_stops_at_the_time_cap():
    weight, step = _quadratic()
    logs: list[str] = []
    losses = run_steps("toy", [weight], Schedule(steps=50, max_seconds=0.0), step, logs.append)
    assert len(losses) == 1
    assert logs[-1] == "toy: stopped by the 0s cap after 1 of 50 steps"
