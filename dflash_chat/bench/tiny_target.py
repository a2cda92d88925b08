"""A tiny random target in the real file format, for `dflash-chat bench` (and the tests' pairs).

It is written by transformers' own classes (Qwen3_5ForCausalLM, Qwen3_5MoeForCausalLM, Qwen3ForCausalLM),
so the files are exactly what the loader meets in the wild. The tokenizer is a small byte-level BPE with
Qwen's special tokens and a chat template that honours enable_thinking.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<|mask|>"]

CHAT_TEMPLATE = (
    "{%- for m in messages %}"
    "{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- else %}{{- '<think>\\n' }}{%- endif %}{%- endif %}"
)

_TEXT = (
    "def main():\n    print('hello world')\n    return 0\n"
    "The quick brown fox jumps over the lazy dog. Speculative decoding drafts tokens and verifies them.\n"
    "for i in range(10):\n    total += i * i\nclass Engine:\n    def generate(self, prompt):\n        pass\n"
)


def write_tokenizer(directory: Path, vocab_size: int = 384) -> int:
    """Train a byte-level BPE on a fixed text; save tokenizer files. Returns the vocabulary size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([_TEXT] * 4, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", mask_token="<|mask|>"
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(directory))
    return len(fast)


def target_config(arch: str, vocab_size: int, hidden: int = 64, layers: int = 4) -> dict:
    heads, head_dim = max(2, hidden // 16), 16
    common: dict[str, Any] = dict(
        vocab_size=vocab_size,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 2),
        head_dim=head_dim,
        intermediate_size=hidden * 2,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        eos_token_id=2,
    )
    if arch == "qwen3":
        return common
    common.update(
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        linear_conv_kernel_dim=4,
        layer_types=["linear_attention" if i % 2 == 0 else "full_attention" for i in range(layers)],
    )
    if arch == "qwen3_5_moe":
        common.update(
            num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32
        )
    return common


def _hf_model(arch: str, cfg: dict):
    import transformers as tf

    tf.utils.logging.set_verbosity_error()
    tf.utils.logging.disable_progress_bar()

    classes = {
        "qwen3_5": (tf.Qwen3_5TextConfig, tf.Qwen3_5ForCausalLM),
        "qwen3_5_moe": (tf.Qwen3_5MoeTextConfig, tf.Qwen3_5MoeForCausalLM),
        "qwen3": (tf.Qwen3Config, tf.Qwen3ForCausalLM),
    }
    config_cls, model_cls = classes[arch]
    return model_cls(config_cls(**cfg))


def _randomise(model: torch.nn.Module, generator: torch.Generator, scale: float, zero_centred: bool) -> None:
    """Weights large enough that logits are well separated (no near-ties for greedy comparisons)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("A_log", "dt_bias")):
                p.copy_(torch.empty_like(p).uniform_(-1.0, 1.0, generator=generator))
            elif p.dim() == 1:
                plain = not zero_centred or name.endswith("linear_attn.norm.weight")
                p.copy_(torch.randn(p.shape, generator=generator) * 0.1 + (1.0 if plain else 0.0))
            else:
                fan_in = p.shape[-1] if p.dim() >= 2 else 1
                p.copy_(torch.randn(p.shape, generator=generator) * (scale / fan_in**0.5))


def write_target(
    directory: Path,
    arch: str = "qwen3_5",
    *,
    seed: int = 0,
    hidden: int = 64,
    layers: int = 4,
    vocab_size: int | None = None,
    scale: float = 1.0,
    tokenizer: bool = True,
    mtp: bool = False,
):
    """A tiny random target in HF format (+ tokenizer). Returns the transformers model (the oracle).
    `mtp` (Qwen3.5/3.6 only): with a random MTP layer, as the Qwen checkpoints ship theirs (`add_mtp`)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    vocab = write_tokenizer(directory) if tokenizer else (vocab_size or 384)
    cfg = target_config(arch, vocab, hidden, layers)
    torch.manual_seed(seed)
    model = _hf_model(arch, cfg).float().eval()
    gen = torch.Generator().manual_seed(seed)
    _randomise(model, gen, scale, zero_centred=arch != "qwen3")
    model.save_pretrained(str(directory))
    if mtp:
        add_mtp(directory, mtp_state_dict(cfg | {"model_type": model.config.model_type}, seed=seed + 1))
    return model


def mtp_state_dict(cfg: dict, *, seed: int = 0, scale: float = 1.0) -> dict[str, torch.Tensor]:
    """A random MTP layer for the target of config `cfg`, under the checkpoints' names (`mtp.*`)."""
    from dflash_chat.engine.models.config import TargetConfig
    from dflash_chat.engine.models.mtp import MTPHead

    head = MTPHead(TargetConfig.from_dict(cfg))
    gen = torch.Generator().manual_seed(seed)
    _randomise(head, gen, scale, zero_centred=True)
    return {f"mtp.{name}": t.detach().clone().contiguous() for name, t in head.state_dict().items()}


def add_mtp(directory: Path, tensors: dict[str, torch.Tensor]) -> None:
    """Ship an MTP layer inside a Qwen3.5/3.6 target folder as the Qwen checkpoints do: its `mtp.*` tensors
    in the target's safetensors, `mtp_num_hidden_layers` in its config (any layer there before is replaced)."""
    import json

    from safetensors.torch import load_file, save_file

    directory = Path(directory)
    weights = directory / "model.safetensors"
    kept = {k: v for k, v in load_file(str(weights)).items() if not k.startswith("mtp.")}
    save_file({**kept, **tensors}, str(weights), metadata={"format": "pt"})
    config = json.loads((directory / "config.json").read_text())
    config["mtp_num_hidden_layers"] = 1
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
