"""An engine's `generate` that stops after each decode step until the test lets it go on: a test that acts
while an answer streams then never misses that state, however fast or slow the machine is."""

from __future__ import annotations


def after_each_step(generate, hold):
    """`generate` (a loaded pair's engine's), calling `hold(cancel)` after each decode Step it yields, before
    it goes on; `hold` returns when the test lets the next step run (or the answer is cancelled)."""
    from dflash_chat.engine.events import Step

    def paced(prompt_ids, params, cancel=None, **keys):
        for event in generate(prompt_ids, params, cancel, **keys):
            yield event
            if isinstance(event, Step):
                hold(cancel)

    return paced
