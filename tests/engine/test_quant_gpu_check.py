"""tools/gpu_check.py without a GPU: its dry run under Triton's interpreter (the kernels, not the torch path,
against the torch path), its handling of kernels that fell back, and its compile-only mode (bench/compile_check.py
on bench/kernel_cases.py's cases)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from tests.engine.helpers import interpreted
from tests.engine.quant_helpers import one_thread

_single_thread = pytest.fixture(autouse=True)(one_thread)

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tools" / "gpu_check.py"


def _load_script():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)
    return gpu_check


@pytest.mark.slow(seconds=60)
def test_dry_run_checks_the_kernels_in_the_interpreter(tmp_path):
    out = tmp_path / "report.json"
    printed = interpreted([SCRIPT, "--dry-run", "--json", out], timeout=900)  # skips without triton
    report = json.loads(out.read_text())
    gpu_check = _load_script()
    c = report["correctness"]
    assert report["triton"] is True and c["all_ok"] and not c["disabled_kernels"]
    # every format at M = 1, 4, 16, split-K repeats at M = 1 and 16, three expert format pairs on one and five
    # tokens, eight glue kernels
    assert c["checked"] == len(gpu_check.QUANT_FORMATS) * 3 + 2 + 3 * 2 + 8
    assert all(r["identical"] and r["counters_zero"] for r in c["rows"] if r["what"] == "split-K repeat")
    assert {r["format"] for r in c["rows"] if r["what"] == "matmul"} == set(gpu_check.QUANT_FORMATS)
    assert all(r["dequantize_exact"] for r in c["rows"] if r["what"] == "matmul")
    layers = report["benchmark"]["layers"]
    assert [row["name"] for row in layers] == [s[0] for s in gpu_check.SHAPES_27B]
    assert all(row["GBps_M1"] > 0 and row["M16_over_M1"] > 0 for row in layers)
    experts = report["experts"]["rows"]
    assert [(row["formats"], row["M"]) for row in experts] == [
        ("Q4_K+Q6_K", 1),
        ("Q4_K+Q6_K", 16),
        ("Q8_0+Q8_0", 1),
        ("Q8_0+Q8_0", 16),
    ]
    assert experts[0]["active_experts"] == report["experts"]["top_k"]
    # the loaded modules hold the file's tensor bytes: within 5% of the file (header and padding aside)
    assert abs(report["resident"]["resident_over_file"] - 1) < 0.05
    assert set(report["goals"]) == {"M1_frac_of_copy>=0.70", "M16_over_M1<=1.3", "resident_within_5pct"}
    assert "copy bandwidth" in printed


def test_a_kernel_that_fell_back_to_torch_fails_the_check(tmp_path, monkeypatch, capsys):
    """Kernels that fail their first-use check run the torch path: the comparison must not pass as a kernel check."""
    import torch

    from dflash_chat.engine.kernels import first_use

    gpu_check = _load_script()
    monkeypatch.setattr(first_use, "checked", {("matmul", "Q4_K", torch.device("cpu"), torch.float16): False})
    monkeypatch.setenv("OUT", str(tmp_path))
    assert gpu_check.main(["--dry-run"]) == 1
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert report["correctness"]["all_ok"] is False
    assert report["correctness"]["disabled_kernels"] == ["matmul Q4_K cpu torch.float16"]
    assert "DISABLED (fell back to torch): matmul Q4_K" in capsys.readouterr().out


def test_compile_only_builds_without_a_gpu_with_no_spills_and_wide_loads():
    """A few of the configurations the engine picks (27B decode and verify in both files, 35B experts), built
    for Hopper and Ampere by Triton without a driver, then read back from ptxas and the SASS."""
    pytest.importorskip("triton")
    from dflash_chat.bench import compile_check, kernel_cases

    cases = [
        c
        for c in kernel_cases.catalog_cases()
        if c[0].startswith("qwen3.6-27b gate/up") or c[0] == "qwen3.6-35b-a3b experts 1024x2048 Q4_K tokens=1"
    ]
    assert len(cases) == 5  # Q4_K and Q8_0 at M = 1 and 16, and the experts' FMA kernel
    reports = compile_check.compile_all(cases, ["sm_90"]) + compile_check.compile_all(cases[:1], ["sm_86"])
    assert {r.kernel for r in reports} == {"_gemv_kernel", "_gemm_kernel", "_experts_gemv_kernel"}
    for r in reports:
        assert r.regs > 0 and r.spill_bytes == 0, compile_check.format_report(r)
        assert r.loads and r.narrow_loads() == 0, compile_check.format_report(r)  # weights read as 32+ bit words
        if r.kernel != "_gemm_kernel":  # the FMA kernels never stage through shared memory
            assert r.loop_instructions > 0 and r.loop_shared == 0, compile_check.format_report(r)
    q4k_gemv = next(r for r in reports if r.case.endswith("Q4_K M=1") and r.arch == "sm_90")
    assert q4k_gemv.loads.get(128, 0) > 0  # Q4_K's 16-byte aligned fields: 128-bit loads
    assert q4k_gemv.instructions_per_value < 6


def test_the_routed_layers_glue_compiles_without_spills():
    """Router top-k, pair sort (decode's 8 pairs and verify's 128) and the experts' weighted sum, for Hopper."""
    pytest.importorskip("triton")
    from dflash_chat.bench import compile_check, kernel_cases

    cases = [c for c in kernel_cases.catalog_cases() if "router" in c[0] or " route " in c[0] or "sum + shared" in c[0]]
    reports = compile_check.compile_all(cases, ["sm_90"])
    assert {r.kernel for r in reports} == {"_top_k_softmax_kernel", "_route_kernel", "_moe_combine_kernel"}
    assert all(r.spill_bytes == 0 for r in reports), [compile_check.format_report(r) for r in reports]
