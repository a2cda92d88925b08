"""`bench --tools`'s calls held to the call grammar (train/tool_bench.constrained_calls), on the scripted pair
(tests/engine/scripted.py): a model that answers `Done.` when free is held to a right call by `required`, and
each figure counts what the answers are, a cut answer never as a call."""

from __future__ import annotations

from dflash_chat.bench.demo_pair import Sampling
from dflash_chat.runtime.tool_calls import ToolSpec
from dflash_chat.train.tool_bench import call_verdict, constrained_calls
from dflash_chat.train.tool_corpus import Call, ToolChat, call_turns

ECHO = ToolSpec.of_openai({"type": "function", "function": {"name": "echo", "parameters": {"type": "object"}}})
CHAT = ToolChat((ECHO,), "Echo, please.", Call("echo", {}))
CALL = "<tool_call>\n<function=echo>\n</function>\n</tool_call>"


def test_a_model_that_answers_in_text_is_held_to_a_right_call_by_required(tool_pair):
    from dflash_chat.engine.load import load_pair

    pair = load_pair(*map(str, tool_pair), device="cpu", max_context=1024)
    held = constrained_calls(pair.engine, pair.tokenizer, pair.grammars, [(call_turns(CHAT), CHAT)], Sampling(), 64)
    assert held["unconstrained"] == {
        "answers": 1,
        "well_formed": 0.0,
        "right": 0.0,
        "exact": 0.0,
        "cut": 0.0,
    }  # "Done."
    # held, it writes the call in single letters (its own choice among what the grammar allows): 42 tokens
    assert held["required"] == {"answers": 1, "well_formed": 1.0, "right": 1.0, "exact": 1.0, "cut": 0.0}
    assert held["auto"] == held["unconstrained"]  # free until it opens a call, which it never does


def test_a_call_is_counted_well_formed_and_right_only_when_it_is_and_the_answer_finished():
    assert call_verdict(CALL, CHAT, cut=False) == {"well_formed": True, "right": True, "exact": True, "cut": False}
    assert call_verdict(CALL, CHAT, cut=True) == {"well_formed": False, "right": False, "exact": False, "cut": True}
    assert not any(call_verdict("Done.", CHAT, cut=False).values())
    other = ToolChat((ECHO,), "Echo x.", Call("echo", {"x": 1}))  # asks for an argument the call leaves out
    assert call_verdict(CALL, other, cut=False) == {"well_formed": True, "right": True, "exact": False, "cut": False}
    needs = ToolSpec.of_openai(
        {"type": "function", "function": {"name": "echo", "parameters": {"type": "object", "required": ["x"]}}}
    )
    assert call_verdict(CALL, ToolChat((needs,), "Echo x.", Call("echo", {"x": 1})), cut=False)["right"] is False
