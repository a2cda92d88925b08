"""dflash-chat: a terminal chat for local Qwen3.6 models with DFlash speculative decoding."""

__version__ = "0.1.0"
