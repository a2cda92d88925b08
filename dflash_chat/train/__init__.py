"""Building the embedded demo pair: corpus, tokenizer, target, DFlash drafter, evaluation.

Entry point: `python -m dflash_chat.train demo` (train and ship) or `... eval` (measure a pair).
Needs torch and transformers, like the engine; nothing here is imported by the app at start-up.
"""
