"""Resolved model files -> (engine, tokenizer): the one place that turns files into a running pair.
One file past 500 lines: every kind of file (folders, GGUFs, drafters, MTP layers, vision towers) ends in the same checks of the pair it makes.

A target is a Hugging Face folder (config.json + safetensors) or a llama.cpp GGUF file; a drafter is
a z-lab folder (BF16 safetensors, optionally quantized as it loads) or a DFlash GGUF in either
schema. Quantized weights stay packed in QuantLinear / QuantEmbedding / QuantExperts modules (see
checkpoint.materialise); norms, conv, A_log and the router load as floats in the model dtype.
The tokenizer and chat template come from a tokenizer folder when one is given (the model manager
downloads the official one), else from the target folder or the target GGUF's metadata.
"""

from __future__ import annotations

from collections import ChainMap
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any, Literal

import torch

from dflash_chat.engine import rules, speculation
from dflash_chat.engine.checkpoint import check_layers, materialise, normalise_target_names, read_config
from dflash_chat.engine.draft_length import parse_draft
from dflash_chat.engine.end_tokens import IMAGE_PAD, end_token_ids, token_id
from dflash_chat.engine.errors import ModelFormatError
from dflash_chat.engine.layout import lay_out_for_cpu
from dflash_chat.engine.models.config import DrafterConfig, TargetConfig
from dflash_chat.engine.models.dflash import DFlashDrafter, drafter_rotary
from dflash_chat.engine.models.dflash2 import build_drafter
from dflash_chat.engine.models.fused import fuse_projections
from dflash_chat.engine.models.layers import Rotary
from dflash_chat.engine.models.mtp import MTPHead
from dflash_chat.engine.models.target import TargetModel
from dflash_chat.engine.models.vision import VisionConfig, VisionTower
from dflash_chat.engine.models.vision_input import ImageConfig
from dflash_chat.engine.parked import DEFAULT_PARK_BUDGET
from dflash_chat.engine.placement import Placement, Progress
from dflash_chat.engine.prefix_cache import DEFAULT_BUDGET
from dflash_chat.engine.quantized import QuantEmbedding
from dflash_chat.engine.spec import Engine
from dflash_chat.engine.speculation import parse_speculate
from dflash_chat.engine.structured import Grammars
from dflash_chat.engine.weights import names
from dflash_chat.engine.weights.gguf import SPLIT_PART, GGUFModel, LazyTensors, read_gguf
from dflash_chat.engine.weights.gguf_tokenizer import tokenizer_from_gguf
from dflash_chat.engine.weights.mmproj import read_mmproj
from dflash_chat.engine.weights.safetensors import read_safetensors


@dataclass
class LoadedPair:
    engine: Engine
    tokenizer: object
    target_name: str
    drafter_name: str | None
    device: torch.device
    dtype: torch.dtype
    notes: tuple[str, ...] = ()  # what was fitted to the pair as it loaded (a draft setting above its most)
    _grammars: Grammars | None = None

    @property
    def vision(self) -> VisionTower | None:
        """The target's vision tower, when the pair reads images."""
        return self.engine.vision

    @property
    def grammars(self) -> Grammars:
        """The grammar engine for this pair's tokenizer (made at the first constrained answer)."""
        if self._grammars is None:
            self._grammars = Grammars(self.tokenizer, self.engine.target.cfg.vocab_size, self.engine.end_ids)
        return self._grammars


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def default_dtype(device: torch.device) -> torch.dtype:
    return torch.bfloat16 if device.type == "cuda" else torch.float32


# --- what a path holds -------------------------------------------------------------------------

_HINTS = {
    ".bin": "PyTorch .bin checkpoints are not supported; use the model's safetensors or GGUF release",
    ".pt": "PyTorch checkpoints are not supported; use the model's safetensors or GGUF release",
    ".pth": "PyTorch checkpoints are not supported; use the model's safetensors or GGUF release",
    ".safetensors": "pass the folder that holds it and its config.json",
    ".json": "pass the folder that holds it and the weights",
}


