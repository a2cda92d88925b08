"""`dflash-chat bench`: DFlash vs autoregressive decoding with the same engine, measured in one run."""

from __future__ import annotations

import argparse
import json
import random
import tempfile
from pathlib import Path

from dflash_chat.commands.run import check_device
from dflash_chat.errors import UserError
from dflash_chat.settings import flag, ranged

SYNTHETIC_MODELS = ("qwen3.6-27b", "qwen3.6-35b-a3b", "qwen3.8-27b")  # engine/synthetic.py holds their shapes


def register(subparsers) -> None:
    from dflash_chat.settings import Settings

    app = Settings()
    p = subparsers.add_parser("bench", help="measure DFlash against plain decoding")
    p.add_argument(
        "--demo",
        action="store_true",
        help="the embedded trained demo pair with its real drafter: held-out "
        "code questions, raw code (no chat template) and prose questions; plain decoding, a fixed 16-token "
        "verify and auto, greedy (DFlash's text must equal plain decoding's, else the exit status is 1) "
        "and sampled (seed i for a class's i-th prompt)",
    )
    p.add_argument("--target", help="a target folder, with --drafter: measure that pair")
    p.add_argument("--drafter")
    p.add_argument(
        "--arch",
        default="qwen3_5",
        choices=["qwen3_5", "qwen3_5_moe", "qwen3"],
        help="tiny random target's architecture",
    )
    p.add_argument("--hidden", type=ranged(int, 8, 16384), default=256, help="tiny random target's hidden size")
    p.add_argument(
        "--layers",
        type=ranged(int, 1, 512),
        help="layer count of the tiny random target (default 8) or of the --synthetic model (default: all of them)",
    )
    p.add_argument(
        "--acceptance",
        type=ranged(float, 0.0, 1.0),
        default=0.8,
        help="per-token acceptance of the error-injecting drafter",
    )
    p.add_argument("--block", type=ranged(int, 1, 256), default=16, help="block size of the error-injecting drafter")
    p.add_argument(
        "--prompts",
        type=ranged(int, 1, 10_000),
        default=4,
        help="prompts (with --demo: per class, at most as many as the class has)",
    )
    p.add_argument("--tokens", type=flag("max_new_tokens"), default=128, help="new tokens per prompt")
    # --demo's sampled leg; None: the app's default (settings.py)
    p.add_argument(
        "--temperature",
        type=flag("temperature"),
        help=f"--demo: the sampled leg's temperature (default: the app's, {app.temperature}); the greedy leg "
        "(temperature 0) runs too, unless this is 0: then it alone runs",
    )
    p.add_argument(
        "--top-p", type=flag("top_p"), help=f"--demo: the sampled leg's top-p (default: the app's, {app.top_p})"
    )
    p.add_argument(
        "--top-k", type=flag("top_k"), help=f"--demo: the sampled leg's top-k (default: the app's, {app.top_k})"
    )
    p.add_argument("--device")
    p.add_argument(
        "--dtype",
        choices=["float32", "bfloat16", "float16"],
        help="tiny random target's dtype (default: bfloat16 on CUDA, float32 on CPU); float32 keeps greedy runs bit-comparable",
    )
    p.add_argument("--threads", type=ranged(int, 1, 4096), help="torch CPU threads")
    p.add_argument(
        "--vs-transformers",
        action="store_true",
        help="also time transformers' own generate() on the same tiny random target",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="the figures as one JSON object; with --demo: setup, then "
        'temperatures -> classes -> plain and drafts ("15", "auto") -> tau, acceptance_rate, speedup, '
        "median_speedup, mean_draft_length, identical",
    )
    p.add_argument(
        "--synthetic",
        metavar="MODEL",
        choices=sorted(SYNTHETIC_MODELS),
        help=f"a real model's shapes with random packed weights ({', '.join(sorted(SYNTHETIC_MODELS))}): "
        "step times against the memory-bandwidth floor, kernels per step, tok/s",
    )
    p.add_argument(
        "--quant",
        choices=["Q4_K_M", "Q8_0", "bf16"],
        help="--synthetic weights: a llama.cpp quant mix or bf16 (default Q4_K_M; bf16 on the CPU)",
    )
    p.add_argument(
        "--vocab",
        type=ranged(int, 16, 1 << 20),
        help="--synthetic: cut the vocabulary (default: the model's; 4096 on the CPU, "
        "where the real one would take minutes per token)",
    )
    p.add_argument(
        "--decode",
        choices=["auto", "graphs", "fixed", "eager"],
        default="auto",
        help="--synthetic: the decode path (default: CUDA graphs on a GPU, eager steps on the CPU)",
    )
    p.add_argument(
        "--http",
        action="store_true",
        help="with --demo (or --target/--drafter): requests/s and tok/s "
        "through `serve`'s streaming HTTP API against in-process, on one loaded pair (the HTTP overhead)",
    )
    p.add_argument(
        "--save",
        metavar="DIR",
        help="--synthetic: also write the figures as JSON into DIR (the project keeps GPU runs under bench/results/)",
    )
    p.set_defaults(handler=main)


