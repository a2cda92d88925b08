"""`dflash-chat bench --synthetic MODEL`: the engine at a real model's shapes, with random packed weights.
One file past 500 lines: every figure is measured on the one random-weight pair it builds, into one report.

One run measures, on whatever device is there: the weight bytes a decode step reads and the device's
copy bandwidth (so the step's floor), the autoregressive step against that floor, the B-token verify
against the autoregressive step, the draft step and the accept + commit, the host time per step (in the steps'
entry points, and the decode loop's own around them: GenerationStats.host_s), the
kernels each entry point launches (torch profiler), end to end tokens/s of autoregressive decoding
and of DFlash at forced acceptance lengths (the real drafter runs at its real cost; its proposals are
replaced by an error-injecting oracle's, so the acceptance is what the run asks for), and the target's own
MTP layer's draft step, chained 1-3 deep, as a share of a plain step. With
--vs-transformers, transformers' own bf16 generate() (eager and static cache) on the same shapes.
"""

from __future__ import annotations

import gc
import os
import subprocess
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import torch

from dflash_chat.bench import synthetic_models
from dflash_chat.bench.oracle import OracleDrafter
from dflash_chat.bench.timing import time_call
from dflash_chat.engine.sampling_params import SamplingParams
from dflash_chat.engine.steps.decode import Entry, Steps
from dflash_chat.models.sizes import rate_text, size_text

ACCEPTANCE_LENGTHS = (1, 3, 6)  # tokens per verify step the DFlash runs are forced to
AUTO_LENGTHS = (1, 6)  # auto against plain decoding (nothing accepted) and against whole blocks (6 per step)


@dataclass
class Setup:
    model: str
    quant: str = "Q4_K_M"
    layers: int | None = None
    vocab: int | None = None
    device: str | None = None
    decode: str = "auto"
    tokens: int = 64
    prompt_tokens: int = 256
    repeats: int = 20
    warmups: int = 2  # untimed calls before them: on a GPU the first calls pay for autotuning and allocation
    vs_transformers: bool = False
    # (width, height) of each image of the vision leg (bench/synthetic_vision.py)
    images: tuple[tuple[int, int], ...] = ()

    @classmethod
    def on(
        cls, device: str | None, *, quant: str | None, vocab: int | None, repeats: int | None = None, **given
    ) -> Setup:
        """The setup for `device` (None: the default one): on the CPU bf16 weights, a 4096-token vocabulary,
        a shorter prompt, fewer repeats and one warm-up call, where the real sizes would take minutes per token."""
        from dflash_chat.engine.load import default_device

        chosen = torch.device(device) if device else default_device()
        on_cpu = chosen.type == "cpu"
        return cls(
            quant=quant or ("bf16" if on_cpu else "Q4_K_M"),
            vocab=vocab or (4096 if on_cpu else None),
            device=str(chosen),
            prompt_tokens=32 if on_cpu else 256,
            repeats=repeats or (3 if on_cpu else 20),
            warmups=1 if on_cpu else 2,
            **given,
        )


class InjectedDrafter:
    """The real drafter, run at its real cost, whose proposals an oracle replaces (a forced acceptance)."""

    def __init__(self, real, oracle: OracleDrafter):
        self.real, self.oracle = real, oracle
        self.block_size = real.block_size
        self.target_layer_ids = real.target_layer_ids

    @property
    def ctx_len(self) -> int:
        return self.real.ctx_len

    @ctx_len.setter
    def ctx_len(self, value: int) -> None:
        self.real.ctx_len = self.oracle.ctx_len = value

    def allocate(self, max_context: int) -> None:
        self.real.allocate(max_context)
        self.oracle.allocate(max_context)

    def truncate(self, length: int) -> None:
        self.real.truncate(length)
        self.oracle.truncate(length)

    def append_context(self, features, start: int, rope=None) -> None:
        self.real.append_context(features, start, rope)
        self.oracle.append_context(features, start, rope)

    def store_context(self, features, positions, rope=None) -> None:
        self.real.store_context(features, positions, rope)

    @property
    def ring_windows(self) -> list[int]:
        return self.real.ring_windows

    def save_rings(self) -> list:
        return self.real.save_rings()

    def restore_rings(self, saved: list, length: int) -> None:
        self.real.restore_rings(saved, length)
        self.oracle.restore_rings([], length)

    def row_caches(self) -> list:
        return self.real.row_caches()

    def block_ids(self, device):
        return self.real.block_ids(device)

    def propose(self, ids, span, params, draws, q_out, drafts=None, guide=None):
        self.real.propose(ids, span, params, draws, q_out, drafts)  # timed as run; the oracle's drafts are used
        return self.oracle.propose(ids, span, params, draws, q_out, drafts, guide)


