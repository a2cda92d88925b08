from dflash_chat.engine.events import Finished, Prefilled, Step


def run(engine, prompt, params, cancel=None):
    """(tokens, Finished event, events) of one generation."""
    tokens, events = [], []
    finished = None
    for event in engine.generate(prompt, params, cancel):
        events.append(event)
        if isinstance(event, Step):
            tokens.extend(event.token_ids)
        elif isinstance(event, Finished):
            finished = event
    return tokens, finished, events


def prefilled(events) -> Prefilled:
    return next(e for e in events if isinstance(e, Prefilled))


def interpreted(argv: list, *, kernels: str = "", timeout: float = 600) -> str:
    """Run `python <argv>` in a child process under Triton's interpreter (TRITON_INTERPRET must be set before
    triton is imported), one thread, from the repository root, with the `kernels` kernels (ATTENTION, GDN, or
    "ATTENTION,GDN"; "": none named) selected; it must exit 0; returns what it printed (the caller asserts on it)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    import pytest

    pytest.importorskip("triton")
    root = Path(__file__).resolve().parents[2]
    env = {
        **os.environ,
        "TRITON_INTERPRET": "1",
        "PYTHONPATH": str(root),
        "OMP_NUM_THREADS": "1",
        **{f"DFLASH_CHAT_TRITON_{name}": "1" for name in kernels.split(",") if name},
    }
    env.pop("DFLASH_CHAT_NO_TRITON", None)
    proc = subprocess.run(
        [sys.executable, *map(str, argv)],
        env=env,
        cwd=root,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def run_in_interpreter(script: str, kernel: str, *args: str) -> str:
    """`interpreted` on tests/engine/<script> [args] with the `kernel` kernels selected."""
    from pathlib import Path

    return interpreted([Path(__file__).with_name(script), *args], kernels=kernel)


def full_and_short_drafts(engine, sampled: bool, T: int = 4) -> list[tuple]:
    """[(drafts, q rows)] of a full draft's first T - 1 rows and of a draft for a verify of T (its LM head and
    walk on T - 1 rows), from the same state and randomness; q is None when greedy."""
    import torch

    from dflash_chat.engine.sampling_params import SamplingParams

    run(engine, [5, 6, 7, 8], SamplingParams(max_new_tokens=3))
    params = SamplingParams(temperature=0.8, top_k=10, top_p=0.9, seed=1) if sampled else SamplingParams()
    steps, out = engine.steps, []
    for size in (engine.drafter.block_size, T):
        steps.begin(3, len(engine.tokens), params, torch.Generator().manual_seed(0))
        steps.draft(size)
        out.append((steps.ids[1:T].clone(), steps.q[: T - 1].clone() if sampled else None))
    return out