def _random_pair(args, tmp: Path):
    import torch

    from dflash_chat.engine.load import load_target
    from dflash_chat.engine.oracle import OracleDrafter
    from dflash_chat.engine.spec import Engine
    from dflash_chat.tiny import write_target

    hf = write_target(tmp, args.arch, hidden=args.hidden, layers=args.layers or 8, seed=0)
    target = load_target(tmp, args.device, getattr(torch, args.dtype) if args.dtype else None)
    args.hf_model = hf
    args.target_device = {target.model.norm.weight.device}
    args.target_dtype = target.model.norm.weight.dtype
    context = 64 + args.tokens + args.block
    ar = Engine(target, None, max_context=context)
    rng = random.Random(0)
    prompts = [[rng.randrange(target.cfg.vocab_size) for _ in range(32)] for _ in range(args.prompts)]

    def spec_for(prompt, ar_tokens):
        oracle = OracleDrafter(
            prompt + ar_tokens,
            target.cfg.vocab_size,
            block_size=args.block,
            accept_prob=args.acceptance,
            seed=len(ar_tokens),
        )
        return Engine(target, oracle, max_context=context)

    title = (
        f"tiny random {args.arch} target (hidden {args.hidden}, {args.layers or 8} layers) on {target.model.norm.weight.device}; "
        f"autoregressive decoding first, to learn the true continuation, then DFlash with an error-injecting "
        f"drafter (block {args.block}, each drafted token right with probability {args.acceptance})"
    )
    return ar, spec_for, prompts, title


REAL_QUESTIONS = (
    "Show the function that joins path components in posixpath.",
    "What does the with statement do?",
    "Write a function that reads a JSON file.",
    "How do I sort a list of tuples by the second item?",
    "Show the class definition of OrderedDict.",
    "What is a generator expression?",
)


def _real_pair(args, target_dir, drafter_dir):
    from dflash_chat.chat.prompt import build_prompt, stop_token_ids
    from dflash_chat.engine.load import load_drafter, load_pair
    from dflash_chat.engine.spec import Engine

    import time

    from dflash_chat import disk
    from dflash_chat.engine.load import model_bytes, resolve_model_path
    from dflash_chat.sizes import rate_text, size_text

    # the disk first (its cache dropped), then the load: the load reads what the disk has
    disk_rate, dropped = disk.read_rate(disk.largest_file(resolve_model_path(target_dir, "target")[1]))
    t0 = time.perf_counter()
    pair = load_pair(target_dir, None, device=args.device, max_context=4096)
    seconds = time.perf_counter() - t0
    size = model_bytes(target_dir)
    args.load_figures = {
        "load_bytes": size,
        "load_s": seconds,
        "load_bytes_per_s": size / seconds,
        "disk_read_bytes_per_s": disk_rate,
        "disk_cache_dropped": dropped,
    }
    if not args.json:
        print(
            f"loaded the target ({size_text(size)}) in {seconds:.1f} s: {rate_text(size / seconds)}; the disk reads "
            f"it at {rate_text(disk_rate)}" + ("" if dropped else " (page cache not dropped: may be memory's)")
        )
    drafter = load_drafter(drafter_dir, pair.engine.target)
    spec = Engine(pair.engine.target, drafter, max_context=4096)
    questions = REAL_QUESTIONS[: args.prompts]
    prompts = [build_prompt(pair.tokenizer, [{"role": "user", "content": q}], thinking=False).ids for q in questions]
    stops = stop_token_ids(pair.tokenizer, extra=pair.engine.target.cfg.eos_token_id)
    return pair.engine, (lambda prompt, ar_tokens: spec), prompts, stops


def _demo(args) -> int:
    """The embedded demo pair per prompt class, draft setting and temperature (dflash_chat/demo_bench.py)."""
    from dflash_chat import demo_bench

    legs = demo_bench.sampling_legs(args.temperature, args.top_p, args.top_k)
    figures = demo_bench.run(prompts=args.prompts, max_new_tokens=args.tokens, legs=legs, device=args.device or "cpu")
    print(json.dumps(figures) if args.json else demo_bench.format_report(figures))
    return 0 if figures["identical"] else 1


def _http(args) -> int:
    """The same greedy answers in-process and through `serve` on loopback (dflash_chat/serve/bench.py)."""
    from dflash_chat.engine.load import load_pair
    from dflash_chat.serve import bench

    if args.demo:
        from dflash_chat.demo import demo_paths
        from dflash_chat.train.evaluate import demo_heldout_prompts

        target, drafter = demo_paths()
        chats = demo_heldout_prompts()[: args.prompts]
        title = "embedded demo pair"
    else:
        target, drafter = args.target, args.drafter
        chats = [[{"role": "user", "content": q}] for q in REAL_QUESTIONS][: args.prompts]
        title = f"{args.target} + {args.drafter}"
    pair = load_pair(target, drafter, device=args.device, max_context=4096)
    figures = bench.run(pair, chats, args.tokens)
    title = (
        f"{title}: {len(chats)} chats, greedy, {args.tokens} new tokens at most, one at a time; "
        "in-process (the app's engine session) vs streamed through serve's HTTP API on loopback"
    )
    print(json.dumps({"setup": title, **figures}) if args.json else bench.report(figures, title))
    return 0 if figures["same_text"] else 1


def _synthetic(args) -> int:
    from dflash_chat import synthetic_bench
    from dflash_chat.engine.load import default_device

    import torch

    device = torch.device(args.device) if args.device else default_device()
    on_cpu = device.type == "cpu"
    setup = synthetic_bench.Setup(
        model=args.synthetic,
        quant=args.quant or ("bf16" if on_cpu else "Q4_K_M"),
        layers=args.layers,
        vocab=args.vocab or (4096 if on_cpu else None),
        device=str(device),
        decode=args.decode,
        tokens=args.tokens,
        prompt_tokens=32 if on_cpu else 256,
        repeats=3 if on_cpu else 20,
        vs_transformers=args.vs_transformers,
    )
    log = (lambda *_: None) if args.json else print
    figures = synthetic_bench.run(setup, log=log)
    if args.save:
        path = synthetic_bench.save(figures, args.save)
        log(f"saved {path}")
    print(json.dumps(figures) if args.json else synthetic_bench.format_report(figures))
    return 0 if all(d["identical_to_ar"] for d in figures["dflash"]) or figures["dtype"] != "float32" else 1


