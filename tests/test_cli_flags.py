"""Command-line flags are checked before anything loads, with the settings' own rules and words,
and a command's options are taken after it (and refused before it)."""

from __future__ import annotations

import pytest

from dflash_chat import settings
from dflash_chat.cli import main
from dflash_chat.models import hardware
from dflash_chat.models.hardware import GIB, Gpu, Machine

MISSING = "/no/such/model"  # were anything loaded, the error would be about this path


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err.strip()


@pytest.mark.parametrize(
    "flag, value, key",
    [
        ("--max-tokens", "0", "max_new_tokens"),
        ("--max-tokens", "-5", "max_new_tokens"),
        ("--temperature", "-1", "temperature"),
        ("--top-p", "5", "top_p"),
        ("--top-k", "-3", "top_k"),
        ("--context", "-5", "context_length"),
        ("--context", "0", "context_length"),
        ("--temperature", "warm", "temperature"),
        ("--max-tokens", "2.5", "max_new_tokens"),
    ],
)
def test_run_refuses_bad_values_like_the_settings_file_before_loading(capsys, flag, value, key):
    assert main(["run", "--target", MISSING, "--drafter", MISSING, "--prompt", "hi", flag, value]) == 2
    err = one_line_error(capsys)
    with pytest.raises(settings.SettingsError) as refused:
        settings.parse_value(key, value)
    rule = str(refused.value).removeprefix(f"{key} ")  # 'must be a whole number from 1 to 1000000, got 0'
    assert err == f"dflash-chat run: argument {flag}: {rule} (see `dflash-chat run --help`)"


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["run", "--demo", "--prompt", "hi", "--seed", "-1"], "argument --seed: must be a whole number from 0 to"),
        (["run", "--demo", "--prompt", "hi", "--seed", "1e40"], "argument --seed: must be a whole number"),
        (["bench", "--prompts", "0"], "argument --prompts: must be a whole number from 1 to 10000, got 0"),
        (["bench", "--tokens", "0"], "argument --tokens: must be a whole number from 1 to 1000000, got 0"),
        (["bench", "--block", "0"], "argument --block: must be a whole number from 1 to 256, got 0"),
        (["bench", "--threads", "-1"], "argument --threads: must be a whole number from 1 to 4096, got -1"),
        (["bench", "--acceptance", "2"], "argument --acceptance: must be a number from 0 to 1, got 2"),
        (["bench", "--layers", "0"], "argument --layers: must be a whole number from 1 to 512, got 0"),
        (["bench", "--demo", "--top-p", "2"], "argument --top-p: must be a number greater than 0 and at most 1"),
        (
            ["bench", "--demo", "--temperature", "3"],
            "argument --temperature: must be a number from 0 to 2 (0 = greedy)",
        ),
        (["bench", "--demo", "--top-k", "-2"], "argument --top-k: must be a whole number from -1 or 0 to 2147483647"),
        (["bench", "--top-k", "5"], "--top-k go with --demo"),
        (
            ["bench", "--demo", "--http", "--temperature", "0.5"],
            "--temperature go with --demo, --tools or --structured (their sampled",
        ),
        (["bench", "--tools", "--demo"], "--tools measures the demo pair on its own: leave out --demo"),
        (["bench", "--tools", "--http"], "--tools measures the demo pair on its own"),
        (["bench", "--demo", "--temperature", "0", "--top-p", "0.9"], "--temperature 0 runs the greedy leg only"),
        (
            ["bench", "--synthetic", "qwen3.6-27b", "--image", "1024"],
            "argument --image: must be WIDTHxHEIGHT in pixels",
        ),
        (["bench", "--synthetic", "qwen3.6-27b", "--image", "0x768"], "argument --image: each side must be from 1 to"),
        (
            ["bench", "--synthetic", "qwen3.6-27b", "--image", "4x1000"],
            "argument --image: an image more than 200 times",
        ),
        (["bench", "--image", "1024x768"], "--image goes with --synthetic MODEL (the vision tower's cost) or --demo"),
        (["bench", "--tools", "--image", "64x64"], "--image goes with --synthetic MODEL"),
        (["bench", "--demo", "--http", "--image", "64x64"], "--image goes with --synthetic MODEL"),
        (["--context", "0"], "argument --context: must be a whole number from 256 to 1048576, got 0"),
        (["--context", "-5"], "argument --context: must be a whole number from 256 to 1048576, got -5"),
        (["models", "--context", "0"], "argument --context: must be a whole number from 256 to 1048576, got 0"),
        (["pull", "--context", "-5"], "argument --context: must be a whole number from 256 to 1048576, got -5"),
    ],
)
def test_every_numeric_flag_is_checked_in_one_line(capsys, argv, fragment):
    assert main(argv) == 2
    assert fragment in one_line_error(capsys)