def _is_gguf(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(4) == b"GGUF"


def _folder_gguf(folder: Path, what: str) -> Path | None:
    """The one GGUF (or first part of one split GGUF) in a folder without config.json."""
    found = [p for p in sorted(folder.glob("*.gguf")) if (m := SPLIT_PART.search(p.name)) is None or m[1] == "00001"]
    if len(found) > 1:
        listed = ", ".join(p.name for p in found[:4])
        raise ModelFormatError(f"{what} folder {folder} holds several GGUF files ({listed}): pass the one to load")
    return found[0] if found else None


def resolve_model_path(path: str | Path, what: str) -> tuple[str, Path]:
    """("gguf", file) or ("folder", directory) for a model path, or a one-line error saying what is wrong."""
    path = Path(path).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file() and (gguf := _folder_gguf(path, what)):
            return "gguf", gguf
        return "folder", path
    if not path.exists():
        raise ModelFormatError(f"{what} {path} does not exist: check the path")
    if path.is_file() and _is_gguf(path):
        return "gguf", path
    hint = _HINTS.get(path.suffix.lower(), "pass a llama.cpp .gguf file or a Hugging Face model folder")
    raise ModelFormatError(f"{what} {path} is not a GGUF file or a model folder: {hint}")


def model_bytes(path: str | Path) -> int:
    """Bytes of a model's weight files: a GGUF with all its split parts, or a folder's safetensors."""
    kind, path = resolve_model_path(path, "model")
    if kind == "gguf":
        m = SPLIT_PART.search(path.name)
        parts = [path] if m is None else path.parent.glob(SPLIT_PART.sub("-*-of-" + m[2], path.name))
        return sum(p.stat().st_size for p in parts)
    return sum(p.stat().st_size for p in path.glob("*.safetensors"))


def display_name(path: str | Path) -> str:
    """A short name for a model: a GGUF's stem, the repo id of a Hugging Face cache snapshot, a folder's name."""
    path = Path(path)
    if path.suffix.lower() == ".gguf":
        return Path(SPLIT_PART.sub("", path.name)).stem
    if path.parent.name == "snapshots" and path.parent.parent.name.startswith("models--"):
        return path.parent.parent.name.removeprefix("models--").replace("--", "/")
    return path.name


def _read_gguf(path: Path, what: str) -> GGUFModel:
    model = read_gguf(path)
    if what == "target" and model.arch in names.DRAFTER_ARCHS:
        raise ModelFormatError(
            f"{path} is a DFlash drafter GGUF ({model.arch}), not a target model: pass it as the drafter"
        )
    if what == "drafter" and model.arch in names.TARGET_ARCHS:
        raise ModelFormatError(
            f"{path} is a {model.arch} target model GGUF, not a DFlash drafter: pass it as the target"
        )
    return model


def _check_materialised(module: torch.nn.Module, what: str) -> None:
    left = [n for n, t in (*module.named_parameters(), *module.named_buffers()) if t.is_meta]
    if left:
        raise ModelFormatError(
            f"{what} weights are missing {', '.join(left[:3])}: the files do not match the model's config"
        )


# --- target ------------------------------------------------------------------------------------


def load_target(path: str | Path, device=None, dtype=None, placement: Placement | None = None) -> TargetModel:
    """A target model from a Hugging Face folder or a GGUF file (quantized tensors stay packed).
    `placement` moves the tensors to the device and counts them (a progress display)."""
    device = torch.device(device) if device else default_device()
    dtype = dtype or default_dtype(device)
    kind, path = resolve_model_path(path, "target")
    if kind == "gguf":
        gguf = _read_gguf(path, "target")
        config, tensors = gguf.hf_config, gguf.tensors
    else:
        config = read_config(path, "target")
        tensors = normalise_target_names(read_safetensors(path).tensors)
    cfg = TargetConfig.from_dict(config)
    check_layers("target", cfg.num_layers, tensors)
    tied = "lm_head.weight" not in tensors and "model.embed_tokens.weight" in tensors
    if tied and not cfg.tie_word_embeddings:
        raise ModelFormatError("target weights have no lm_head.weight and config.json does not tie embeddings")
    with torch.device("meta"):
        model = TargetModel(cfg)
    materialise(model, tensors, device, dtype, "target", skip=("lm_head.weight",) if tied else (), placement=placement)
    if tied:
        _tie_lm_head(model)
    model.rotary = Rotary(cfg.rotary_dim, cfg.rope_theta).to(device)
    _check_materialised(model, "target")
    lay_out_for_cpu(model)
    fuse_projections(model)
    return model.eval()


def load_mtp(path: str | Path, target: TargetModel, placement: Placement | None = None) -> MTPHead | None:
    """The target's own MTP layer from its files (`mtp.*` in safetensors, `blk.N.nextn.*` in a GGUF), bound to
    `target`; None when the checkpoint carries none (its config declares none, or its files hold none of it)."""
    layers = target.cfg.mtp_layers
    if not layers:
        return None
    kind, path = resolve_model_path(path, "target")
    if layers != 1:
        raise ModelFormatError(f"{path}: the target declares {layers} MTP layers; dflash-chat runs a single one")
    raw = _read_gguf(path, "target").tensors if kind == "gguf" else read_safetensors(path).tensors
    tensors = raw if kind == "gguf" else normalise_target_names(raw, mtp=True)
    own = {name.removeprefix(names.MTP_PREFIX): name for name in tensors if name.startswith(names.MTP_PREFIX)}
    if not own:
        return None
    param = target.model.norm.weight
    with torch.device("meta"):
        head = MTPHead(target.cfg)
    lazy = LazyTensors({ours: partial(tensors.__getitem__, theirs) for ours, theirs in own.items()})
    materialise(head, lazy, param.device, param.dtype, "MTP layer", placement=placement)
    _check_materialised(head, "MTP layer")
    lay_out_for_cpu(head)
    fuse_projections(head)
    head.bind(target)
    return head.eval()


VISUAL_PREFIXES = ("model.visual.", "visual.")


def load_vision(
    path: str | Path,
    device=None,
    dtype=None,
    placement: Placement | None = None,
    *,
    target: TargetModel | None = None,
) -> VisionTower:
    """The vision tower from a Hugging Face folder (`vision_config`, `model.visual.*`, `preprocessor_config.json`)
    or an mmproj GGUF (its image mean and std; the pixel budget Qwen3.5's own processor declares). With `target`,
    on its device and dtype, and refused when its features are not the target's width."""
    if target is not None:
        param = target.model.norm.weight
        device, dtype = device or param.device, dtype or param.dtype
    device = torch.device(device) if device else default_device()
    dtype = dtype or default_dtype(device)
    kind, path = resolve_model_path(path, "vision tower")
    tensors: Mapping[str, Any]
    config: Any
    if kind == "gguf":
        mmproj = read_mmproj(path)
        config, tensors = mmproj.vision_config, mmproj.tensors
        images = ImageConfig(image_mean=mmproj.image_mean, image_std=mmproj.image_std)
    else:
        config, tensors, images = _folder_vision(path)
    try:
        cfg = VisionConfig.from_dict(config)
    except ModelFormatError as exc:
        raise ModelFormatError(f"{path}: {exc}") from None
    if target is not None and cfg.out_hidden_size != target.cfg.hidden_size:
        raise ModelFormatError(
            f"{path}: the vision tower gives {cfg.out_hidden_size}-wide features, the target's hidden size is "
            f"{target.cfg.hidden_size}: it belongs to another model; use the mmproj file made for this one"
        )
    with torch.device("meta"):
        tower = VisionTower(cfg)
    materialise(tower, tensors, device, dtype, "vision tower", placement=placement)
    _check_materialised(tower, "vision tower")
    # the tower's own patch and merge sizes; the budget, mean and std from the files
    tower.images = replace(
        images, **{f: getattr(tower.images, f) for f in ("patch_size", "merge_size", "temporal_patch_size")}
    )
    return tower.eval()


def _folder_vision(path: Path) -> tuple[dict, LazyTensors, ImageConfig]:
    """(vision_config, the tower's tensors named as ours, its preprocessing) of a Hugging Face folder."""
    config = read_config(path, "target").get("vision_config")
    if not isinstance(config, dict):
        raise ModelFormatError(f"{path} has no vision_config: this model reads no images")
    raw = read_safetensors(path).tensors
    ours: dict[str, Callable[[], Any]] = {}
    for name in raw:
        prefix = next((p for p in VISUAL_PREFIXES if name.startswith(p)), None)
        if prefix is not None:
            ours[name.removeprefix(prefix)] = partial(raw.__getitem__, name)
    return config, LazyTensors(ours), ImageConfig.from_folder(path) or ImageConfig()


def _tie_lm_head(model: TargetModel) -> None:
    embed = model.model.embed_tokens
    if isinstance(embed, QuantEmbedding):
        model.lm_head = embed.as_linear()  # the same packed bytes, read as a matrix
    else:
        model.lm_head.weight = embed.weight


# --- drafter -----------------------------------------------------------------------------------


def _drafter_tensors(path: Path, quant: str | None, device: torch.device) -> LazyTensors:
    """z-lab safetensors (names with or without `model.`), quantized on `device` as read when `quant` is set."""
    raw = read_safetensors(path, quantize=quant, device=device).tensors
    return LazyTensors({name.removeprefix("model."): partial(raw.__getitem__, name) for name in raw})


def _drafter_vocab(config: dict, tensors: Mapping[str, Any]) -> int | None:
    """The vocabulary a drafter was made for: its selector's codebook rows (DFlash2), else config.json's."""
    codebook = "candidate_selector.predecessor_codebook"
    if codebook in tensors:
        return int(tensors[codebook].shape[0])
    vocab = config.get("vocab_size")
    return vocab if isinstance(vocab, int) and not isinstance(vocab, bool) else None


def _check_fits(cfg: DrafterConfig, fc_width: int | None, target: TargetModel, vocab: int | None = None) -> None:
    if vocab is not None and vocab != target.cfg.vocab_size:
        raise ModelFormatError(
            f"drafter vocabulary has {vocab} tokens, the target's {target.cfg.vocab_size}: this drafter belongs to "
            "another model; use the drafter made for this target"
        )
    bad = [i for i in cfg.target_layer_ids if not 0 <= i < target.cfg.num_layers]
    if bad:
        raise ModelFormatError(
            f"drafter taps target layers {bad}, but the target has {target.cfg.num_layers} layers: this drafter belongs to another model"
        )
    want = len(cfg.target_layer_ids) * target.cfg.hidden_size
    if fc_width is not None and fc_width != want:
        raise ModelFormatError(
            f"drafter expects {fc_width // len(cfg.target_layer_ids)}-wide target features, the target's hidden size is "
            f"{target.cfg.hidden_size}: this drafter belongs to another model"
        )
    if cfg.hidden_size != target.cfg.hidden_size:
        raise ModelFormatError(
            f"drafter hidden size {cfg.hidden_size} differs from the target's {target.cfg.hidden_size}: it cannot share its embeddings"
        )
    if not 0 <= cfg.mask_token_id < target.cfg.vocab_size:
        raise ModelFormatError(
            f"drafter mask token id {cfg.mask_token_id} is outside the target's {target.cfg.vocab_size}-token vocabulary: "
            "this drafter belongs to another model"
        )


def load_drafter(
    path: str | Path,
    target: TargetModel,
    *,
    causal: bool | None = None,
    placement: Placement | None = None,
    quant: str | None = None,
) -> DFlashDrafter:
    """A DFlash drafter bound to `target`'s embeddings and LM head.

    `path`: a z-lab folder or a DFlash GGUF (`dflash-draft` or `dflash` schema). `quant` ("Q8_0",
    "Q4_K") quantizes a safetensors drafter as it loads; a GGUF keeps the quantization it was saved in.
    """
    kind, path = resolve_model_path(path, "drafter")
    param = target.model.norm.weight
    tensors: Mapping[str, Any]
    if kind == "gguf":
        gguf = _read_gguf(path, "drafter")
        config, tensors = gguf.hf_config, gguf.tensors
    else:
        config = read_config(path, "drafter")
        tensors = _drafter_tensors(path, quant, param.device)
    fc = tensors["fc.weight"] if "fc.weight" in tensors else None
    try:
        cfg = DrafterConfig.from_dict(config)
        check_layers("drafter", cfg.num_layers, tensors)
        _check_fits(cfg, fc.shape[-1] if fc is not None else None, target, _drafter_vocab(config, tensors))
    except ModelFormatError as exc:
        raise ModelFormatError(f"{path}: {exc}") from None
    if causal is not None:  # every layer causal or not, whatever the checkpoint says (experiments)
        cfg.causal = causal
    if fc is not None:
        # read (and quantized) once; ChainMap only reads its maps, though typeshed asks for mutable ones
        tensors = ChainMap({"fc.weight": fc}, tensors)  # type: ignore[arg-type]
    with torch.device("meta"):
        drafter = build_drafter(cfg, target.cfg.hidden_size, target.cfg.vocab_size)
    materialise(drafter, tensors, param.device, param.dtype, "drafter", placement=placement)
    drafter.rotary = drafter_rotary(cfg).to(param.device)
    _check_materialised(drafter, "drafter")
    lay_out_for_cpu(drafter)
    fuse_projections(drafter)
    drafter.bind(target.model.embed_tokens, target.lm_head, target.model.norm, target.cfg.num_layers)
    return drafter.eval()


# --- tokenizer and pair ------------------------------------------------------------------------

UNBOUNDED = int(1e30)  # transformers' own "no limit" for a tokenizer's model_max_length


def load_tokenizer(directory: str | Path):
    from transformers import AutoTokenizer

    directory = Path(directory)
    if not directory.is_dir():
        raise ModelFormatError(f"tokenizer folder {directory} does not exist: check the path")
    if not any((directory / n).is_file() for n in ("tokenizer.json", "tokenizer_config.json", "vocab.json")):
        raise ModelFormatError(
            f"folder {directory} has no tokenizer files (tokenizer.json): copy them from the model's official repo"
        )
    try:
        return AutoTokenizer.from_pretrained(str(directory))
    except Exception as exc:  # noqa: BLE001 - transformers' own errors are tracebacks about its internals
        for name in _TOKENIZER_JSON:
            _check_json(directory / name)
        raise ModelFormatError(
            f"cannot load the tokenizer in {directory} ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''}): copy the files from the model's "
            "official repo again"
        ) from None


_TOKENIZER_JSON = (
    "config.json",
    "tokenizer_config.json",
    "tokenizer.json",
    "special_tokens_map.json",
    "generation_config.json",
    "vocab.json",
)


def _check_json(path: Path) -> None:
    """A one-line error naming the file and where its JSON breaks, if it does."""
    import json

    if not path.is_file():
        return
    try:
        json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelFormatError(f"{path} is not valid JSON ({exc}): re-download the model") from None


def _pair_tokenizer(target: str | Path, tokenizer: str | Path | None):
    """The pair's tokenizer. Its model_max_length is lifted: the engine's context is what bounds a prompt,
    and transformers would warn of any text longer than the length the model was trained at."""
    if tokenizer is not None:
        tok = load_tokenizer(tokenizer)
    else:
        kind, path = resolve_model_path(target, "target")
        tok = tokenizer_from_gguf(path) if kind == "gguf" else load_tokenizer(path)
    tok.model_max_length = UNBOUNDED
    return tok


def _check_drafter_tokenizer(drafter: str | Path, tokenizer, samples: int = 256) -> None:
    """A drafter GGUF carries the vocabulary it was converted with (llama.cpp copies the target's in): its
    tokens at ids spread over the vocabulary must be the tokenizer's. Drafter folders carry none."""
    from dflash_chat.engine.weights.gguf_file import read_header

    kind, path = resolve_model_path(drafter, "drafter")
    if kind != "gguf":
        return
    tokens = read_header(path, decode=("tokenizer.ggml.tokens",)).fields.get("tokenizer.ggml.tokens")
    if not tokens:
        return
    n = min(len(tokens), len(tokenizer))
    ids = sorted({i * (n - 1) // max(samples - 1, 1) for i in range(samples)}) if n else []
    ours = tokenizer.convert_ids_to_tokens(ids)
    wrong = [i for i, t in zip(ids, ours, strict=True) if t is not None and tokens[i] != t]
    if wrong or abs(len(tokens) - len(tokenizer)) > 1024:
        raise ModelFormatError(
            f"{path}: the drafter's vocabulary is not the target's tokenizer's ({len(tokens)} tokens against "
            f"{len(tokenizer)}{f'; token {wrong[0]} differs' if wrong else ''}): this drafter belongs to another "
            "model; use the drafter made for this target"
        )


def _check_vocab(tokenizer, model: TargetModel) -> None:
    if len(tokenizer) > model.cfg.vocab_size:
        raise ModelFormatError(
            f"the tokenizer has {len(tokenizer)} tokens, the target's vocabulary only {model.cfg.vocab_size}: "
            "the tokenizer belongs to another model; use the target's official tokenizer files"
        )


def load_pair(
    target: str | Path,
    drafter: str | Path | None,
    *,
    tokenizer: str | Path | None = None,
    device=None,
    dtype=None,
    max_context: int | None = None,
    causal: bool | None = None,
    drafter_quant: str | None = None,
    decode: str = "auto",
    draft: str | int = "auto",
    speculate: str = "auto",
    checkpoint_budget: int = DEFAULT_BUDGET,
    park_budget: int = DEFAULT_PARK_BUDGET,
    progress: Progress | None = None,
    vision: str | Path | Literal[False] | None = None,
) -> LoadedPair:
    """Target (+ drafter, + the target's own MTP layer when its checkpoint has one) and tokenizer, ready to
    chat. `tokenizer`: a folder with the official tokenizer/chat-template files; without it the target
    folder's own, or the target GGUF's metadata. `decode`: the decode path (see spec.decode_mode); on CUDA the
    default captures the steps as graphs here. `draft`: drafts per step, "auto" or "off" (see
    engine/draft_length.py); `speculate`: which method drafts (engine/speculation.py).
    `checkpoint_budget`: bytes of prompt checkpoints kept for branching prompts (engine/prefix_cache.py);
    `park_budget`: bytes of host memory for conversations another prompt displaced (engine/parked.py).
    `progress(bytes placed, bytes in all)` is called as the weights reach the device. `vision`: the vision tower's
    folder or mmproj GGUF; by default the target folder's own, when it has one (the pair then reads images); False:
    none (the `vision` setting is off, or the model manager found no room for it)."""
    device = torch.device(device) if device else default_device()
    dtype = dtype or default_dtype(device)
    tok = _pair_tokenizer(target, tokenizer)  # cheap: fail on a bad tokenizer before loading weights
    if drafter:
        _check_drafter_tokenizer(drafter, tok)
    tower_path = None if vision is False else vision if vision is not None else _own_vision(target)
    # a folder's own tower is in the target's bytes; an mmproj file adds its own
    separate = model_bytes(tower_path) if tower_path is not None and Path(tower_path) != Path(target) else 0
    placement = Placement(device, model_bytes(target) + (model_bytes(drafter) if drafter else 0) + separate, progress)
    model = load_target(target, device, dtype, placement)
    _check_vocab(tok, model)
    mtp = load_mtp(target, model, placement)
    drafter_model = (
        load_drafter(drafter, model, causal=causal, quant=drafter_quant, placement=placement) if drafter else None
    )
    tower = load_vision(tower_path, placement=placement, target=model) if tower_path is not None else None
    placement.finish()
    image_token = token_id(tok, IMAGE_PAD) if tower is not None else None
    if tower is not None and image_token is None:
        raise ModelFormatError(
            f"the tokenizer has no {IMAGE_PAD} token for the vision tower's images: use the target's official tokenizer"
        )
    context = max_context or min(model.cfg.max_position_embeddings, 32768)
    draft, note = fit_draft(draft, drafter_model, mtp is not None, speculate)
    ends = end_token_ids(tok, model.cfg.eos_token_id)
    engine = Engine(
        model,
        drafter_model,
        mtp=mtp,
        max_context=context,
        decode=decode,
        draft=draft,
        speculate=speculate,
        end_ids=ends,
        checkpoint_budget=checkpoint_budget,
        park_budget=park_budget,
        vision=tower,
        image_token_id=image_token,
    )
    engine.warm_up()
    names = display_name(target), display_name(drafter) if drafter else None
    return LoadedPair(engine, tok, *names, device, dtype, notes=(note,) if note else ())


def fit_draft(draft: str | int, drafter, mtp: bool, speculate: str) -> tuple[str | int, str]:
    """The draft setting fitted to this pair's methods (rules.fit_draft), with what to tell the user."""
    most = speculation.available(drafter.block_size if drafter else None, mtp)
    return rules.fit_draft(parse_draft(draft), speculation.width(parse_speculate(speculate, most), most) - 1)


def _own_vision(target: str | Path) -> Path | None:
    """The target's folder when its config declares a vision tower (a GGUF's comes in its own mmproj file)."""
    kind, path = resolve_model_path(target, "target")
    if kind == "gguf":
        return None
    return path if isinstance(read_config(path, "target").get("vision_config"), dict) else None


def load_files(files, **kwargs) -> LoadedPair:
    """load_pair for the model manager's hub.ModelFiles (target GGUF, drafter GGUF or folder, tokenizer folder)."""
    return load_pair(files.target, files.drafter, tokenizer=files.tokenizer, **kwargs)
