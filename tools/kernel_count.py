#!/usr/bin/env python
"""Kernels per layer of each fixed-shape step, with a GPU's kernel choices, counted on this machine (no GPU).

    python tools/kernel_count.py qwen3.6-27b            # decode, verify-16, commit, draft
    python tools/kernel_count.py qwen3.6-35b-a3b --layers 4 --quant bf16 --names

See dflash_chat/bench/launch_count.py for how. `bench --synthetic` on a GPU measures the same steps
with the profiler.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> int:
    from dflash_chat.bench import launch_count, synthetic_models

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", choices=sorted(synthetic_models.TARGETS))
    p.add_argument("--layers", type=int, default=4, help="layers to build (default 4: three GDN, one attention)")
    p.add_argument("--quant", default="Q4_K_M", choices=synthetic_models.MIXES)
    p.add_argument("--names", action="store_true", help="also list the kernels of each layer kind at decode")
    args = p.parse_args(argv)

    steps = launch_count.count_steps(args.model, args.quant, args.layers)
    print(f"{args.model} {args.quant}, {args.layers} layers: kernels per call with the GPU's kernel choices")
    for name in ("decode", "verify", "commit", "draft"):
        tally = getattr(steps, name)
        line = f"  {name:<7} {tally.total:>4} in all"
        if tally.layers:
            kinds = ", ".join(f"{kind} {n}" for kind, n in steps.by_kind(tally).items())
            line += f"; per layer: {kinds}; outside the layers {sum(tally.outside.values())}"
        elif name == "draft":
            line += f" ({steps.drafter_layers} drafter layers)"
        print(line + f"; host reads {tally.host_reads}")
    if args.names:
        shown = set()
        for kind, layer in zip(steps.layer_types, steps.decode.layers, strict=True):
            if kind not in shown:
                shown.add(kind)
                print(f"  decode, one {kind} layer: " + ", ".join(f"{k} x{n}" for k, n in sorted(layer.items())))
        print(
            "  decode, outside the layers: " + ", ".join(f"{k} x{n}" for k, n in sorted(steps.decode.outside.items()))
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
