from dflash_chat.engine.events import Finished, Prefilled, Step


def run(engine, prompt, params, cancel=None):
    """(tokens, Finished event, events) of one generation."""
    tokens, events = [], []
    finished = None
    for event in engine.generate(prompt, params, cancel):
        events.append(event)
        if isinstance(event, Step):
            tokens.extend(event.token_ids)
        elif isinstance(event, Finished):
            finished = event
    return tokens, finished, events


def prefilled(events) -> Prefilled:
    return next(e for e in events if isinstance(e, Prefilled))