DRAFT_RULE = "must be auto, off or a number of drafts per step (1-64)"


@pytest.mark.parametrize(
    "argv, command, value",
    [
        (["--draft", "0"], "dflash-chat", "'0'"),
        (
            ["run", "--target", MISSING, "--drafter", MISSING, "--prompt", "hi", "--draft", "lots"],
            "dflash-chat run",
            "'lots'",
        ),
        (["serve", "--target", MISSING, "--draft", "65"], "dflash-chat serve", "'65'"),
    ],
)
def test_draft_is_checked_like_the_setting_before_anything_loads(capsys, argv, command, value):
    assert main(argv) == 2
    assert one_line_error(capsys) == f"{command}: argument --draft: {DRAFT_RULE}, got {value} (see `{command} --help`)"


SPECULATE_RULE = "must be auto, dflash, mtp, lookup or none"


@pytest.mark.parametrize(
    "argv, command",
    [
        (["--speculate", "eagle"], "dflash-chat"),
        (["run", "--target", MISSING, "--prompt", "hi", "--speculate", "eagle"], "dflash-chat run"),
        (["serve", "--target", MISSING, "--speculate", "eagle"], "dflash-chat serve"),
    ],
)
def test_speculate_is_checked_like_the_setting_before_anything_loads(capsys, argv, command):
    assert main(argv) == 2
    expected = f"{command}: argument --speculate: {SPECULATE_RULE}, got 'eagle' (see `{command} --help`)"
    assert one_line_error(capsys) == expected


def test_draft_is_for_a_local_engine_not_an_endpoint(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("DFLASH_CHAT_HOME", str(tmp_path))
    assert main(["--endpoint", "http://127.0.0.1:9/v1", "--draft", "3"]) == 2
    assert one_line_error(capsys) == "dflash-chat: --endpoint chats with a server's model: leave out --draft"


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["--quant", "Q3_K_S", "models"], "--quant before the command `models` would be ignored"),
        (["--demo", "models"], "--demo before the command `models` would be ignored"),
        (["--context", "4096", "pull"], "--context before the command `pull` would be ignored"),
        (["--set", "top_k=2", "doctor"], "--set before the command `doctor` would be ignored"),
        (["models", "--target-file", "x.gguf"], "dflash-chat models: unrecognized arguments: --target-file x.gguf"),
        (["run", "--prompt", "hi", "--quant", "Q8_0"], "dflash-chat run: unrecognized arguments: --quant Q8_0"),
    ],
)
def test_options_go_after_their_command(capsys, argv, fragment):
    assert main(argv) == 2
    assert fragment in one_line_error(capsys)


