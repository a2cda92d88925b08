"""The demo tokenizer: byte-level BPE with Qwen-style special tokens and a Qwen3.6-shaped chat template."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|mask|>")
# Like Qwen's, the think tags are added tokens but not "special": decoding with
# skip_special_tokens=True keeps them, so the app can still find the thinking block.
THINK_TOKENS = ("<think>", "</think>")
MASK_TOKEN = "<|mask|>"

# Our own template with the structure of Qwen3.6's: ChatML turns; thinking is on unless the caller
# passes enable_thinking=False, in which case the generation prompt closes an empty think block.
# Past assistant turns drop their reasoning; the last one (after the last user turn) keeps it.
# With `tools`, the system turn lists them (one JSON object a line in <tools>) and says how to call one;
# an assistant's calls are written in the Qwen3-Coder form (runtime/tool_calls.py reads them back), and
# the tools' answers go back in one user turn of <tool_response> blocks, as Qwen3.6's template does. A content of
# parts is written as Qwen3.5's is: text parts as they are, each image part as its vision tokens (train/vision.py).
CHAT_TEMPLATE = """\
{%- macro render_content(content) -%}
{%- if content is string -%}{{- content -}}
{%- elif content is iterable and content is not mapping -%}
{%- for item in content -%}
{%- if item.type == 'image' or 'image' in item -%}{{- '<|vision_start|><|image_pad|><|vision_end|>' -}}
{%- elif item.type == 'text' -%}{{- item.text -}}
{%- endif -%}
{%- endfor -%}
{%- endif -%}
{%- endmacro -%}
{%- set ns = namespace(last_user=-1, system='') -%}
{%- for m in messages -%}{%- if m.role == 'user' -%}{%- set ns.last_user = loop.index0 -%}{%- endif -%}{%- endfor -%}
{%- if messages and messages[0].role == 'system' -%}{%- set ns.system = messages[0].content -%}{%- endif -%}
{%- if tools -%}
{{- '<|im_start|>system\\n# Tools\\n\\nYou have access to the following functions:\\n\\n<tools>' -}}
{%- for tool in tools -%}{{- '\\n' + (tool.function if tool.function is defined else tool) | tojson -}}{%- endfor -%}
{{- '\\n</tools>\\n\\nIf you choose to call a function ONLY reply in the following format with NO suffix:\\n\\n' -}}
{{- '<tool_call>\\n<function=example_function_name>\\n<parameter=example_parameter_1>\\nvalue_1\\n</parameter>\\n' -}}
{{- '</function>\\n</tool_call>' -}}
{%- if ns.system -%}{{- '\\n\\n' + ns.system -}}{%- endif -%}
{{- '<|im_end|>\\n' -}}
{%- endif -%}
{%- for m in messages -%}
{%- set content = render_content(m.content) -%}
{%- if m.role == 'system' and loop.first and tools -%}
{%- elif m.role == 'assistant' -%}
{%- set reasoning = m.reasoning_content if m.reasoning_content is string else '' -%}
{%- if '</think>' in content -%}
{%- set reasoning = content.split('</think>')[0].split('<think>')[-1] -%}
{%- set content = content.split('</think>')[-1] -%}
{%- endif -%}
{%- set reasoning = reasoning.strip('\\n') -%}
{%- set content = content.lstrip('\\n') -%}
{{- '<|im_start|>assistant\\n' -}}
{%- if loop.index0 > ns.last_user -%}
{{- '<think>\\n' + reasoning + '\\n</think>\\n\\n' -}}
{%- endif -%}
{{- content -}}
{%- for call in m.tool_calls or [] -%}
{%- set call = call.function if call.function is defined else call -%}
{%- if loop.first and content.strip() -%}{{- '\\n\\n' -}}{%- elif not loop.first -%}{{- '\\n' -}}{%- endif -%}
{{- '<tool_call>\\n<function=' + call.name + '>\\n' -}}
{%- for name, value in (call.arguments or {}) | items -%}
{{- '<parameter=' + name + '>\\n' -}}
{{- value if value is string else value | tojson -}}
{{- '\\n</parameter>\\n' -}}
{%- endfor -%}
{{- '</function>\\n</tool_call>' -}}
{%- endfor -%}
{{- '<|im_end|>\\n' -}}
{%- elif m.role == 'tool' -%}
{%- if loop.first or loop.previtem.role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}
{{- '\\n<tool_response>\\n' + content + '\\n</tool_response>' -}}
{%- if loop.last or loop.nextitem.role != 'tool' -%}{{- '<|im_end|>\\n' -}}{%- endif -%}
{%- else -%}
{{- '<|im_start|>' + m.role + '\\n' + content + '<|im_end|>\\n' -}}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{- '<|im_start|>assistant\\n<think>\\n' -}}
{%- if enable_thinking is defined and enable_thinking is false -%}
{{- '\\n</think>\\n\\n' -}}
{%- endif -%}
{%- endif -%}
"""


def train_tokenizer(texts: Iterable[str], vocab_size: int = 6144):
    """A byte-level BPE (GPT-2 style pre-split) wrapped as a transformers fast tokenizer."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(texts, trainer=trainer)
    bpe.add_tokens([AddedToken(t, special=False, normalized=False) for t in THINK_TOKENS])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>", MASK_TOKEN],
        model_max_length=4096,
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def save_tokenizer(tokenizer, out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(out_dir)


def render(
    tokenizer, messages: list[dict], *, add_generation_prompt: bool = False, enable_thinking: bool = True
) -> str:
    return tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt, enable_thinking=enable_thinking
    )


def training_text(tokenizer, conversation) -> str:
    """Prompt exactly as inference renders it, then the answer (with its thinking, if any) and <|im_end|>."""
    thinking = conversation.reasoning is not None
    prompt = render(tokenizer, conversation.prompt_messages, add_generation_prompt=True, enable_thinking=thinking)
    head = f"{conversation.reasoning}\n</think>\n\n" if thinking else ""
    return prompt + head + conversation.answer + "<|im_end|>\n"
