"""Resolved model files -> (engine, tokenizer): the one place that turns folders into a running pair."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from dflash_chat.engine.checkpoint import load_into, normalise_target_names, read_config, read_tensors
from dflash_chat.engine.errors import ModelFormatError
from dflash_chat.engine.models.config import DrafterConfig, TargetConfig
from dflash_chat.engine.models.dflash import DFlashDrafter
from dflash_chat.engine.models.layers import Rotary
from dflash_chat.engine.models.target import TargetModel
from dflash_chat.engine.spec import Engine


@dataclass
class LoadedPair:
    engine: Engine
    tokenizer: object
    target_name: str
    drafter_name: str | None
    device: torch.device
    dtype: torch.dtype


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def default_dtype(device: torch.device) -> torch.dtype:
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def _materialise(module: torch.nn.Module, device: torch.device, dtype: torch.dtype) -> None:
    module.to_empty(device=device)
    module.to(dtype)


def load_target(directory: str | Path, device=None, dtype=None) -> TargetModel:
    directory = Path(directory)
    device = torch.device(device) if device else default_device()
    dtype = dtype or default_dtype(device)
    cfg = TargetConfig.from_dict(read_config(directory, "target"))
    tensors = normalise_target_names(read_tensors(directory, "target"))
    with torch.device("meta"):
        model = TargetModel(cfg)
    _materialise(model, device, dtype)
    model.rotary = Rotary(cfg.rotary_dim, cfg.rope_theta).to(device)
    if "lm_head.weight" not in tensors and (cfg.tie_word_embeddings or "model.embed_tokens.weight" in tensors):
        if not cfg.tie_word_embeddings:
            raise ModelFormatError("target weights have no lm_head.weight and config.json does not tie embeddings")
        model.lm_head.weight = model.model.embed_tokens.weight
    load_into(model, tensors, "target")
    return model.eval()


def load_drafter(directory: str | Path, target: TargetModel, *, causal_sliding: bool | None = None) -> DFlashDrafter:
    directory = Path(directory)
    cfg = DrafterConfig.from_dict(read_config(directory, "drafter"))
    if causal_sliding is not None:
        cfg.causal_sliding = causal_sliding
    bad = [i for i in cfg.target_layer_ids if not 0 <= i < target.cfg.num_layers]
    if bad:
        raise ModelFormatError(
            f"drafter taps target layers {bad}, but the target has {target.cfg.num_layers} layers: this drafter belongs to another model"
        )
    tensors = {k.removeprefix("model."): v for k, v in read_tensors(directory, "drafter").items()}
    fc = tensors.get("fc.weight")
    want = len(cfg.target_layer_ids) * target.cfg.hidden_size
    if fc is not None and fc.shape[-1] != want:
        raise ModelFormatError(
            f"drafter expects {fc.shape[-1] // len(cfg.target_layer_ids)}-wide target features, the target's hidden size is "
            f"{target.cfg.hidden_size}: this drafter belongs to another model"
        )
    if cfg.hidden_size != target.cfg.hidden_size:
        raise ModelFormatError(
            f"drafter hidden size {cfg.hidden_size} differs from the target's {target.cfg.hidden_size}: it cannot share its embeddings"
        )
    param = target.model.norm.weight
    with torch.device("meta"):
        drafter = DFlashDrafter(cfg, target.cfg.hidden_size)
    _materialise(drafter, param.device, param.dtype)
    drafter.rotary = Rotary(cfg.head_dim, cfg.rope_theta).to(param.device)
    load_into(drafter, tensors, "drafter")
    drafter.bind(target.model.embed_tokens, target.lm_head)
    return drafter.eval()


def load_tokenizer(directory: str | Path):
    from transformers import AutoTokenizer

    directory = Path(directory)
    if not any((directory / n).is_file() for n in ("tokenizer.json", "tokenizer_config.json", "vocab.json")):
        raise ModelFormatError(f"target folder {directory} has no tokenizer files (tokenizer.json): copy them from the model's official repo")
    return AutoTokenizer.from_pretrained(str(directory))


def load_pair(
    target: str | Path,
    drafter: str | Path | None,
    *,
    device=None,
    dtype=None,
    max_context: int | None = None,
    causal_sliding: bool | None = None,
) -> LoadedPair:
    device = torch.device(device) if device else default_device()
    dtype = dtype or default_dtype(device)
    model = load_target(target, device, dtype)
    draft = load_drafter(drafter, model, causal_sliding=causal_sliding) if drafter else None
    context = max_context or min(model.cfg.max_position_embeddings, 32768)
    engine = Engine(model, draft, max_context=context)
    tokenizer = load_tokenizer(target)
    return LoadedPair(engine, tokenizer, Path(target).name, Path(drafter).name if drafter else None, device, dtype)
