"""`dflash-chat run` and `dflash-chat bench` end to end on tiny pairs."""

import json
import os

import pytest

from dflash_chat.cli import main


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    from tests.engine.tiny import write_pair

    return write_pair(tmp_path_factory.mktemp("pair"), "qwen3_5", seed=3)


def on_cpu(*argv: str) -> list[str]:
    """`dflash-chat <argv> --device cpu`."""
    return [*argv, "--device", "cpu"]


def run_argv(target, drafter, prompt: str, *flags: str) -> list[str]:
    """`dflash-chat run --target T --drafter D --prompt P <flags> --device cpu` (drafter None: --no-drafter)."""
    model = ["--no-drafter"] if drafter is None else ["--drafter", str(drafter)]
    return on_cpu("run", "--target", str(target), *model, "--prompt", prompt, *flags)


def bench_argv(*flags: str) -> list[str]:
    """`dflash-chat bench <flags> --json --device cpu`."""
    return on_cpu("bench", *flags, "--json")


def test_run_prints_the_answer_and_a_stats_line(pair, capsys):
    target, drafter = pair
    assert main(run_argv(target, drafter, "hello", "--max-tokens", "12")) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert "tok/s" in out[-1] and "acceptance" in out[-1] and "tokens/step" in out[-1]
    assert " · draft auto, " in out[-1] and "/step · steps dflash " in out[-1]  # the steps each method drafted


def test_run_draft_sets_how_many_drafts_each_step_verifies(pair, capsys):
    target, drafter = pair

    def draft(value: str) -> list[str]:
        return run_argv(target, drafter, "hi", "--max-tokens", "10", "--json", "--draft", value)

    assert main(draft("3")) == 0
    three = json.loads(capsys.readouterr().out)
    used = [k for k, steps in enumerate(three["draft_histogram"]) if steps]
    assert three["draft"] == "3" and max(used) == 3  # fewer only where fewer tokens are left to write
    assert three["draft_histogram"][3] >= three["steps"] - 3 and three["mean_draft_length"] <= 3
    assert main(draft("off")) == 0
    off = json.loads(capsys.readouterr().out)
    assert off["draft"] == "off" and off["drafted"] == 0 and off["draft_histogram"][0] == off["steps"] == 9
    assert off["answer"] == three["answer"]  # greedy: the same tokens, however many drafts


def test_run_lowers_a_draft_above_the_drafters_block_and_says_so_in_the_rules_words(pair, capsys):
    """The tiny drafter's block is 16: a verify step takes at most 15 drafts; 20 is fitted, not shown as given."""
    from dflash_chat.engine import rules

    target, drafter = pair
    assert main(run_argv(target, drafter, "hi", "--max-tokens", "10", "--json", "--draft", "20")) == 0
    out = capsys.readouterr()
    record = json.loads(out.out)
    assert record["draft"] == "15" and max(k for k, n in enumerate(record["draft_histogram"]) if n) <= 15
    assert f"note: {rules.fit_draft(20, 15)[1]}" in out.err.splitlines()
    assert "draft 20 is more drafts per step than this model pair makes (at most 15); drafting 15" in out.err


def test_run_takes_the_settings_files_draft_and_says_what_in_it_cannot_be_used(pair, capsys, monkeypatch, tmp_path):
    target, drafter = pair
    monkeypatch.setenv("DFLASH_CHAT_HOME", str(tmp_path))
    config = tmp_path / "config" / "config.toml"
    config.parent.mkdir()
    config.write_text('draft = 4\ntemperature = "hot"\n')
    assert main(run_argv(target, drafter, "hi", "--max-tokens", "8", "--json")) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["draft"] == "4"
    assert out.err.count("temperature must be a number") == 1 and "fix or remove that line" in out.err
    config.write_text("draft = = 4\n")  # not TOML at all: the defaults, and the file's problem in one line
    assert main(run_argv(target, drafter, "hi", "--max-tokens", "8", "--json")) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["draft"] == "auto"
    problem = [line for line in out.err.splitlines() if "config.toml" in line]
    assert len(problem) == 1 and problem[0].startswith("note: ") and "is not valid TOML" in problem[0]


