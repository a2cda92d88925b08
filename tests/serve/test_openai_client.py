"""`dflash-chat serve --demo` as a real process, driven by the official `openai` client: the greedy text
is `dflash-chat run --demo`'s for the same messages, the per-request figures are the engine's, and the
Prometheus counters add up over the requests."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading

import pytest

from dflash_chat import cli
from dflash_chat.runtime.openai_protocol import accepted_per_position

from .conftest import wait_until

openai = pytest.importorskip("openai")

QUESTIONS = ("What does the with statement do?", "Show the function that joins path components in posixpath.")
TOKENS = 24
DRAFT = ("--draft", "15")  # a fixed draft length: `auto` chooses by step times, which differ between the processes


@pytest.fixture(scope="module")
def served_demo(tmp_path_factory):
    """`dflash-chat serve --demo --port 0` in its own process; yields its base URL."""
    home = tmp_path_factory.mktemp("serve-home")
    env = {**os.environ, "DFLASH_CHAT_HOME": str(home), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(
        [sys.executable, "-m", "dflash_chat.cli", "serve", "--demo", "--port", "0", *DRAFT],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(process.stderr), daemon=True)
    reader.start()
    try:
        wait_until(
            lambda: any("serving" in line for line in lines) or process.poll() is not None, 120, "the server to listen"
        )
        said = "".join(lines)
        found = re.search(r"http://localhost:(\d+)/v1", said)
        assert found, said
        url = f"http://127.0.0.1:{found[1]}"
        wait_until(lambda: "is ready" in "".join(lines) or process.poll() is not None, 120, "the model to load")
        assert process.poll() is None, "".join(lines)
        yield url, lines
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def run_demo(question: str, capsys) -> dict:
    """`dflash-chat run --demo --json` for one question: the engine's own answer and figures."""
    capsys.readouterr()
    assert cli.main(["run", "--demo", "--prompt", question, "--max-tokens", str(TOKENS), "--json", *DRAFT]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def counters(url: str) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    from dflash_chat.chat.backends.remote import httpx_module

    text = httpx_module().get(f"{url}/metrics").text
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = sample.name + "".join(
                f"[{sample.labels[k]}]" for k in ("position", "finished_reason", "method") if k in sample.labels
            )
            found[key] = found.get(key, 0.0) + sample.value
    return found


def test_the_openai_client_gets_runs_answers_and_the_engines_figures(served_demo, capsys):
    url, lines = served_demo
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    assert [m.id for m in client.models.list().data] == ["dflash-chat-demo"]
    before = counters(url)
    usages, specs = [], []
    for question in QUESTIONS:
        expected = run_demo(question, capsys)
        messages = [{"role": "user", "content": question}]
        whole = client.chat.completions.create(
            model="dflash-chat-demo", messages=messages, max_tokens=TOKENS, temperature=0
        )
        assert whole.choices[0].message.content == expected["answer"]
        assert whole.choices[0].finish_reason == expected["finish_reason"] == "length"
        spec = whole.model_extra["metrics"]["speculative_decoding"]
        # the engine's own figures, as `run` reports them for the same messages
        assert (spec["num_spec_steps"], spec["num_draft_tokens"], spec["num_accepted_draft_tokens"]) == (
            expected["steps"],
            expected["drafted"],
            expected["accepted"],
        )
        assert spec["acceptance_histogram"] == expected["acceptance_histogram"]
        assert spec["num_accepted_tokens_per_pos"] == accepted_per_position(expected["acceptance_histogram"])
        assert spec["num_spec_tokens"] == 15
        assert spec["draft"] == expected["draft"] == "15"
        assert (
            spec["mean_draft_length"] == pytest.approx(expected["mean_draft_length"]) and spec["mean_draft_length"] > 1
        )
        # vLLM's drafts are the steps that drafted (the last one here has no room left to)
        assert (
            spec["num_drafts"]
            == sum(expected["acceptance_histogram"])
            == (expected["steps"] - expected["draft_histogram"][0])
        )
        assert spec["draft_acceptance_rate"] == pytest.approx(expected["acceptance_rate"])
        assert whole.usage.completion_tokens == expected["new_tokens"] == TOKENS
        assert whole.usage.prompt_tokens == expected["prompt_tokens"]
        timings = whole.model_extra["timings"]
        assert (timings["draft_n"], timings["draft_n_accepted"]) == (expected["drafted"], expected["accepted"])
        usages.append(whole.usage)
        specs.append(spec)

        stream = client.chat.completions.create(
            model="dflash-chat-demo",
            messages=messages,
            max_tokens=TOKENS,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        text, finish, last = [], None, None
        for chunk in stream:
            if chunk.choices:
                text.append(chunk.choices[0].delta.content or "")
                finish = chunk.choices[0].finish_reason or finish
            else:
                last = chunk
        assert "".join(text) == expected["answer"] and finish == "length"
        assert last.usage.completion_tokens == TOKENS
        # the same prompt again: the engine reuses all of it
        assert last.usage.prompt_tokens_details.cached_tokens == expected["prompt_tokens"]
        streamed = last.model_extra["metrics"]["speculative_decoding"]
        assert streamed["num_accepted_draft_tokens"] == expected["accepted"]
        usages.append(last.usage)
        specs.append(streamed)

    after = counters(url)

    def grew(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    assert grew("vllm:spec_decode_num_drafts_total") == sum(s["num_drafts"] for s in specs)
    assert grew("vllm:spec_decode_num_draft_tokens_total") == sum(s["num_draft_tokens"] for s in specs)
    assert grew("vllm:spec_decode_num_accepted_tokens_total") == sum(s["num_accepted_tokens"] for s in specs)
    for position in range(15):
        assert grew(f"vllm:spec_decode_num_accepted_tokens_per_pos_total[{position}]") == sum(
            s["num_accepted_tokens_per_pos"][position] for s in specs
        )
    assert grew("vllm:prompt_tokens_total") == sum(u.prompt_tokens for u in usages)
    assert grew("vllm:generation_tokens_total") == sum(u.completion_tokens for u in usages)
    assert grew("vllm:prefix_cache_hits_total") == sum(u.prompt_tokens_details.cached_tokens for u in usages)
    assert grew("vllm:request_success_total[length]") == len(usages)
    assert grew("dflash:decode_tokens_per_second_count") == len(usages)
    assert grew("dflash:draft_length_per_step_count") == sum(s["num_spec_steps"] for s in specs)
    assert grew("dflash:draft_length_per_step_sum") == sum(s["num_draft_tokens"] for s in specs)
    methods = {name for s in specs for name in s["methods"]}
    assert methods and sum(s["methods"].get("plain", {}).get("share", 0.0) for s in specs) < len(specs)
    for method in methods:  # per drafting method, what each answer said of it
        for counter, figure in (("steps", "steps"), ("draft_tokens", "drafted"), ("accepted_tokens", "accepted")):
            assert grew(f"dflash:spec_decode_method_{counter}_total[{method}]") == sum(
                s["methods"].get(method, {}).get(figure, 0) for s in specs
            )
    assert "Traceback" not in "".join(lines)


def test_completions_thinking_and_prefix_reuse_across_a_conversation(served_demo):
    url, _ = served_demo
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    whole = client.completions.create(model="dflash-chat-demo", prompt="def join(a, *p):", max_tokens=12, temperature=0)
    streamed = "".join(
        c.choices[0].text
        for c in client.completions.create(
            model="dflash-chat-demo", prompt="def join(a, *p):", max_tokens=12, temperature=0, stream=True
        )
        if c.choices
    )
    assert whole.choices[0].text and streamed == whole.choices[0].text
    assert whole.usage.completion_tokens == 12

    # thinking on: the template opens a think block, and what the model writes there is reasoning_content
    messages = [{"role": "user", "content": "What is a generator expression?"}]
    off = client.chat.completions.create(model="dflash-chat-demo", messages=messages, max_tokens=8, temperature=0)
    on = client.chat.completions.create(
        model="dflash-chat-demo",
        messages=messages,
        max_tokens=8,
        temperature=0,
        extra_body={"chat_template_kwargs": {"enable_thinking": True}},
    )
    assert on.choices[0].message.model_extra["reasoning_content"]
    assert off.choices[0].message.model_extra["reasoning_content"] is None and off.choices[0].message.content
    assert on.usage.prompt_tokens != off.usage.prompt_tokens

    # the next turn of a conversation prefills only what it adds to the tokens the engine holds
    first = client.chat.completions.create(model="dflash-chat-demo", messages=messages, max_tokens=8, temperature=0)
    answer = first.choices[0].message.content
    follow = messages + [{"role": "assistant", "content": answer}, {"role": "user", "content": "And a list?"}]
    second = client.chat.completions.create(model="dflash-chat-demo", messages=follow, max_tokens=8, temperature=0)
    held = first.usage.prompt_tokens + first.usage.completion_tokens - 1  # all but the newest token
    assert second.usage.prompt_tokens_details.cached_tokens == held
    assert second.usage.prompt_tokens > held


def test_stop_strings_end_the_answer_before_them(served_demo):
    url, _ = served_demo
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    messages = [{"role": "user", "content": "What does the with statement do?"}]
    full = (
        client.chat.completions.create(model="dflash-chat-demo", messages=messages, max_tokens=TOKENS, temperature=0)
        .choices[0]
        .message.content
    )
    word = full.split()[2]  # a word in the middle of the answer
    cut = client.chat.completions.create(
        model="dflash-chat-demo", messages=messages, max_tokens=TOKENS, temperature=0, stop=[word]
    )
    assert cut.choices[0].message.content == full[: full.index(word)]
    assert cut.choices[0].finish_reason == "stop"
    streamed = client.chat.completions.create(
        model="dflash-chat-demo", messages=messages, max_tokens=TOKENS, temperature=0, stop=word, stream=True
    )
    chunks = list(streamed)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == full[: full.index(word)]
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["stop"]


def test_serve_demo_reads_an_image_with_its_shipped_tower(served_demo):
    """`serve --demo` loads the demo's vision tower with the pair (its model pick), so an image_url part is answered
    and its tokens are counted."""
    import base64
    import io

    from PIL import Image

    from dflash_chat.models.demo import demo_vision

    if demo_vision() is None:
        pytest.skip("the demo's vision tower is not in demo_data")
    url, _ = served_demo
    picture = io.BytesIO()
    Image.new("RGB", (64, 64), (30, 160, 30)).save(picture, "PNG")
    image = {
        "type": "image_url",
        "image_url": {"url": f"data:image/png;base64,{base64.b64encode(picture.getvalue()).decode()}"},
    }
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=120)
    ask = {"model": "dflash-chat-demo", "max_tokens": 4, "temperature": 0}
    shown = client.chat.completions.create(
        messages=[{"role": "user", "content": [image, {"type": "text", "text": "Colour?"}]}], **ask
    )
    plain = client.chat.completions.create(messages=[{"role": "user", "content": "Colour?"}], **ask)
    assert shown.usage.prompt_tokens == plain.usage.prompt_tokens + 4 + 2  # 64 x 64: a 2 x 2 grid of merged patches
