"""tools/gpu_check.py's CPU dry run: the report it would print on a GPU, built with the torch path."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from tests.engine.quant_helpers import one_thread

_single_thread = pytest.fixture(autouse=True)(one_thread)

SCRIPT = Path(__file__).resolve().parents[2] / "tools" / "gpu_check.py"


def _load_script():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)
    return gpu_check


def test_gpu_check_dry_run_writes_a_complete_report(tmp_path, monkeypatch, capsys):
    gpu_check = _load_script()
    monkeypatch.setenv("OUT", str(tmp_path))
    assert gpu_check.main(["--dry-run"]) == 0
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert report["device"] == "cpu" and report["correctness"]["all_ok"]
    assert report["correctness"]["checked"] == len(gpu_check.QUANT_FORMATS) * len(gpu_check.M_VALUES)
    layers = report["benchmark"]["layers"]
    assert [row["name"] for row in layers] == [s[0] for s in gpu_check.SHAPES_27B]
    assert all(row["GBps_M1"] > 0 and row["M16_over_M1"] > 0 for row in layers)
    experts = report["experts"]["rows"]
    assert [row["M"] for row in experts] == [1, 16] and all(row["t_grouped_us"] > 0 for row in experts)
    assert experts[0]["active_experts"] == report["experts"]["top_k"]
    # the loaded modules hold the file's tensor bytes: within 5% of the file (header and padding aside)
    assert abs(report["resident"]["resident_over_file"] - 1) < 0.05
    assert set(report["goals"]) == {"M1_frac_of_copy>=0.70", "M16_over_M1<=1.3", "resident_within_5pct"}
    assert "copy bandwidth" in capsys.readouterr().out


def test_a_kernel_that_fell_back_to_torch_fails_the_check(tmp_path, monkeypatch, capsys):
    """Kernels that fail their first-use check run the torch path: the comparison must not pass as a kernel check."""
    import torch

    from dflash_chat.engine import kernels

    gpu_check = _load_script()
    monkeypatch.setattr(kernels, "_checked", {("matmul", "Q4_K", torch.device("cpu"), torch.float32): False})
    monkeypatch.setenv("OUT", str(tmp_path))
    assert gpu_check.main(["--dry-run"]) == 1
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert report["correctness"]["all_ok"] is False
    assert report["correctness"]["disabled_kernels"] == ["matmul Q4_K cpu torch.float32"]
    assert "DISABLED (fell back to torch): matmul Q4_K" in capsys.readouterr().out