def test_run_streams_the_same_answer_the_json_record_holds(pair, capsys):
    target, drafter = pair
    common = run_argv(target, drafter, "hello", "--max-tokens", "12")
    assert main(common) == 0
    streamed = capsys.readouterr().out.rsplit("\n", 2)[0]  # all but the stats line
    assert main(common + ["--json"]) == 0
    assert streamed == json.loads(capsys.readouterr().out)["answer"]


def test_run_json_record_has_the_generation_stats(pair, capsys):
    target, drafter = pair
    assert main(run_argv(target, drafter, "hi", "--max-tokens", "10", "--json")) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["new_tokens"] == 10 and record["speculative"] is True
    assert record["steps"] == sum(record["draft_histogram"]) >= sum(record["acceptance_histogram"])
    assert record["draft"] == "auto" and record["mean_draft_length"] == record["drafted"] / record["steps"]
    assert 0 <= record["acceptance_rate"] <= 1 and record["mean_acceptance_length"] >= 1
    assert isinstance(record["answer"], str)


def test_run_speculate_chooses_the_method_and_the_record_says_which_drafted(pair, capsys, tmp_path):
    """--speculate mtp with a target that has its own MTP layer and no drafter; with one that lacks it, one line."""
    from tests.engine.tiny import write_target

    target, _ = pair
    with_mtp = tmp_path / "with-mtp"
    write_target(with_mtp, "qwen3_5", seed=4, mtp=True)
    argv = on_cpu("run", "--target", str(with_mtp), "--prompt", "hi", "--max-tokens", "10", "--json")
    assert main([*argv, "--speculate", "mtp", "--draft", "2"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["speculate"] == "mtp" and set(record["methods"]) == {"mtp"}
    assert record["methods"]["mtp"]["steps"] == record["steps"] and record["methods"]["mtp"]["share"] == 1.0
    assert main(on_cpu("run", "--target", str(target), "--prompt", "hi", "--speculate", "mtp")) == 2
    assert (
        capsys.readouterr()
        .err.strip()
        .splitlines()[-1]
        .startswith("dflash-chat: speculate mtp needs the target's own MTP layer")
    )


def test_run_without_drafter_is_plain_decoding(pair, capsys):
    target, _ = pair
    assert main(run_argv(target, None, "hi", "--max-tokens", "5", "--json")) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["speculative"] is False and record["drafted"] == 0 and record["mean_acceptance_length"] == 1.0


def test_run_raw_skips_the_chat_template(pair, capsys):
    target, drafter = pair
    main(run_argv(target, drafter, "def", "--raw", "--max-tokens", "3", "--json"))
    raw = json.loads(capsys.readouterr().out)["prompt_tokens"]
    main(run_argv(target, drafter, "def", "--max-tokens", "3", "--json"))
    templated = json.loads(capsys.readouterr().out)["prompt_tokens"]
    assert raw < templated


def test_run_bad_paths_give_one_line(pair, capsys, tmp_path):
    target, drafter = pair
    assert main(["run", "--target", str(tmp_path / "missing"), "--drafter", str(drafter), "--prompt", "x"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "does not exist" in err
    assert main(["run", "--target", str(target), "--prompt", "x"]) == 2
    assert "--drafter" in capsys.readouterr().err


OUT_OF_MEMORY_RUN = """
import resource, sys
import torch  # the interpreter and torch first; then only 256 MB more address space
from dflash_chat.cli import main
size = int(open("/proc/self/status").read().split("VmSize:")[1].split()[0]) * 1024
resource.setrlimit(resource.RLIMIT_AS, (size + 2**28, size + 2**28))
sys.exit(main(sys.argv[1:]))
"""


def test_run_out_of_memory_is_one_line(pair, tmp_path):
    """The longest context a flag allows, on a machine with too little memory for its cache."""
    import subprocess
    import sys

    target, drafter = pair
    argv = run_argv(target, drafter, "x", "--context", "1048576")
    done = subprocess.run([sys.executable, "-c", OUT_OF_MEMORY_RUN, *argv], capture_output=True, text=True, timeout=300)
    err = done.stderr.strip()
    assert done.returncode == 2 and err.count("\n") == 0, err
    assert err.startswith("dflash-chat: out of memory") and "--context" in err


def test_bench_compares_dflash_with_autoregressive(capsys):
    code = main(
        bench_argv("--hidden", "64", "--layers", "4", "--prompts", "2", "--tokens", "40", "--acceptance", "0.9")
    )
    record = json.loads(capsys.readouterr().out)
    assert code == 0 and record["identical_output"] is True
    assert record["mean_acceptance_length"] > 2
    assert record["speedup"] == pytest.approx(record["dflash_tokens_per_s"] / record["ar_tokens_per_s"])
    assert "error-injecting" in record["setup"]


def test_bench_against_transformers_generates_the_same_tokens(capsys):
    main(bench_argv("--hidden", "64", "--layers", "4", "--prompts", "1", "--tokens", "24", "--vs-transformers"))
    record = json.loads(capsys.readouterr().out)
    assert record["transformers_identical"] is True
    assert record["ar_vs_transformers"] == pytest.approx(
        record["ar_tokens_per_s"] / record["transformers_tokens_per_s"]
    )


@pytest.mark.parametrize("mode", [["--demo"], ["--target", "no-such-target", "--drafter", "no-such-drafter"]])
def test_bench_refuses_vs_transformers_without_the_random_target_before_loading(mode, capsys):
    # the paths do not exist: the flag is refused before anything is read
    assert main(on_cpu("bench", *mode, "--vs-transformers")) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--vs-transformers" in err and "does not exist" not in err


@pytest.mark.parametrize("mode", [[], ["--structured"], ["--demo", "--http"]])
def test_bench_refuses_repeats_where_answers_are_not_repeated(mode, capsys):
    assert main(on_cpu("bench", *mode, "--repeats", "2")) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--repeats goes with --demo" in err


def test_figures_over_several_prompts_leave_out_each_prompts_first_token():
    from dflash_chat.bench.comparison import Comparison, Run
    from dflash_chat.engine.events import GenerationStats

    runs = [
        Run([], GenerationStats(new_tokens=9, steps=2, drafted=30, accepted=6, decode_s=0.5, verify_s=0.2)),
        Run([], GenerationStats(new_tokens=5, steps=4, drafted=60, accepted=0, decode_s=1.5, verify_s=0.4)),
    ]
    c = Comparison(ar=runs, spec=runs)
    # 8 + 4 tokens came from 6 verify steps in 2 s; each prompt's first token came from its prefill
    assert c.mean_acceptance_length == pytest.approx(12 / 6)
    assert c.spec_tokens_per_s == pytest.approx(12 / 2.0) and c.speedup == pytest.approx(1.0)
    assert c.acceptance_rate == pytest.approx(6 / 90) and c.new_tokens == 14
    assert c.verify_ms_per_step == pytest.approx(1000 * 0.6 / 6)


def test_the_median_speedup_is_over_prompts_and_the_mean_draft_length_over_steps():
    from dflash_chat.bench.comparison import Comparison, Run
    from dflash_chat.engine.events import GenerationStats

    ar = [Run([], GenerationStats(new_tokens=11, steps=10, decode_s=1.0)) for _ in range(3)]  # 10 tok/s each
    spec = [
        Run([], GenerationStats(new_tokens=11, steps=2, drafted=30, decode_s=0.5)),
        Run([], GenerationStats(new_tokens=11, steps=3, drafted=15, decode_s=0.25)),
        Run([], GenerationStats(new_tokens=11, steps=10, drafted=0, decode_s=0.1)),
    ]
    c = Comparison(ar=ar, spec=spec)
    assert c.speedups == pytest.approx([2.0, 4.0, 10.0]) and c.median_speedup == pytest.approx(4.0)
    assert c.speedup == pytest.approx((30 / 0.85) / 10)  # over all prompts' tokens and time
    assert c.mean_draft_length == pytest.approx(45 / 15)


def test_of_an_answers_repeats_the_one_with_the_median_time_per_token_counts():
    from dflash_chat.bench.comparison import Run, median_run
    from dflash_chat.engine.events import GenerationStats

    def run(tokens: int, seconds: float) -> Run:
        return Run([tokens], GenerationStats(new_tokens=tokens, decode_s=seconds))

    busy, usual, quick = run(10, 2.0), run(20, 2.0), run(10, 0.5)  # 0.2, 0.1 and 0.05 s per token
    assert median_run([busy, usual, quick]) is usual  # per token: the longest answer is not the slowest
    assert median_run([busy, quick]) is quick  # of two, the faster: a busy moment only ever adds time
    assert median_run([busy]) is busy


def test_a_divergence_is_located_and_its_logit_gap_measured(pair):
    import torch

    from dflash_chat.bench.comparison import _divergence, generate
    from dflash_chat.engine.load import load_target
    from dflash_chat.engine.sampling_params import SamplingParams
    from dflash_chat.engine.spec import Engine

    target = load_target(pair[0], "cpu", torch.float32)
    engine = Engine(target, None, max_context=128)
    prompt = [3, 1, 4, 1, 5]
    ar = generate(engine, prompt, SamplingParams(max_new_tokens=12)).tokens
    spec = ar[:6] + [(ar[6] + 1) % target.cfg.vocab_size] + ar[7:]
    d = _divergence(engine, 0, prompt, ar, spec)
    logits, _ = target(torch.tensor(prompt + ar[:6]), target.new_state(32), logits="last")
    top = logits.topk(2).values
    assert d.position == 6 and d.logit_gap == pytest.approx(float(top[0] - top[1]))
    assert d.near_tie == (d.logit_gap < 1e-3)


def test_run_demo_prints_the_stats_record(capsys):
    from dflash_chat.models.demo import demo_available

    assert demo_available(), "the demo pair ships with the package"
    assert (
        main(on_cpu("run", "--demo", "--prompt", "How is `os.path.join` implemented?", "--max-tokens", "24", "--json"))
        == 0
    )
    record = json.loads(capsys.readouterr().out)
    assert record["speculative"] is True and record["new_tokens"] >= 1
    assert record["steps"] == sum(record["draft_histogram"]) >= sum(record["acceptance_histogram"])
    assert (
        record["draft"] == "auto"
        and record["mean_draft_length"] == record["drafted"] / record["steps"]
        and record["answer"]
    )


def test_bench_demo_measures_every_class_draft_setting_and_temperature(capsys):
    from dflash_chat.bench.demo_pair import CLASSES, DRAFTS, LOOKUP_DRAFTS, MTP_DEPTHS, draft_key, method_of
    from dflash_chat.models.demo import chosen_kind, demo_drafters
    from dflash_chat.settings import Settings

    assert main(bench_argv("--demo", "--prompts", "1", "--tokens", "12", "--top-k", "5", "--repeats", "1")) == 0
    record = json.loads(capsys.readouterr().out)
    setup = record["setup"]
    assert setup["prompts_per_class"] == {name: 1 for name in CLASSES} and setup["max_new_tokens"] == 12
    assert setup["repeats"] == 1 and setup["load"] == 0 and "wait_policy" in setup
    app = Settings()
    assert list(record["temperatures"]) == ["0", format(app.temperature, "g")]
    greedy, sampled = record["temperatures"].values()
    assert greedy["temperature"] == 0 and greedy["greedy"] is True
    # the flag given shapes the sampled leg, the app's defaults the rest
    assert (sampled["temperature"], sampled["top_p"], sampled["top_k"]) == (app.temperature, app.top_p, 5)
    assert sampled["app_defaults"] is False
    for leg in (greedy, sampled):
        assert list(leg["classes"]) == list(CLASSES)
        for c in leg["classes"].values():
            assert c["prompts"] == 1 and c["plain"]["tokens_per_s"] > 0 and 1 <= c["plain"]["new_tokens"] <= 12
            assert list(c["drafts"]) == [draft_key(kind, d) for kind in demo_drafters() for d in DRAFTS] + [
                *(f"mtp/{k}" for k in MTP_DEPTHS),
                f"lookup/{LOOKUP_DRAFTS}",
            ]
            # each method alone at fixed depth drafts with that method only; auto weighs them all per step
            for key, d in c["drafts"].items():
                if method_of(key) != "auto":
                    method = {"mtp": "mtp", "lookup": "lookup"}.get(key.split("/")[0], "dflash")
                    assert set(d["methods"]) <= {method, "plain"}
                    assert sum(m["steps"] for m in d["methods"].values()) == sum(d["draft_histogram"])
            # the decode loop's host time per step around the model calls, for every engine and each auto method
            assert c["plain"]["host_us_per_step"] > 0
            for d in c["drafts"].values():
                assert d["host_us_per_step"] > 0 and all(m["host_us_per_step"] > 0 for m in d["methods"].values())
            for d in c["drafts"].values():
                assert d["tau"] >= 1.0 and 0.0 <= d["acceptance_rate"] <= 1.0 and d["mean_draft_length"] >= 0.0
                assert d["speedup"] > 0 and d["median_speedup"] == pytest.approx(d["per_prompt_speedup"][0])
                # greedy: DFlash's text is plain decoding's, token for token, at both draft settings
                assert d["identical"] is (True if leg["greedy"] else None)
            assert sum(c["drafts"]["15"]["draft_histogram"][1:]) >= 1  # fixed drafts (capped only near the end)
    assert record["identical"] is True
    assert setup["drafters"] == {kind: folder.name for kind, folder in demo_drafters().items()}
    assert setup["demo_drafter"] == chosen_kind()
    assert set(record["faster"]["mean_speedup"]) == set(demo_drafters())
    assert record["faster"]["drafter"] == max(
        record["faster"]["mean_speedup"], key=record["faster"]["mean_speedup"].get
    )
    for kind in demo_drafters():
        code = greedy["classes"]["code"]["drafts"][draft_key(kind, 15)]
        assert code["tau"] > 1.0  # the drafters were trained for these
    assert setup["mtp"] is True and greedy["classes"]["code"]["drafts"]["mtp/3"]["tau"] > 1.0  # the demo's MTP layer
    assert list(CLASSES) == ["code", "raw_code", "prose", "copy", "image"]
    # the image class's prompts carry an image each (through the demo's random tower), the others none; every
    # method's greedy text on them is plain decoding's (checked above for every class)
    assert greedy["classes"]["image"]["plain"]["image_tokens"] == 12 and setup["image_sizes"] == [[128, 96]]
    assert all(greedy["classes"][name]["plain"]["image_tokens"] == 0 for name in CLASSES if name != "image")
    assert all(d["identical"] is True for d in greedy["classes"]["image"]["drafts"].values())
    # the goals' summary: per leg and class, auto against plain and the best single method at fixed depth
    goals = record["goals"]
    assert goals["auto"] == draft_key(chosen_kind(), "auto") and list(goals["legs"]) == list(record["temperatures"])
    for key, leg in goals["legs"].items():
        for name, row in leg.items():
            drafts = record["temperatures"][key]["classes"][name]["drafts"]
            single = {k: d["speedup"] for k, d in drafts.items() if method_of(k) != "auto"}
            assert row["best_single"] == max(single, key=single.get)
            assert row["auto_vs_best_single"] == pytest.approx(drafts[goals["auto"]]["speedup"] / max(single.values()))
            assert set(row["mtp"]) == {"1", "2", "3"}
            assert ("identical" in row) is (key == "0")
            if name == "copy":
                assert row["lookup_vs_plain"] == drafts[f"lookup/{LOOKUP_DRAFTS}"]["speedup"]


def test_bench_demo_report_keeps_its_plain_text_lines(capsys):
    from dflash_chat.bench.demo_pair import format_report

    leg = {
        "temperature": 0.0,
        "top_p": 1.0,
        "top_k": 0,
        "greedy": True,
        "app_defaults": False,
        "classes": {
            "code": {
                "title": "held-out code questions (chat template)",
                "prompts": 2,
                "plain": {"tokens_per_s": 50.0, "host_us_per_step": 31.0},
                "drafts": {
                    "15": {
                        "tokens_per_s": 100.0,
                        "speedup": 2.0,
                        "median_speedup": 2.1,
                        "tau": 5.0,
                        "acceptance_rate": 0.25,
                        "mean_draft_length": 15.0,
                        "identical": True,
                        "host_us_per_step": 42.0,
                    },
                    "auto": {
                        "tokens_per_s": 110.0,
                        "speedup": 2.2,
                        "median_speedup": 2.3,
                        "tau": 4.0,
                        "acceptance_rate": 0.5,
                        "mean_draft_length": 6.0,
                        "identical": False,
                    },
                },
            }
        },
    }
    setup = {"prompts_per_class": {"code": 2}, "max_new_tokens": 8, "device": "cpu", "dtype": "float32", "threads": 1}
    text = format_report({"setup": setup, "temperatures": {"0": leg}, "identical": False})
    assert "temperature 0 (greedy)" in text and "2 prompts, plain decode 50.0 tok/s (host 31 µs/step)" in text
    assert "(host 42 µs/step)" in text  # the fixed 16's row; the auto row's figures have none (older JSON): left out
    assert text.count("µs/step") == 2
    assert "fixed 16" in text and "2.00x (median 2.10x)" in text and "τ  5.00" in text and "acceptance  25.0%" in text
    assert "identical: NO" in text and text.endswith("identical greedy output: NO: a method changed the output (a bug)")


def test_bench_demo_sampled_leg_comes_from_the_flags_or_the_apps_defaults():
    from dflash_chat.bench.demo_pair import Sampling, sampling_legs
    from dflash_chat.errors import UserError
    from dflash_chat.settings import Settings

    app = Settings()
    assert sampling_legs(None, None, None) == [Sampling(), Sampling(app.temperature, app.top_p, app.top_k)]
    assert sampling_legs(1.0, 0.9, None) == [Sampling(), Sampling(1.0, 0.9, app.top_k)]
    assert sampling_legs(0.0, None, None) == [Sampling()]  # greedy alone
    with pytest.raises(UserError, match="greedy leg only"):
        sampling_legs(0.0, 0.9, None)


def test_bench_measures_a_users_own_pair(pair, capsys):
    target, drafter = pair
    assert main(bench_argv("--target", str(target), "--drafter", str(drafter), "--prompts", "2", "--tokens", "16")) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["prompts"] == 2 and record["identical_output"] is True
    assert record["new_tokens"] <= 2 * 16
    # the load rate beside the disk's read rate of the same file
    assert record["load_bytes"] > 0 and record["load_s"] > 0 and record["load_bytes_per_s"] > 0
    assert record["disk_read_bytes_per_s"] > 0


def test_disk_read_rate_reads_the_file(tmp_path):
    from dflash_chat.models import disk

    path = tmp_path / "w.safetensors"
    path.write_bytes(b"x" * (3 << 20))
    rate, _ = disk.read_rate(path, limit=1 << 20)
    assert rate > 0
    assert disk.largest_file(tmp_path) == path


def test_run_json_schema_holds_the_answer_to_the_schema(pair, capsys, tmp_path):
    """Inline or from a file: the tiny random target writes one JSON value valid for the schema, and ends."""
    import jsonschema

    target, drafter = pair
    schema = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}, "n": {"enum": [1, 2]}},
        "required": ["ok", "n"],
        "additionalProperties": False,  # (as JSON schema has it, other keys are allowed otherwise)
    }
    path = tmp_path / "schema.json"
    path.write_text(json.dumps(schema))
    for given in (json.dumps(schema), str(path)):
        assert main(run_argv(target, drafter, "hi", "--max-tokens", "40", "--json", "--json-schema", given)) == 0
        record = json.loads(capsys.readouterr().out)
        assert record["finish_reason"] == "stop"
        jsonschema.validate(json.loads(record["answer"]), schema)


@pytest.mark.parametrize(
    "given, words",
    [
        ("missing.json", "cannot read"),
        ('{"type": "object", "properties": 3}', "not a valid JSON schema"),
        ("{not json", "not JSON"),
        ("[1, 2]", "cannot read"),
    ],
)
def test_run_json_schema_refuses_what_is_not_a_schema_in_one_line_before_loading(pair, capsys, given, words):
    target, drafter = pair
    assert main(run_argv(target, drafter, "hi", "--json-schema", given)) == 2
    err = capsys.readouterr().err.strip()
    assert words in err and len(err.splitlines()) == 1 and "Traceback" not in err


@pytest.mark.slow(seconds=60)
def test_bench_structured_holds_every_methods_answers_to_the_grammar_and_says_what_it_costs(capsys):
    """One task of each class, both legs: the greedy answers are the same under every method, constrained answers
    are never more often cut than unconstrained ones are invalid, and the mask cost and compile times are there;
    the held-out schemas are accepted (or refused in words) and every finished answer to them validates."""
    assert main(on_cpu("bench", "--structured", "--prompts", "1", "--tokens", "24", "--json")) == 0
    figures = json.loads(capsys.readouterr().out)
    assert figures["identical"] is True
    for leg in figures["legs"]:
        for rows in leg["classes"].values():
            assert set(rows) == {"none", "dflash", "mtp", "lookup", "auto", "auto-no-forced", "unconstrained"}
            assert rows["auto-no-forced"]["forced_drafts"] == 0
            for f in rows.values():
                assert 0 <= f["valid"] <= 1 and 0 <= f["cut"] <= 1 and f["valid"] + f["cut"] <= 1
    for name in ("qwen3", "qwen3.6"):  # both real vocabularies ship in the test extras
        assert figures["masks"][name]["p99_us"] >= figures["masks"][name]["p50_us"] > 0
    assert set(figures["compile_s"]) == {"json", "calls"}
    held = figures["heldout"]  # the held-out schemas: accepted or refused in one line, finished answers valid
    assert held["schemas"] == 15 and held["accepted"] >= 0.9 and held["answers"] + len(held["refused"]) == 15
    assert all("\n" not in reason and reason.startswith(f"'{name}") for name, reason in held["refused"].items())
    assert held["valid"] in (None, 1.0) and held["finished"] == round(held["answers"] * (1 - held["cut"]))


def test_bench_load_busies_cores_for_the_run_and_stops_them_after():
    import time

    from dflash_chat.bench.load import busy_cores

    def cpu_seconds(pid: int) -> float:
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    with busy_cores(1) as pids:
        assert len(pids) == 1
        time.sleep(1.5)  # a spawned child's first second goes to starting Python
        before = cpu_seconds(pids[0])
        time.sleep(0.6)
        assert cpu_seconds(pids[0]) - before > 0.1  # it runs (a shared core: at least a share of it)
    assert not os.path.exists(f"/proc/{pids[0]}") or "Z" in open(f"/proc/{pids[0]}/stat").read().split()[2]


@pytest.mark.parametrize("mode", [[], ["--synthetic", "qwen3.6-27b"], ["--demo", "--http"]])
def test_bench_refuses_load_where_no_engine_runs_beside_it(mode, capsys):
    assert main(on_cpu("bench", *mode, "--load", "1")) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--load goes with --demo" in err
