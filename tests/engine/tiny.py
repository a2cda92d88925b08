"""Tiny random pairs for tests (the builders live in the package: `dflash-chat bench` uses them too)."""

from dflash_chat.tiny import drafter_config, target_config, write_drafter, write_pair, write_target, write_tokenizer

__all__ = ["drafter_config", "target_config", "write_drafter", "write_pair", "write_target", "write_tokenizer"]