@pytest.fixture
def machine(monkeypatch, tmp_path):
    monkeypatch.setenv("DFLASH_CHAT_HOME", str(tmp_path / "app"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    gpu = Machine((Gpu(0, "NVIDIA GeForce RTX 3090", 24 * GIB, int(23.5 * GIB)),), 64 * GIB, 48 * GIB)
    monkeypatch.setattr(hardware, "probe", lambda: gpu)


def test_models_takes_quant_options_after_the_command(machine, capsys):
    assert main(["models", "--quant", "Q3_K_S"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[2:] if line.startswith("qwen")]
    assert rows and all(row[1] == "Q3_K_S" for row in rows)  # one row per pair, for that quant
    assert main(["models", "--model", "qwen3.6-27b", "--drafter-quant", "BF16"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[2:] if line.startswith("qwen")]
    from dflash_chat.models.catalog import load_catalog

    quants = load_catalog().get("qwen3.6-27b").target_quants  # every target quant, each with the BF16 drafter
    assert [(r[0], r[1], r[4]) for r in rows] == [("qwen3.6-27b", q, "BF16") for q in quants]


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["pull", "--quant", "Q9_ZZ"], "Q9_ZZ is not a quant llama.cpp writes"),
        (["pull", "qwen3.6-27b", "--quant", "Q9_ZZ"], "Q9_ZZ is not a quant llama.cpp writes"),
        (["models", "--quant", "Q9_ZZ"], "Q9_ZZ is not a quant llama.cpp writes"),
        (["models", "--drafter-quant", "Q2"], "no model has drafter quant Q2 (they have Q8_0, BF16, Q4_K_M)"),
        (["pull", "qwen3.6-27b", "--quant", "Q8_0", "--drafter-quant", "Q2"], "Qwen3.6-27B has no drafter quant Q2"),
    ],
)
def test_quant_names_are_checked_against_the_catalog_before_any_plan(machine, capsys, argv, fragment):
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert fragment in captured.err and captured.err.count("\n") == 1
    assert "files," not in captured.out  # no download was planned


def test_dflash_chat_home_holds_the_apps_files_and_models_stay_in_the_hf_cache(monkeypatch, tmp_path, capsys):
    """What the README's Files section says: DFLASH_CHAT_HOME moves config and history, not the models."""
    from pathlib import Path

    from huggingface_hub import constants

    from dflash_chat import paths

    home = tmp_path / "home"
    monkeypatch.setenv("DFLASH_CHAT_HOME", str(home))
    for name in ("HF_HOME", "HF_HUB_CACHE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(hardware, "probe", lambda: Machine((), 16 * GIB, 12 * GIB, "no GPU"))
    assert paths.config_file() == home / "config" / "config.toml" and paths.history_db().parent == home / "data"
    assert main(["models"]) == 0
    cache = capsys.readouterr().out.splitlines()[-1]
    assert cache.startswith(f"Cache: {constants.HF_HUB_CACHE} ") and str(home) not in cache
    readme = (Path(__file__).parent.parent / "README.md").read_text()
    files = readme[readme.index("## Files") : readme.index("## How it works")]
    assert (
        "`DFLASH_CHAT_HOME=DIR` keeps dflash-chat's own files" in files and "Models stay in the Hugging Face" in files
    )


@pytest.mark.parametrize(
    "argv, env, fragment",
    [
        (
            ["run", "--demo", "--prompt", "hi", "--device", "tpu"],
            None,
            "--device 'tpu' is not a device: use cpu, cuda or cuda:N",
        ),
        (["bench", "--device", "gpu0"], None, "--device 'gpu0' is not a device"),
        (["--demo"], "tpu", "DFLASH_CHAT_DEVICE 'tpu' is not a device"),
        (
            ["run", "--demo", "--prompt", "hi"],
            "tpu",
            "DFLASH_CHAT_DEVICE 'tpu' is not a device: use cpu, cuda or cuda:N",
        ),
        (["run", "--demo", "--prompt", "hi"], "gpu9", "DFLASH_CHAT_DEVICE 'gpu9' is not a device: use cpu, cuda"),
        (["bench", "--demo"], "tpu", "DFLASH_CHAT_DEVICE 'tpu' is not a device"),
    ],
)
def test_a_device_name_is_checked_before_anything_loads(capsys, monkeypatch, argv, env, fragment):
    if env:
        monkeypatch.setenv("DFLASH_CHAT_DEVICE", env)
    assert main(argv) == 2
    assert fragment in one_line_error(capsys)


def test_a_cuda_device_on_a_machine_without_one_says_so(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    assert main(["run", "--demo", "--prompt", "hi", "--device", "cuda:1"]) == 2
    assert "--device cuda:1: this machine has no usable CUDA GPU" in one_line_error(capsys)


@pytest.mark.parametrize("prompt", ["", "   "])
def test_run_refuses_an_empty_prompt_before_loading(capsys, prompt):
    assert main(["run", "--target", MISSING, "--no-drafter", "--prompt", prompt]) == 2
    assert "--prompt is empty: give the message to answer" in one_line_error(capsys)


def test_a_ctrl_c_while_the_commands_import_ends_in_one_line(capsys, monkeypatch):
    """The first second of any command is spent importing; a Ctrl+C there is no traceback."""
    import dflash_chat.cli as cli

    def interrupted():
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "build_parser", interrupted)
    assert main(["run", "--demo", "--prompt", "hi"]) == 130
    assert one_line_error(capsys) == "dflash-chat: interrupted"


def test_bench_help_says_what_demo_measures_every_class_and_method(capsys):
    assert main(["bench", "--help"]) == 0
    demo = " ".join(capsys.readouterr().out.split())
    demo = demo[demo.index("--demo ") : demo.index("--tools ")]
    for words in ("prose questions", "copy-heavy prompts", "DFlash and DFlash2", "MTP layer 1, 2 and 3 deep"):
        assert words in demo, words
    assert "prompt lookup up to 15" in demo and "auto beside each drafter" in demo


def test_readme_says_each_sentence_once():
    from pathlib import Path

    readme = (Path(__file__).parent.parent / "README.md").read_text()
    assert readme.count("the selector drew sampled drafts from a sharper distribution than the target's") == 1
    lines = [line.strip() for line in readme.splitlines() if len(line.strip()) > 40]
    assert not [line for line in set(lines) if lines.count(line) > 1 and not line.startswith(("|", "```"))]


def test_serve_says_what_in_the_settings_file_it_cannot_use_on_stderr(capsys, monkeypatch, tmp_path):
    """As run does: one line per problem, on stderr (stdout is for what serve answers), before anything loads."""
    import socket

    monkeypatch.setenv("DFLASH_CHAT_HOME", str(tmp_path))
    config = tmp_path / "config" / "config.toml"
    config.parent.mkdir()
    config.write_text('temperature = "hot"\n')
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    try:  # a port in use stops serve before the model loads, after the settings were read
        assert main(["serve", "--demo", "--port", str(taken.getsockname()[1])]) == 2
    finally:
        taken.close()
    out, err = capsys.readouterr()
    assert out == ""
    note, refusal = err.splitlines()
    assert note.startswith(f"note: {config}: temperature must be a number from 0 to 2") and "fix or remove" in note
    assert refusal.startswith("dflash-chat: ") and "Traceback" not in err


@pytest.mark.parametrize("after", [0.25, 0.4, 0.5, 0.75])
def test_a_real_ctrl_c_in_runs_first_second_is_one_line(after):
    """SIGINT while `run` imports its modules (before the model loads): no traceback, at any moment."""
    import signal
    import subprocess
    import sys
    import time

    child = subprocess.Popen(
        [sys.executable, "-m", "dflash_chat.cli", "run", "--demo", "--prompt", "hi", "--device", "cpu"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # as a terminal starts it
    )
    time.sleep(after)
    child.send_signal(signal.SIGINT)
    _, err = child.communicate(timeout=120)
    assert "Traceback" not in err.decode(), err.decode()[-2000:]
    assert child.returncode in (130, -signal.SIGINT), err.decode()[-2000:]  # -2: before Python's handler was set


def test_torch_compiles_into_the_apps_cache_folder_not_tmpdir(tmp_path, monkeypatch):
    """Every command runs with torch's inductor cache under the app's cache folder (torch's own default is
    TMPDIR/torchinductor_USER, outside the app's folders and gone at a reboot); a folder the user chose wins."""
    import os

    from dflash_chat.commands import models

    monkeypatch.setenv("DFLASH_CHAT_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    seen = []
    monkeypatch.setattr(models, "run", lambda args: seen.append(os.environ.get("TORCHINDUCTOR_CACHE_DIR")) or 0)
    assert main(["models"]) == 0
    assert seen == [str(tmp_path / "home" / "cache" / "torchinductor")]
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    assert cache_dir() == seen[0]  # where torch itself now puts it
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))
    assert main(["models"]) == 0 and seen[-1] == str(tmp_path / "mine")


# libgomp shows its default policy (spin 300000 times, then sleep) as PASSIVE too: the spin count tells them apart
@pytest.mark.parametrize(
    ("mine", "seen"),
    [(None, ["OMP_WAIT_POLICY = 'PASSIVE'", "GOMP_SPINCOUNT = '0'"]), ("ACTIVE", ["OMP_WAIT_POLICY = 'ACTIVE'"])],
)
def test_torchs_openmp_threads_sleep_at_barriers_unless_the_user_chose(mine, seen, tmp_path):
    """Every command loads torch with OpenMP's PASSIVE wait policy (spinning threads collapse decoding on a busy
    machine: dflash_chat/cpu_threads.py); OpenMP itself reports the policy it took, as it loads."""
    import os
    import subprocess
    import sys

    code = (
        "from dflash_chat import cli\nfrom dflash_chat.commands import models\n"
        "models.run = lambda args: 0\nassert cli.main(['models']) == 0\nimport torch\ntorch.ones(4).sum()\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    env |= {"OMP_DISPLAY_ENV": "VERBOSE", "DFLASH_CHAT_HOME": str(tmp_path)} | (
        {"OMP_WAIT_POLICY": mine} if mine else {}
    )
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert all(line in done.stderr for line in seen), done.stderr


def test_a_ctrl_c_during_an_import_is_raised_when_the_import_is_over(monkeypatch, capsys, tmp_path):
    """Thrown inside an import, a KeyboardInterrupt can cross C++ that cannot carry it (torch.distributed's init
    aborts the process: SIGABRT, a C++ dump) or be lost in a library's `except`. The import finishes whole; the
    Ctrl+C ends the command right after, in one line."""
    import signal
    import sys
    import time

    from dflash_chat.commands import models

    (tmp_path / "halfway_import.py").write_text(
        "import os, signal, time\n"
        "os.kill(os.getpid(), signal.SIGINT)\n"
        "time.sleep(0.1)  # Python runs its handler here, inside the import\n"
        "finished = True\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    after: list[float] = []

    def imports_then_works(args):
        import halfway_import  # noqa: F401

        after.append(time.monotonic())
        time.sleep(10)
        return 0

    before = signal.getsignal(signal.SIGINT)
    monkeypatch.setattr(models, "run", imports_then_works)
    try:
        assert main(["models"]) == 130
        ended = time.monotonic()
    finally:
        sys.modules.pop("halfway_import", None)
    assert capsys.readouterr().err.strip() == "dflash-chat: interrupted"
    assert after and ended - after[0] < 2  # the Ctrl+C held back, not dropped
    assert signal.getsignal(signal.SIGINT) is before


def test_an_import_broken_by_a_ctrl_c_is_the_ctrl_c_not_a_traceback(monkeypatch, capsys):
    """A Ctrl+C inside a C extension's import (numpy's, under torch's) leaves it half made, and the next import of
    it raises ImportError: that is the user's Ctrl+C (one line, 130); the same ImportError with no Ctrl+C is a bug
    and stays one."""
    import os
    import signal

    from dflash_chat.commands import models

    def interrupted_import(args):
        try:
            os.kill(os.getpid(), signal.SIGINT)  # Python runs its handler before the next line
        except KeyboardInterrupt:
            pass  # what an extension's init does with it: lost, the module left half made
        raise ImportError("cannot load module more than once per process")

    before = signal.getsignal(signal.SIGINT)
    try:
        monkeypatch.setattr(models, "run", interrupted_import)
        assert main(["models"]) == 130
        assert capsys.readouterr().err.strip() == "dflash-chat: interrupted"

        def broken_import(args):
            raise ImportError("cannot load module more than once per process")

        monkeypatch.setattr(models, "run", broken_import)
        with pytest.raises(ImportError):
            main(["models"])
    finally:
        signal.signal(signal.SIGINT, before)
