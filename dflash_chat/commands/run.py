"""`dflash-chat run`: one answer from local model folders, no UI (headless runner)."""

from __future__ import annotations

import argparse
import json
import re
import sys

from dflash_chat.engine import rules
from dflash_chat.errors import UserError
from dflash_chat.settings import flag, rule_flag

CONTEXT = 8192  # tokens allocated unless --context says


def register(subparsers) -> None:
    p = subparsers.add_parser("run", help="answer one prompt with a local pair, no UI")
    p.add_argument("--target", help="target model folder (HF config.json + safetensors + tokenizer)")
    p.add_argument("--drafter", help="DFlash drafter folder")
    p.add_argument("--demo", action="store_true", help="use the embedded tiny demo pair")
    p.add_argument("--prompt", required=True, help="the user's message")
    p.add_argument("--system", help="system prompt")
    # the same rules and messages as the settings of the same meaning (max_new_tokens, temperature, ...)
    p.add_argument(
        "--max-tokens",
        dest="max_new_tokens",
        type=flag("max_new_tokens"),
        default=256,
        help="longest answer, in tokens",
    )
    p.add_argument("--temperature", type=flag("temperature"), default=0.0, help="0 = greedy (0-2)")
    p.add_argument("--top-p", type=flag("top_p"), default=1.0, help="nucleus sampling mass (over 0, at most 1)")
    p.add_argument("--top-k", type=flag("top_k"), default=0, help="keep the k likeliest tokens (0 = off)")
    p.add_argument(
        "--min-p", type=flag("min_p"), default=0.0, help="drop tokens below min-p times the likeliest (0-1, 0 = off)"
    )
    p.add_argument("--seed", type=rule_flag(rules.SEED), help="sampling seed (whole number)")
    # --context and --draft take no default here: the chat's own (None) is in the namespace first, and argparse keeps it
    p.add_argument(
        "--context",
        type=flag("context_length"),
        help=f"context length to allocate (256-1048576; default: the context_length setting, {CONTEXT})",
    )
    p.add_argument(
        "--think",
        action="store_true",
        help="let the model think first (off by default: drafters are trained without thinking)",
    )
    p.add_argument("--no-drafter", action="store_true", help="plain autoregressive decoding (the baseline)")
    p.add_argument("--raw", action="store_true", help="send the prompt as is, without the chat template")
    p.add_argument("--device", help="cpu, cuda, cuda:1 ... (default: cuda when available)")
    p.add_argument(
        "--decode",
        type=flag("decode"),
        metavar="auto|graphs|fixed",
        help="decode path: CUDA graphs on a GPU, the same steps uncaptured elsewhere (auto); fixed never "
        "captures (eager is an older name for it); default: the decode setting",
    )
    p.add_argument(
        "--draft",
        type=flag("draft"),
        metavar="auto|off|N",
        help="drafts each step verifies: auto picks per step by speed, off decodes plainly with the drafter "
        "loaded, N drafts N tokens (more than the pair drafts per step, the drafter's block - 1, is lowered to "
        "that, with a note); default: the draft setting",
    )
    p.add_argument(
        "--speculate",
        type=flag("speculate"),
        metavar="auto|dflash|mtp|lookup|none",
        help="which method drafts: auto chooses per step among those the pair has (default; plain with "
        "--no-drafter), dflash the drafter, mtp the target's own MTP layer, lookup copies from the prompt, "
        "none decodes plainly; a speculate setting other than auto is the default",
    )
    p.add_argument(
        "--json-schema",
        metavar="FILE|JSON",
        help="hold the answer to a JSON schema (a file, or the schema itself): it is one JSON value valid for it",
    )
    p.add_argument("--json", action="store_true", help="print one JSON record with the answer and the statistics")
    p.set_defaults(handler=main)


DEVICE = re.compile(r"cpu|cuda(:\d+)?")


def check_prompt(text: str) -> None:
    """The message to answer has some text: an empty one would be answered as if it were a question."""
    if not text.strip():
        raise UserError('--prompt is empty: give the message to answer, e.g. --prompt "Explain this error"')


def with_settings(args: argparse.Namespace) -> argparse.Namespace:
    """The flags, with config.toml's draft, decode, context_length and (when not auto) speculate where no flag
    gives them; what in the file cannot be used is said on stderr, one line each, as serve says it."""
    from dflash_chat import settings as settings_module

    current, problems = settings_module.read()
    for problem in problems:
        print(f"note: {problem}", file=sys.stderr)
    if args.draft is None:
        args.draft = current.draft
    if args.decode is None:
        args.decode = current.decode
    if args.context is None:
        args.context = current.context_length
    if args.speculate is None and current.speculate != "auto" and not args.no_drafter:
        args.speculate = current.speculate
    return args


def check_device_name(device: str | None, name: str = "--device") -> None:
    """The device is spelled as one dflash-chat runs on (cpu, cuda, cuda:N); no torch import."""
    if device is not None and not DEVICE.fullmatch(device.strip()):
        raise UserError(f"{name} {device!r} is not a device: use cpu, cuda or cuda:N")


def check_device(device: str | None) -> None:
    """--device names a device this machine has; UserError (before anything loads) says what to pass."""
    check_device_name(device)
    if device is None:
        return
    import torch

    where = torch.device(device.strip())
    if where.type == "cuda":
        if not torch.cuda.is_available():
            raise UserError(
                f"--device {device}: this machine has no usable CUDA GPU (see `dflash-chat doctor`); use --device cpu"
            )
        count = torch.cuda.device_count()
        if where.index is not None and where.index >= count:
            raise UserError(f"--device {device}: this machine has {count} CUDA GPU(s), cuda:0 to cuda:{count - 1}")


