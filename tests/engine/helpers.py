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


def run_in_interpreter(script: str, kernel: str, *args: str) -> str:
    """Run tests/engine/<script> [args] in a child process under Triton's interpreter (TRITON_INTERPRET must be
    set before triton is imported) with the `kernel` kernels (ATTENTION, GDN, or "ATTENTION,GDN") selected; it
    must exit 0; returns what it printed (the caller asserts on it)."""
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
        **{f"DFLASH_CHAT_TRITON_{name}": "1" for name in kernel.split(",")},
    }
    env.pop("DFLASH_CHAT_NO_TRITON", None)
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).with_name(script)), *args],
        env=env,
        cwd=root,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout
