"""`dflash-chat bench`: DFlash vs autoregressive decoding with the same engine, measured in one run."""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from dflash_chat.bench.load import busy_cores, wait_policy
from dflash_chat.bench.synthetic_vision import image_size
from dflash_chat.commands.run import check_device
from dflash_chat.errors import UserError
from dflash_chat.settings import flag, ranged

PROMPTS = 4
DEMO_PROMPTS = 8  # per class
DEMO_REPEATS = 3  # runs of each answer, the median counts (bench/demo_pair.py)
AGAINST_PROMPTS = 4  # code prompts of `--demo --against`
DECISIONS_PROMPTS = 4  # prompts a class of `--demo --decisions` (the sampled leg answers each twice)
AGAINST_PAIRS = 3  # runs of each tree, in turn
TOOLS_PROMPTS = 48  # per class of `--tools`: every held-out chat with a call (16 without, 12 prose questions)
SYNTHETIC_MODELS = ("qwen3.6-27b", "qwen3.6-35b-a3b", "qwen3.8-27b")  # bench/synthetic_models.py holds their shapes


def register(subparsers) -> None:
    from dflash_chat.settings import Settings

    app = Settings()
    p = subparsers.add_parser("bench", help="measure DFlash against plain decoding")
    p.add_argument(
        "--demo",
        action="store_true",
        help="the embedded trained demo pair: held-out code questions, raw code (no chat template), prose "
        "questions and copy-heavy prompts (repeat or lightly edit a given code block or paragraph); plain "
        "decoding, each method alone at a fixed depth (each shipped drafter, DFlash and DFlash2, at a 16-token "
        "verify; the target's MTP layer 1, 2 and 3 deep; prompt lookup up to 15) and auto beside each drafter, "
        "greedy (every method's text must equal plain decoding's, else the exit status is 1) and sampled (seed "
        "i for a class's i-th prompt)",
    )
    p.add_argument(
        "--tools",
        action="store_true",
        help="the demo pair on held-out tool chats (tool names never trained on): the share of requests "
        "answered with one call to the right tool with arguments its schema accepts, of questions no tool fits "
        "answered in text, and of answers after a tool's result that quote it; plain decoding and the DFlash2 "
        "drafter (a fixed 16-token verify and auto), its τ on these turns beside prose questions', greedy "
        "(DFlash2's text must equal plain decoding's, else the exit status is 1) and sampled",
    )
    p.add_argument(
        "--structured",
        action="store_true",
        help="the demo pair on answers held to a grammar: JSON for held-out schemas and forced tool calls on the "
        "held-out tool chats; per method (plain, DFlash, MTP, lookup, auto, auto without forced-token drafts): "
        "the share valid for the schema with and without the constraint, the share cut inside a value, τ and "
        "speedup, and the constraint's cost; the mask's cost per token on Qwen3's 151k vocabulary and each "
        "schema's compile time (greedy answers must be the same under every method, else the exit status is 1)",
    )
    p.add_argument(
        "--decisions",
        nargs="?",
        const="",
        metavar="COSTS",
        help="with --demo: auto's choices scored without timing noise (its step costs frozen, every draft and verify "
        "it ran priced from one table): per class and temperature, plain decoding's price for the same tokens over "
        "auto's; COSTS, an earlier run's JSON (or its `costs`), prices two trees alike (default: measured at "
        "warm-up); --prompts a class (default 4), the sampled leg --seeds a prompt",
    )
    p.add_argument(
        "--seeds",
        type=ranged(int, 1, 64),
        help="--decisions: sampled answers per prompt (default 2; comparing two choosers' sampled figures takes more)",
    )
    p.add_argument(
        "--against",
        metavar="REV",
        help="with --demo: this tree's decode steps against commit REV's, measured in one run (REV checked out into "
        "a temporary git worktree; a process per tree, the two taking turns answer by answer; each answer's fastest "
        "of --repeats runs counts, default 3; --prompts code prompts, default 4): per step kind this tree's time "
        "over REV's, each tree's DFlash over plain and its host time per step (a guard: a step that grew shows "
        "before it lands)",
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
        default=None,
        help=f"prompts (default {PROMPTS}; with --demo per class, at most as many as the class has, default "
        f"{DEMO_PROMPTS}: the sampled leg's answers differ from plain decoding's, and four a class left its "
        f"ratios 10-40%% apart between runs; with --tools per class, default {TOOLS_PROMPTS})",
    )
    p.add_argument(
        "--repeats",
        type=ranged(int, 1, 100),
        default=None,
        help=f"--demo: runs of each answer, in turn with the other settings' (default {DEMO_REPEATS}); the one "
        "with the median decode time per token counts (one busy moment of the machine moved a class's figures "
        "by 5-10%% between runs); --tools: the same (default 1: its figures are shares over many turns); "
        "--synthetic: timed calls of each step, after the warm-up, the median counting (default 20 on a GPU, 3 on "
        "the CPU)",
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
        "--load",
        type=ranged(int, 0, 256),
        default=0,
        help="--demo, --structured, --tools: N processes beside the run that keep a core busy each (a busy machine, "
        "as a user's is)",
    )
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
        "--image",
        metavar="WxH",
        action="append",
        type=image_size,
        help="--synthetic: also the vision tower on an image of this size (repeat for several in one prompt), beside "
        "the prefill of the same prompt: time, weights, peak memory (with --layers the tower is cut in proportion); "
        "--demo: the size the image class's pictures are drawn at",
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


def _pair(args) -> int:
    """A tiny random target, or --target/--drafter: DFlash against plain decoding (dflash_chat/bench/pairs.py)."""
    from dflash_chat.bench import pairs

    if args.target:
        log = (lambda *_: None) if args.json else print
        measured = pairs.measure_real(
            args.target, args.drafter, device=args.device, prompts=args.prompts, tokens=args.tokens, log=log
        )
    else:
        with tempfile.TemporaryDirectory() as tmp:
            measured = pairs.measure_random(
                Path(tmp),
                arch=args.arch,
                hidden=args.hidden,
                layers=args.layers or 8,
                device=args.device,
                dtype=args.dtype,
                prompts=args.prompts,
                tokens=args.tokens,
                block=args.block,
                acceptance=args.acceptance,
                vs_transformers=args.vs_transformers,
            )
    print(json.dumps(measured.as_dict()) if args.json else measured.report())
    return 0 if measured.comparison.lossless else 1


def _demo(args) -> int:
    """The embedded demo pair per prompt class, draft setting and temperature (dflash_chat/bench/demo_pair.py)."""
    from dflash_chat.bench import demo_pair

    legs = demo_pair.sampling_legs(args.temperature, args.top_p, args.top_k)
    figures = demo_pair.run(
        prompts=args.prompts,
        max_new_tokens=args.tokens,
        legs=legs,
        device=args.device or "cpu",
        repeats=args.repeats or DEMO_REPEATS,
        image_sizes=args.image or (),
    )
    figures["setup"] |= {"load": args.load, "wait_policy": wait_policy()}
    print(json.dumps(figures) if args.json else demo_pair.format_report(figures))
    return 0 if figures["identical"] else 1


def _decisions(args) -> int:
    """auto's choices on the demo pair, priced from one table (dflash_chat/bench/decisions.py)."""
    from dflash_chat.bench import decisions, demo_pair

    figures = decisions.run(
        prompts=args.prompts,
        max_new_tokens=args.tokens,
        legs=demo_pair.sampling_legs(args.temperature, args.top_p, args.top_k),
        costs_file=Path(args.decisions) if args.decisions else None,
        device=args.device or "cpu",
        seeds=args.seeds or decisions.SEEDS,
    )
    print(json.dumps(figures) if args.json else decisions.format_report(figures))
    return 0


def _against(args) -> int:
    """This tree's per-step times against an earlier commit's (dflash_chat/bench/step_guard.py)."""
    from dflash_chat.bench import step_guard

    log = (lambda *_: None) if args.json else (lambda line: print(line, flush=True))
    figures = step_guard.run(
        args.against,
        threads=args.threads or 1,
        prompts=args.prompts,
        tokens=args.tokens,
        pairs=args.repeats or AGAINST_PAIRS,
        log=log,
    )
    figures["setup"] |= {"load": args.load, "wait_policy": wait_policy()}  # the probes inherit the wait policy
    print(json.dumps(figures) if args.json else step_guard.format_report(figures))
    return 0


def _structured(args) -> int:
    """The demo pair on answers held to a grammar (dflash_chat/bench/structured.py)."""
    from dflash_chat.bench import demo_pair, structured

    figures = structured.run(
        prompts=args.prompts,
        max_new_tokens=args.tokens,
        legs=demo_pair.sampling_legs(args.temperature, args.top_p, args.top_k),
        device=args.device or "cpu",
    )
    print(json.dumps(figures) if args.json else structured.format_report(figures))
    return 0 if figures["identical"] else 1


def _tools(args) -> int:
    """The demo pair on held-out tool chats, per class and temperature (dflash_chat/train/tool_bench.py)."""
    from dflash_chat.bench import demo_pair
    from dflash_chat.train import tool_bench

    figures = tool_bench.run(
        prompts=args.prompts,
        max_new_tokens=args.tokens,
        legs=demo_pair.sampling_legs(args.temperature, args.top_p, args.top_k),
        device=args.device or "cpu",
        repeats=args.repeats or 1,
    )
    print(json.dumps(figures) if args.json else tool_bench.format_report(figures))
    return 0 if figures["identical"] else 1


