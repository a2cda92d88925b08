"""How torch's CPU threads wait for work: asleep (OpenMP's PASSIVE policy), not spinning.

torch's CPU build runs its ops on GNU OpenMP threads, which by default spin for a while at every barrier.
On a machine where another process holds a core, a spinning thread shares that core with it, and every op
waits for the thread that got its core last: through `run --demo` on this 2-core machine with other work on
it, plain decoding at torch's 2 threads made 4.5 tok/s, at 1 thread 19-23, and at 2 threads with PASSIVE
38-52; `bench --demo --load 1` (one busy process) measured about 110 tok/s, the quiet speed, against about
35 spinning. OpenMP reads the variable once, as torch loads, so the CLI places it before anything imports
torch; a value the user set is theirs."""

from __future__ import annotations

import os

WAIT_POLICY = "OMP_WAIT_POLICY"


def place_wait_policy(environ=os.environ) -> None:
    environ.setdefault(WAIT_POLICY, "PASSIVE")
