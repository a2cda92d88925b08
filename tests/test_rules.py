"""One rule per value: the settings file, the flags and serve's request bodies refuse the same bad value in the
same words, and take the same good ones."""

import pytest

from dflash_chat import cli, settings
from dflash_chat.engine import rules
from dflash_chat.engine.draft_length import parse_draft
from dflash_chat.engine.sampling_params import SamplingParams
from dflash_chat.serve.errors import ApiError
from dflash_chat.serve.openai_chat import chat_request
from dflash_chat.settings import Settings

MESSAGES = [{"role": "user", "content": "hi"}]

# setting, `run` flag, serve body field, a bad value, the rule's words for it
SAMPLING = [
    ("temperature", "--temperature", "temperature", 3, "must be a number from 0 to 2 (0 = greedy), got 3"),
    ("temperature", "--temperature", "temperature", -0.5, "must be a number from 0 to 2 (0 = greedy), got -0.5"),
    ("top_p", "--top-p", "top_p", 0, "must be a number greater than 0 and at most 1 (1 = off), got 0"),
    ("top_p", "--top-p", "top_p", 1.5, "must be a number greater than 0 and at most 1 (1 = off), got 1.5"),
    ("top_k", "--top-k", "top_k", 2.5, "must be a whole number from -1 or 0 to 2147483647 (0 = off), got 2.5"),
    ("top_k", "--top-k", "top_k", -2, "must be a whole number from -1 or 0 to 2147483647 (0 = off), got -2"),
    ("min_p", "--min-p", "min_p", 1.5, "must be a number from 0 to 1 (0 = off), got 1.5"),
    ("min_p", "--min-p", "min_p", -0.1, "must be a number from 0 to 1 (0 = off), got -0.1"),
    ("max_new_tokens", "--max-tokens", "max_tokens", 0, "must be a whole number from 1 to 1000000, got 0"),
    ("max_new_tokens", "--max-tokens", "max_tokens", 10**7, "must be a whole number from 1 to 1000000, got 10000000"),
]


def settings_words(key, value) -> str:
    with pytest.raises(settings.SettingsError) as refused:
        settings.parse_value(key, value)
    message = str(refused.value)
    assert message.startswith(f"{key} ")
    return message.removeprefix(f"{key} ")


def flag_words(capsys, flag, value) -> str:
    assert cli.main(["run", "--demo", "--prompt", "hi", flag, str(value)]) == 2  # refused before anything loads
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Traceback" not in err
    head = f"dflash-chat run: argument {flag}: "
    assert err.startswith(head) and err.endswith(" (see `dflash-chat run --help`)")
    return err.removeprefix(head).removesuffix(" (see `dflash-chat run --help`)")


def serve_words(field, value) -> str:
    with pytest.raises(ApiError) as refused:
        chat_request({"messages": MESSAGES, field: value}, Settings())
    error = refused.value
    assert error.status == 400 and error.param == field
    assert error.message.startswith(f"'{field}' ") and error.message.endswith(".")
    return error.message.removeprefix(f"'{field}' ").removesuffix(".")


@pytest.mark.parametrize("key, flag, field, bad, words", SAMPLING)
def test_settings_flags_and_serve_refuse_a_bad_value_in_the_same_words(capsys, key, flag, field, bad, words):
    assert settings_words(key, bad) == flag_words(capsys, flag, bad) == serve_words(field, bad) == words


@pytest.mark.parametrize(
    "key, field, good, taken",
    [
        ("temperature", "temperature", 0, 0.0),
        ("top_p", "top_p", 1, 1.0),
        ("top_k", "top_k", -1, 0),  # vLLM's "no limit" reads as off everywhere
        ("min_p", "min_p", 0.05, 0.05),
        ("max_new_tokens", "max_tokens", 5.0, 5),
    ],
)
def test_they_take_the_same_good_values_into_one_sampling_value(key, field, good, taken):
    from_file = settings.parse_value(key, good)
    from_text = settings.flag(key)(str(good))
    body = chat_request({"messages": MESSAGES, field: good}, Settings()).sampling
    assert from_file == from_text == taken
    assert getattr(body, "max_new_tokens" if field == "max_tokens" else field) == taken


def test_a_request_body_reaches_the_engine_as_one_sampling_value():
    body = {"messages": MESSAGES, "temperature": 0.3, "top_p": 0.9, "top_k": 7, "min_p": 0.1, "seed": 4}
    body |= {"max_tokens": 12, "stop": ["\n\n"]}
    assert chat_request(body, Settings()).sampling == SamplingParams(
        temperature=0.3, top_p=0.9, top_k=7, min_p=0.1, max_new_tokens=12, seed=4, stop=("\n\n",)
    )
    defaults = Settings(temperature=0.5, min_p=0.2)
    assert chat_request({"messages": MESSAGES}, defaults).sampling == SamplingParams(
        temperature=0.5, top_p=defaults.top_p, top_k=defaults.top_k, min_p=0.2, max_new_tokens=None
    )
    assert defaults.sampling() == SamplingParams(
        temperature=0.5, top_p=defaults.top_p, top_k=defaults.top_k, min_p=0.2, max_new_tokens=1024
    )


@pytest.mark.parametrize("bad", ["0", 65, "some", 2.5, True])
def test_the_draft_setting_has_one_rule_for_the_file_the_flag_and_the_engine(capsys, bad):
    words = f"must be {rules.DRAFT_WHAT}, got {rules.shown(bad)}"
    assert settings_words("draft", bad) == words
    with pytest.raises(rules.Invalid, match=f"^draft {words}$".replace("(", r"\(").replace(")", r"\)")):
        parse_draft(bad)
    if not isinstance(bad, bool):
        text_words = f"must be {rules.DRAFT_WHAT}, got {rules.shown(str(bad))}"
        assert flag_words(capsys, "--draft", bad) == text_words


def test_the_engine_refuses_a_sampling_value_out_of_range_with_the_rules_words():
    with pytest.raises(rules.Invalid, match=r"^min_p must be a number from 0 to 1 \(0 = off\), got 2$"):
        SamplingParams(min_p=2)