@dataclass
class Report:
    figures: dict = field(default_factory=dict)

    def __setitem__(self, key, value):
        self.figures[key] = value

    def __getitem__(self, key):
        return self.figures[key]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def copy_bandwidth(device: torch.device) -> float:
    """Bytes read + written per second by a device-to-device copy (1 GiB on CUDA, 64 MiB elsewhere)."""
    n = (1 << 30) if device.type == "cuda" else (64 << 20)
    src = torch.empty(n, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return 2 * n / time_call(lambda: dst.copy_(src), device, 10)


def kernels_launched(fn, device: torch.device) -> int:
    """Kernels one call of fn launches on CUDA (torch profiler); elsewhere the operators it runs."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        fn()
        _sync(device)
    events = prof.events()
    if device.type == "cuda":
        return sum(1 for e in events if e.device_type == torch.autograd.DeviceType.CUDA)
    return sum(1 for e in events if e.name.startswith("aten::") and e.cpu_parent is None)


def git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, cwd=Path(__file__).resolve().parent
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def run(setup: Setup, log=print) -> dict:
    from dflash_chat.engine.load import default_device, default_dtype
    from dflash_chat.engine.spec import Engine

    device = torch.device(setup.device) if setup.device else default_device()
    dtype = default_dtype(device)
    if setup.vocab:
        synthetic_models.TARGETS[setup.model] = {**synthetic_models.TARGETS[setup.model], "vocab_size": setup.vocab}
    r = Report()
    r["model"], r["quant"], r["device"] = setup.model, setup.quant, str(device)
    r["gpu"] = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    r["torch"] = torch.__version__
    r["commit"], r["date"] = git_commit(), datetime.now(timezone.utc).isoformat(timespec="seconds")

    t0 = time.perf_counter()
    target = synthetic_models.build_target(setup.model, setup.quant, setup.layers, device, dtype)
    drafter = synthetic_models.build_drafter(setup.model, target, "bf16" if setup.quant == "bf16" else "Q8_0")
    _sync(device)
    r["build_s"] = time.perf_counter() - t0
    cfg = target.cfg
    r["layers"], r["vocab"], r["dtype"] = cfg.num_layers, cfg.vocab_size, str(dtype).removeprefix("torch.")
    r["weight_bytes_per_token"] = synthetic_models.bytes_per_token(target)
    r["drafter_weight_bytes"] = synthetic_models.bytes_per_token(drafter)
    r["copy_bytes_per_s"] = copy_bandwidth(device)
    log(
        f"{setup.model} {setup.quant}, {cfg.num_layers} layers, vocab {cfg.vocab_size} on {r['gpu'] or device} "
        f"({r['build_s']:.1f} s to build): {size_text(r['weight_bytes_per_token'])} of weights per token, "
        f"copy bandwidth {rate_text(r['copy_bytes_per_s'])}"
    )

    context = setup.prompt_tokens + setup.tokens + 64
    prompt = torch.randint(
        0, cfg.vocab_size, (setup.prompt_tokens,), generator=torch.Generator().manual_seed(0)
    ).tolist()
    params = SamplingParams(max_new_tokens=setup.tokens)

    t0 = time.perf_counter()
    ar = Engine(target, None, max_context=context, decode=setup.decode, speculate="none")
    _sync(device)
    r["decode"], r["ar_setup_s"] = ar.decode, time.perf_counter() - t0
    _generate(ar, prompt, params)  # the first run pays for the first-use work
    host0 = ar.steps.host_s
    ar_run = _generate(ar, prompt, params)
    if ar_run.stats.steps:
        r["ar_host_ms_per_step"] = 1e3 * (ar.steps.host_s - host0) / ar_run.stats.steps
        r["ar_loop_host_us_per_step"] = 1e6 * ar_run.stats.host_s / ar_run.stats.steps
    reference = prompt + ar_run.tokens
    oracle = OracleDrafter(reference, cfg.vocab_size, block_size=drafter.block_size, mode="fixed", accept_prob=2)
    t0 = time.perf_counter()
    spec = Engine(
        target,
        InjectedDrafter(drafter, oracle),
        max_context=context,
        decode=setup.decode,
        draft=drafter.block_size - 1,
        speculate="dflash",
    )
    _sync(device)
    r["dflash_setup_s"] = time.perf_counter() - t0
    log(
        f"decode path: {ar.decode}; engine setup (warm-up and capture) {r['ar_setup_s']:.1f} s AR, "
        f"{r['dflash_setup_s']:.1f} s DFlash"
    )

    _steps(r, ar, spec, prompt, setup, device)
    _end_to_end(r, ar_run, spec, oracle, reference, prompt, params)
    del ar, spec
    _mtp_steps(r, target, prompt, setup, device)
    if setup.images:
        from dflash_chat.bench import synthetic_vision

        r["vision"] = synthetic_vision.measure(
            target,
            setup.model,
            setup.images,
            layers=setup.layers,
            prompt_tokens=setup.prompt_tokens,
            decode=setup.decode,
            repeats=setup.repeats,
            warmups=setup.warmups,
        )
        _free(device)
    if setup.vs_transformers:
        del target, drafter
        _free(device)
        r["transformers"] = vs_transformers(setup, device, prompt, log)
    return r.figures


def _generate(engine, prompt, params):
    from dflash_chat.bench.comparison import generate

    engine.reset()
    return generate(engine, prompt, params)


def _free(device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _steps(r: Report, ar, spec, prompt, setup: Setup, device) -> None:
    """Each entry point timed on its own, from a state after a real prefill."""
    reps, warm = setup.repeats, setup.warmups
    B = spec.block_size
    for engine in (ar, spec):
        engine.reset()
        for _ in engine.generate(prompt, SamplingParams(max_new_tokens=2)):
            pass
        engine.steps.begin(1, len(engine.tokens), SamplingParams(), None)
    a, s = ar.steps, spec.steps
    a.remaining.fill_(10**6)
    s.remaining.fill_(10**6)
    decode, verify, draft = (
        (lambda: a._run(Entry(Steps._verify, 1))),
        (lambda: s._run(Entry(Steps._verify, B))),
        (lambda: s._run(Entry(Steps._draft, B))),
    )
    r["ar_step_ms"] = 1e3 * time_call(decode, device, reps, warmups=warm)
    r["verify_ms"] = 1e3 * time_call(verify, device, reps, warmups=warm)
    r["draft_ms"] = 1e3 * time_call(draft, device, reps, warmups=warm)
    start = int(s.start.item())

    def accept_commit():
        s._run(Entry(Steps._accept, B))
        s._run(Entry(Steps._commit, B))

    r["accept_commit_ms"] = 1e3 * time_call(
        accept_commit, device, reps, between=lambda: s.start.fill_(start), warmups=warm
    )
    s.start.fill_(start)
    was = a.graphs, s.graphs
    a.graphs = s.graphs = None  # count the kernels of the uncaptured steps
    r["kernels_per_step"] = {
        "decode": kernels_launched(decode, device),
        "verify": kernels_launched(verify, device),
        "draft": kernels_launched(draft, device),
        "accept_commit": kernels_launched(accept_commit, device),
    }
    a.graphs, s.graphs = was
    s.start.fill_(start)
    floor = r["weight_bytes_per_token"] / r["copy_bytes_per_s"] * 1e3
    r["ar_floor_ms"] = floor
    r["ar_over_floor"] = r["ar_step_ms"] / floor
    r["verify_over_ar"] = r["verify_ms"] / r["ar_step_ms"]
    r["draft_over_verify"] = r["draft_ms"] / r["verify_ms"]


def _mtp_steps(r: Report, target, prompt, setup: Setup, device) -> None:
    """The target's own MTP layer: its draft step chained 1, 2 and 3 deep (each chained forward: the
    embedding, two norms, fc, one attention layer of the target's kind and the target's LM head), timed from a
    state after a real prefill, as a share of a plain (AR) step."""
    from dflash_chat.engine.spec import Engine
    from dflash_chat.engine.speculation import MTP_AUTO

    mtp = synthetic_models.build_mtp(target, setup.quant)
    context = setup.prompt_tokens + setup.tokens + 64
    # the deepest size auto chooses, fixed: a draft setting of auto would time every size first (on the CPU at
    # real shapes, most of a minute), and the steps below are run at each depth by hand
    deepest = MTP_AUTO[-1]
    engine = Engine(target, None, mtp=mtp, max_context=context, decode=setup.decode, draft=deepest, speculate="mtp")
    for _ in engine.generate(prompt, SamplingParams(max_new_tokens=2)):
        pass
    s = engine.steps
    s.begin(1, len(engine.tokens), SamplingParams(), None)
    s.remaining.fill_(10**6)
    r["mtp_weight_bytes"] = synthetic_models.bytes_per_token(mtp)
    head = sum(t.numel() * t.element_size() for t in (*target.lm_head.parameters(), *target.lm_head.buffers()))
    # a chained draft reads the layer's weights and the target's LM head (and one embedding row)
    r["mtp_bytes_over_ar"] = (r["mtp_weight_bytes"] + head) / r["weight_bytes_per_token"]
    steps = {}
    for depth in MTP_AUTO:
        ms = 1e3 * time_call(
            lambda d=depth: s._run(Entry(Steps._draft_mtp, d + 1)), device, setup.repeats, warmups=setup.warmups
        )
        steps[str(depth)] = {"draft_ms": ms, "over_ar_step": ms / r["ar_step_ms"]}
    r["mtp"] = steps
    r["mtp_step_over_ar"] = steps["1"]["over_ar_step"]
    # the decode loop's host time per step around the MTP layer's steps
    run = _generate(engine, prompt, SamplingParams(max_new_tokens=setup.tokens))
    if run.stats.steps:
        r["mtp_loop_host_us_per_step"] = 1e6 * run.stats.host_s / run.stats.steps
    del engine, mtp
    _free(device)


def _end_to_end(r: Report, ar_run, spec, oracle, reference, prompt, params) -> None:
    """DFlash at each forced acceptance length, with a whole block verified every step and with `auto`."""
    r["ar_tokens_per_s"] = ar_run.stats.decode_tokens_per_s
    runs = []
    for draft in (spec.block_size - 1, "auto"):
        spec.set_draft(draft)
        for length in ACCEPTANCE_LENGTHS if draft != "auto" else AUTO_LENGTHS:
            oracle.accept_prob = length - 1  # drafts right before the first wrong one
            oracle.rebase(reference)
            if spec.device.type == "cuda":
                _generate(spec, prompt, params)  # the first run with a new oracle table pays for its copy
            host0 = spec.steps.host_s
            got = _generate(spec, prompt, params)
            stats = got.stats
            entry = {
                "draft": str(draft),
                "forced_acceptance_length": length,
                "mean_acceptance_length": stats.mean_acceptance_length,
                "mean_draft_length": stats.mean_draft_length,
                "tokens_per_s": stats.decode_tokens_per_s,
                "speedup_vs_ar": stats.decode_tokens_per_s / r["ar_tokens_per_s"] if r["ar_tokens_per_s"] else 0.0,
                "identical_to_ar": got.tokens == ar_run.tokens,
            }
            if stats.steps:
                entry["host_ms_per_step"] = 1e3 * (spec.steps.host_s - host0) / stats.steps
                entry["loop_host_us_per_step"] = 1e6 * stats.host_s / stats.steps
                entry["loop_host_us_by_method"] = {
                    name: 1e6 * m.host_s / m.steps for name, m in stats.methods.items() if m.steps
                }
            runs.append(entry)
    r["dflash"] = runs


def vs_transformers(setup: Setup, device, prompt, log) -> dict:
    """transformers' generate() in bf16 (dynamic and static cache) and our bf16 autoregressive decoding, on
    the same shapes with random weights, one after the other (one bf16 copy of the model at a time)."""
    from transformers import AutoModelForCausalLM

    from dflash_chat.engine.spec import Engine

    out: dict = {}
    n = setup.tokens
    ours = synthetic_models.build_target(setup.model, "bf16", setup.layers, device, torch.bfloat16)
    t0 = time.perf_counter()
    engine = Engine(ours, None, max_context=len(prompt) + n + 8, decode=setup.decode, speculate="none")
    setup_s = time.perf_counter() - t0
    _generate(engine, prompt, SamplingParams(max_new_tokens=n))
    run = _generate(engine, prompt, SamplingParams(max_new_tokens=n))
    out["ours_bf16_tokens_per_s"] = run.stats.decode_tokens_per_s
    out["ours_bf16_setup_s"] = setup_s
    del engine, ours
    _free(device)

    raw = dict(
        synthetic_models.TARGETS[setup.model],
        num_hidden_layers=setup.layers or synthetic_models.TARGETS[setup.model]["num_hidden_layers"],
    )
    model_type = raw.pop("model_type").removesuffix("_text")
    cfg = _hf_config(model_type, raw)
    with torch.device(device):
        hf = AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.bfloat16).eval()
    hf.generation_config.eos_token_id = None
    hf.generation_config.pad_token_id = 0
    ids = torch.tensor([prompt], device=device)
    for cache in ("dynamic", "static"):
        kw = dict(attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=n)
        if cache == "static":
            kw["cache_implementation"] = "static"
        try:
            with torch.no_grad():
                hf.generate(ids, **{**kw, "max_new_tokens": 2})
                _sync(device)
                t0 = time.perf_counter()
                hf.generate(ids, **{**kw, "max_new_tokens": 1})
                _sync(device)
                t1 = time.perf_counter()
                hf.generate(ids, **kw)
                _sync(device)
                t2 = time.perf_counter()
            out[f"transformers_{cache}_tokens_per_s"] = (n - 1) / max((t2 - t1) - (t1 - t0), 1e-9)
        except Exception as exc:  # noqa: BLE001 - report what transformers cannot do, keep the rest
            out[f"transformers_{cache}_error"] = f"{type(exc).__name__}: {exc}"[:300]
    best = max((v for k, v in out.items() if k.startswith("transformers_") and k.endswith("tokens_per_s")), default=0)
    out["ours_bf16_over_transformers_best"] = out["ours_bf16_tokens_per_s"] / best if best else None
    log(f"transformers bf16: {out}")
    del hf
    _free(device)
    return out


def _hf_config(model_type: str, raw: dict):
    from transformers import AutoConfig

    if model_type == "qwen3_5":
        from transformers import Qwen3_5TextConfig

        return Qwen3_5TextConfig(**raw)
    if model_type == "qwen3_5_moe":
        from transformers import Qwen3_5MoeTextConfig

        return Qwen3_5MoeTextConfig(**raw)
    return AutoConfig.for_model(model_type, **raw)


def format_report(f: dict) -> str:
    k = f.get("kernels_per_step", {})
    lines = [
        f"{f['model']} {f['quant']} ({f['layers']} layers, vocab {f['vocab']}) on {f['gpu'] or f['device']}, "
        f"{f['dtype']}, decode path: {f['decode']}",
        f"  weights read per token   {size_text(f['weight_bytes_per_token']):>8}   copy bandwidth "
        f"{rate_text(f['copy_bytes_per_s'])}",
        f"  AR step                  {f['ar_step_ms']:8.3f} ms   floor {f['ar_floor_ms']:.3f} ms  -> {f['ar_over_floor']:.2f}x the floor",
        f"  verify-B                 {f['verify_ms']:8.3f} ms   {f['verify_over_ar']:.2f}x the AR step",
        f"  draft                    {f['draft_ms']:8.3f} ms   {f['draft_over_verify']:.0%} of a verify",
    ]
    if "accept_commit_ms" in f:
        lines.append(f"  accept + commit          {f['accept_commit_ms']:8.3f} ms")
    lines.append("  kernels per call         " + ", ".join(f"{name} {n}" for name, n in k.items()))
    host = f", host {f['ar_host_ms_per_step']:.3f} ms/step" if "ar_host_ms_per_step" in f else ""
    host += _loop_host(f.get("ar_loop_host_us_per_step"))
    lines.append(f"  AR decode                {f['ar_tokens_per_s']:8.1f} tok/s{host}")
    for d in f["dflash"]:
        host = f", host {d['host_ms_per_step']:.3f} ms/step" if "host_ms_per_step" in d else ""
        host += _loop_host(d.get("loop_host_us_per_step"))
        lines.append(
            f"  DFlash draft {d['draft']:>4} at length {d['forced_acceptance_length']} {d['tokens_per_s']:8.1f} tok/s   "
            f"{d['speedup_vs_ar']:.2f}x AR (measured {d['mean_acceptance_length']:.2f} tokens/step, "
            f"{d['mean_draft_length']:.1f} drafts/step{host}; "
            f"same tokens as AR: {'yes' if d['identical_to_ar'] else 'no'})"
        )
    if "mtp" in f:
        lines.append(
            f"  MTP draft, 1 deep        {f['mtp']['1']['draft_ms']:8.3f} ms   {f['mtp_step_over_ar']:.0%} of an AR step "
            f"(its weights and the LM head: {f['mtp_bytes_over_ar']:.0%} of the AR step's bytes); 2 deep "
            f"{f['mtp']['2']['over_ar_step']:.0%}, 3 deep {f['mtp']['3']['over_ar_step']:.0%}"
            + _loop_host(f.get("mtp_loop_host_us_per_step"))
        )
    if "vision" in f:
        from dflash_chat.bench.synthetic_vision import image_lines

        lines += image_lines(f["vision"])
    if "transformers" in f:
        t = f["transformers"]
        lines.append(
            f"  bf16: ours {t['ours_bf16_tokens_per_s']:.1f} tok/s; transformers "
            + ", ".join(
                f"{c} {t[f'transformers_{c}_tokens_per_s']:.1f}"
                for c in ("dynamic", "static")
                if f"transformers_{c}_tokens_per_s" in t
            )
            + (
                f" -> ours {t['ours_bf16_over_transformers_best']:.2f}x the best"
                if t.get("ours_bf16_over_transformers_best")
                else ""
            )
        )
    return "\n".join(lines)


def _loop_host(us: float | None) -> str:
    """The decode loop's own host time per step (choosing, bookkeeping, stats), where measured."""
    return "" if us is None else f", loop {us:.0f} µs/step"


def save(figures: dict, folder: str | os.PathLike) -> Path:
    """bench/results/<date>-<device>-<model>-<quant>.json"""
    import json

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    device = (figures.get("gpu") or figures["device"]).replace(" ", "-").lower()
    name = f"{figures['date'][:10]}-{device}-{figures['model']}-{figures['quant']}-{figures['layers']}l.json"
    path = folder / name
    path.write_text(json.dumps(figures, indent=2))
    return path
