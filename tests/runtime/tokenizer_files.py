"""A small real tokenizer (byte-level BPE, trained in milliseconds) with a Qwen-style
chat template that honours enable_thinking, saved the way Hugging Face saves one."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
THINK_TAGS = ["<think>", "</think>"]

CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{ '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{ '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}"
    "{{ '<think>\\n\\n</think>\\n\\n' }}"
    "{%- else -%}"
    "{{ '<think>\\n' }}"
    "{%- endif -%}"
    "{%- endif -%}"
)

CORPUS = [
    "def hello(name):\n    return f'hello {name}'\n",
    "The quick brown fox jumps over the lazy dog. Café, naïve, 東京, 🙂.",
    "What does the with statement do? It manages a context.",
] * 20


def write_tokenizer(directory: Path) -> Path:
    from transformers import PreTrainedTokenizerFast

    directory.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
    )
    fast.add_tokens(THINK_TAGS)
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(directory)
    return directory


def load_tokenizer(directory: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(directory)