def resolve_paths(args) -> tuple[str, str | None]:
    if args.demo:
        from dflash_chat.models.demo import demo_paths

        target, drafter = demo_paths()
        return str(target), None if args.no_drafter else str(drafter)
    if not args.target:
        raise UserError("give --target DIR (and --drafter DIR), or --demo")
    if not args.drafter and not args.no_drafter and args.speculate in (None, "dflash"):
        raise UserError(
            "give --drafter DIR, --no-drafter for plain decoding, or --speculate mtp|lookup|auto to draft without one"
        )
    return args.target, None if args.no_drafter else args.drafter


def prompt_ids(tokenizer, text: str, *, system: str | None, think: bool, raw: bool) -> list[int]:
    """The chat template's prompt for one user message; the text as it is with --raw, or when
    the tokenizer has no template (a base model)."""
    from dflash_chat.runtime.prompt import build_prompt, encode

    if raw or not getattr(tokenizer, "chat_template", None):
        return encode(tokenizer, text)
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": text}]
    return build_prompt(tokenizer, messages, thinking=think).ids


def stats_line(stats) -> str:
    line = f"{stats.decode_tokens_per_s:.1f} tok/s · {stats.new_tokens} tokens · TTFT {stats.ttft_s * 1000:.0f} ms"
    if stats.speculative:
        line += (
            f" · acceptance {stats.acceptance_rate:.0%} · {stats.mean_acceptance_length:.2f} tokens/step"
            f" · draft {stats.draft}, {stats.mean_draft_length:.1f}/step"
        )
        drafted = [f"{name} {figures.steps / stats.steps:.0%}" for name, figures in stats.methods.items()]
        line += f" · steps {', '.join(drafted)}" if stats.steps else ""
    return line


def load(args: argparse.Namespace, target: str, drafter: str | None):
    """The pair, through the app's model loader (here, in this thread), with the loading line on stderr."""
    from dflash_chat.engine.load import default_device, display_name
    from dflash_chat.runtime.loader import LoadOptions
    from dflash_chat.runtime.model_source import ModelSource
    from dflash_chat.runtime.terminal_load import TerminalLoad, at_once

    draft = "auto" if args.draft is None else args.draft
    # --no-drafter is the plain baseline unless --speculate says otherwise
    speculate = args.speculate or ("none" if args.no_drafter else "auto")
    device = args.device or str(default_device())  # --device or the default: never $DFLASH_CHAT_DEVICE
    options = LoadOptions(
        args.context or CONTEXT, args.decode or "auto", draft, device=device, speculate=speculate, vision="off"
    )  # run takes no images: a folder's vision tower would only take memory
    loading = TerminalLoad(options, spawn=at_once, name=display_name(target)).begin(ModelSource(target, drafter))
    if loading.cause is not None:
        raise loading.cause  # as loading raised it: errors.describe words it, or it is a bug to see
    if loading.loader.pair is None:
        raise UserError(loading.error or "the model did not load")
    return loading.loader.pair


def _output(given: str | None):
    """--json-schema's schema, checked (a UserError in one line when it is not one)."""
    if given is None:
        return None
    from dflash_chat.runtime.constraint import GrammarError, read_schema

    try:
        return read_schema(given)
    except GrammarError as exc:
        raise UserError(str(exc)) from None


def _grammar(pair, output, *, thinking: bool):
    """The matcher holding the answer to `output` (None: a free answer)."""
    if output is None:
        return None
    from dflash_chat.runtime.constraint import GrammarError, json_tag

    try:
        return pair.grammars.matcher(json_tag(output.schema, thinking=thinking, label=output.label))
    except GrammarError as exc:
        raise UserError(str(exc)) from None


def main(args: argparse.Namespace) -> int:
    from dflash_chat.engine.events import Finished, Step
    from dflash_chat.engine.sampling_params import SamplingParams
    from dflash_chat.runtime.detokenize import IncrementalDecoder

    check_prompt(args.prompt)
    args = with_settings(args)
    target, drafter = resolve_paths(args)
    check_device(args.device)
    output = _output(args.json_schema)  # before loading: a bad schema costs no load
    pair = load(args, target, drafter)
    tok = pair.tokenizer
    prompt = prompt_ids(tok, args.prompt, system=args.system, think=args.think, raw=args.raw)
    params = SamplingParams.of(args)  # the flags name its fields: the one value the engine gets
    stops = pair.engine.stop_ids(params)
    decoder = IncrementalDecoder(tok, stops)
    tokens: list[int] = []
    finished: Finished | None = None
    grammar = _grammar(pair, output, thinking=args.think and not args.raw)
    for event in pair.engine.generate(prompt, params, grammar=grammar):
        if isinstance(event, Step):
            tokens.extend(event.token_ids)
            if not args.json:
                sys.stdout.write(decoder.push(event.token_ids))  # only the new text: each step stays small
                sys.stdout.flush()
        elif isinstance(event, Finished):
            finished = event
    assert finished is not None, "the engine's generation always ends with Finished"
    if args.json:
        answer = tok.decode([t for t in tokens if t not in stops])
        record = {
            "answer": answer,
            "finish_reason": finished.reason,
            "target": pair.target_name,
            "drafter": pair.drafter_name,
            **finished.stats.as_dict(),
        }
        print(json.dumps(record))
    else:
        sys.stdout.write(decoder.flush() + "\n")
        print(stats_line(finished.stats))
    if finished.reason == "error":
        raise UserError(finished.error or "generation failed")
    return 0
