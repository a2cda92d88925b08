"""The steps the decode loop drives: prefill, draft, verify k, commit, and the step's one host read.

`Steps` is given the target, the drafter and the state (never the Engine). Every decode step has fixed
shapes: the committed length, the last token, the tokens left and the stop ids live in small device
tensors, and a step of size T verifies T = k + 1 tokens [last, d1..dk] (k = 0: a plain decode step).
On CUDA each entry point is captured once per size in use as a CUDA graph and replayed; elsewhere (or
when capture fails) the same functions run uncaptured, reading only the cache rows in use.

- draft(T): the drafter's B-token block at the committed length -> the T-1 drafts a verify of T reads
  (the block runs whole, its rows attend to each other; the LM head and DFlash2's walk run on T-1 rows);
  at T>0 they are drawn from the drafter's processed distribution q, which the verify needs;
- verify(T): the target's T-token forward over [last, d1..d(T-1)] (GDN state untouched when T > 1), then
  the verify rule on the device (sampling.accept), the tokens cut at a stop token and at the tokens left;
- commit(T): GDN layers keep the accepted prefix (a masked re-run of the recurrence), the drafter stores
  the verified rows' context (rows past the accepted ones are overwritten before they are read), the
  length and last token move, and the result ([tokens, n, accepted]) is queued for the host;
- read: the one host read of a step, after the loop has queued the next draft.
"""

from dflash_chat.engine.steps.clock import Clock
from dflash_chat.engine.steps.decode import MAX_STOPS, StepResult, Steps

__all__ = ["Clock", "MAX_STOPS", "StepResult", "Steps"]