def _check(args) -> None:
    """Flags that do not go together, refused before anything loads."""
    synthetic_only = [
        flag for flag, value in (("--quant", args.quant), ("--vocab", args.vocab), ("--save", args.save)) if value
    ]
    if synthetic_only and not args.synthetic:
        raise UserError(f"{', '.join(synthetic_only)} go with --synthetic MODEL")
    if args.synthetic and (args.demo or args.target):
        raise UserError("--synthetic measures random weights at a model's shapes: leave out --demo and --target")
    if args.http and not (args.demo or args.target):
        raise UserError("--http measures a real pair: add --demo, or --target DIR --drafter DIR")
    if args.http and args.synthetic:
        raise UserError("--http measures a real pair through the API: leave out --synthetic")
    if args.vs_transformers and (args.demo or args.target):
        raise UserError(
            "--vs-transformers times transformers on the tiny random target only: leave out --demo and --target"
        )
    sampling = [
        flag
        for flag, value in (("--temperature", args.temperature), ("--top-p", args.top_p), ("--top-k", args.top_k))
        if value is not None
    ]
    if sampling and (not args.demo or args.http):
        raise UserError(f"{', '.join(sampling)} go with --demo (its sampled leg; --http measures greedy answers)")
    if args.demo:
        from dflash_chat.demo_bench import sampling_legs

        sampling_legs(args.temperature, args.top_p, args.top_k)  # refuses what does not go together
    if args.target and not args.drafter:
        raise UserError("give --drafter DIR with --target DIR")
    if args.drafter and not args.target:
        raise UserError("--drafter needs --target (without both, bench builds a tiny random target)")


def main(args: argparse.Namespace) -> int:
    _check(args)
    check_device(args.device)
    import torch

    from dflash_chat.bench import compare, report
    from dflash_chat.engine.sampling import SamplingParams

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.http:
        return _http(args)
    if args.demo:
        return _demo(args)
    if args.synthetic:
        return _synthetic(args)
    hf = None
    if args.target:
        ar, spec_for, prompts, stops = _real_pair(args, args.target, args.drafter)
        title = f"{args.target} + {args.drafter}, greedy"
        result = compare(ar, spec_for, prompts, SamplingParams(max_new_tokens=args.tokens, stop_token_ids=stops))
    else:
        with tempfile.TemporaryDirectory() as tmp:
            ar, spec_for, prompts, title = _random_pair(args, Path(tmp))
            result = compare(ar, spec_for, prompts, SamplingParams(max_new_tokens=args.tokens))
            if args.vs_transformers:
                hf = _time_transformers(args, prompts, result)
    if args.json:
        print(json.dumps({"setup": title, **result.as_dict(), **(hf or {}), **getattr(args, "load_figures", {})}))
    else:
        print(report(result, title))
        if hf:
            print(
                f"  transformers    {hf['transformers_tokens_per_s']:8.1f} tok/s (generate, greedy, same weights; "
                f"same tokens: {'yes' if hf['transformers_identical'] else 'NO'})\n"
                f"  ours AR / transformers {hf['ar_vs_transformers']:.2f}x, DFlash / transformers {hf['dflash_vs_transformers']:.2f}x"
            )
    return 0 if result.lossless else 1


def _time_transformers(args, prompts, result) -> dict:
    """transformers' own generate() on the tiny target: decode tok/s measured like ours (after the first token)."""
    import time

    import torch

    hf = args.hf_model
    device = next(iter(args.target_device))
    hf = hf.to(device=device, dtype=args.target_dtype)  # same precision as ours
    hf.generation_config.eos_token_id = None  # our runs have no stop token either
    hf.generation_config.pad_token_id = 0
    tokens = seconds = 0.0
    identical = True
    for prompt, ours in zip(prompts, result.ar):
        ids = torch.tensor([prompt], device=device)
        # an explicit mask: otherwise generate() masks prompt tokens that equal the pad id
        kw = dict(attention_mask=torch.ones_like(ids), do_sample=False)
        n = len(ours.tokens)
        with torch.no_grad():
            hf.generate(ids, max_new_tokens=1, **kw)  # prefill + first token, timed apart
            t0 = time.perf_counter()
            one = hf.generate(ids, max_new_tokens=1, **kw)
            t1 = time.perf_counter()
            out = hf.generate(ids, max_new_tokens=n, **kw)
            t2 = time.perf_counter()
        del one
        seconds += max((t2 - t1) - (t1 - t0), 1e-9)
        tokens += n - 1
        identical &= out[0, len(prompt) :].tolist() == ours.tokens
    rate = tokens / seconds
    return {
        "transformers_tokens_per_s": rate,
        "transformers_identical": identical,
        "ar_vs_transformers": result.ar_tokens_per_s / rate,
        "dflash_vs_transformers": result.spec_tokens_per_s / rate,
    }