def _http(args) -> int:
    """The same greedy answers in-process and through `serve` on loopback (dflash_chat/bench/http_overhead.py)."""
    from dflash_chat.bench import http_overhead

    title, figures = http_overhead.measure(
        demo=args.demo,
        target=args.target,
        drafter=args.drafter,
        prompts=args.prompts,
        tokens=args.tokens,
        device=args.device,
    )
    print(json.dumps({"setup": title, **figures}) if args.json else http_overhead.report(figures, title))
    return 0 if figures["same_text"] else 1


def _synthetic(args) -> int:
    """A real model's shapes with random packed weights (dflash_chat/bench/synthetic.py)."""
    from dflash_chat.bench import synthetic

    setup = synthetic.Setup.on(
        args.device,
        model=args.synthetic,
        quant=args.quant,
        layers=args.layers,
        vocab=args.vocab,
        decode=args.decode,
        tokens=args.tokens,
        vs_transformers=args.vs_transformers,
        images=tuple(args.image or ()),
        repeats=args.repeats,
    )
    log = (lambda *_: None) if args.json else print
    figures = synthetic.run(setup, log=log)
    if args.save:
        path = synthetic.save(figures, args.save)
        log(f"saved {path}")
    print(json.dumps(figures) if args.json else synthetic.format_report(figures))
    return 0 if all(d["identical_to_ar"] for d in figures["dflash"]) or figures["dtype"] != "float32" else 1


def _check(args) -> None:
    """Flags that do not go together, refused before anything loads."""
    synthetic_only = [
        flag for flag, value in (("--quant", args.quant), ("--vocab", args.vocab), ("--save", args.save)) if value
    ]
    if synthetic_only and not args.synthetic:
        raise UserError(f"{', '.join(synthetic_only)} go with --synthetic MODEL")
    if args.image and (args.http or not (args.synthetic or args.demo)):
        raise UserError("--image goes with --synthetic MODEL (the vision tower's cost) or --demo (its image class)")
    if args.decisions is not None and (not args.demo or args.against or args.http or args.load or args.repeats):
        raise UserError(
            "--decisions scores auto's choices on the demo pair without timing them: use it with --demo, and "
            "leave out --against, --http, --load and --repeats"
        )
    if args.seeds and args.decisions is None:
        raise UserError("--seeds goes with --demo --decisions (its sampled answers per prompt)")
    if args.decisions is not None and args.image:
        raise UserError("--decisions scores the text classes: leave out --image")
    if args.against and (not args.demo or args.tools or args.structured or args.http or args.target or args.synthetic):
        raise UserError("--against REV compares the demo pair's steps with commit REV's: use it with --demo alone")
    if args.against and (args.temperature is not None or args.top_p is not None or args.top_k is not None):
        raise UserError("--against measures greedy steps: leave out --temperature, --top-p and --top-k")
    if args.structured and (args.demo or args.tools or args.target or args.synthetic or args.http):
        raise UserError("--structured measures the demo pair on its own: leave out the other modes")
    if args.tools and (args.demo or args.target or args.synthetic or args.http or args.vs_transformers):
        raise UserError(
            "--tools measures the demo pair on its own: leave out --demo, --target, --synthetic, --http "
            "and --vs-transformers"
        )
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
    if sampling and (not (args.demo or args.tools or args.structured) or args.http):
        raise UserError(
            f"{', '.join(sampling)} go with --demo, --tools or --structured (their sampled leg; --http measures "
            "greedy answers)"
        )
    if args.demo or args.tools or args.structured:
        from dflash_chat.bench.demo_pair import sampling_legs

        sampling_legs(args.temperature, args.top_p, args.top_k)  # refuses what does not go together
    if args.load and (not (args.demo or args.tools or args.structured) or args.http):
        raise UserError("--load goes with --demo, --tools or --structured (it busies cores beside the engine)")
    if args.repeats and (not (args.demo or args.tools or args.synthetic) or args.http):
        raise UserError(
            "--repeats goes with --demo, --tools or --synthetic (their answers or steps are run that many times, "
            "the median counts; with --against, the runs of each answer in each tree)"
        )
    if args.target and not args.drafter:
        raise UserError("give --drafter DIR with --target DIR")
    if args.drafter and not args.target:
        raise UserError("--drafter needs --target (without both, bench builds a tiny random target)")


def main(args: argparse.Namespace) -> int:
    _check(args)
    check_device(args.device)
    if args.prompts is None:
        args.prompts = (
            AGAINST_PROMPTS
            if args.against
            else DECISIONS_PROMPTS
            if args.decisions is not None
            else TOOLS_PROMPTS
            if args.tools
            else DEMO_PROMPTS
            if (args.demo and not args.http) or args.structured
            else PROMPTS
        )
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.http:
        return _http(args)
    with busy_cores(args.load):
        if args.tools:
            return _tools(args)
        if args.structured:
            return _structured(args)
        if args.against:
            return _against(args)
        if args.decisions is not None:
            return _decisions(args)
        if args.demo:
            return _demo(args)
    if args.synthetic:
        return _synthetic(args)
    return _pair(args)
