from __future__ import annotations

import sys

from dflash_chat.runtime.memory import memory_use


def test_cpu_reports_this_process_ram():
    use = memory_use("cpu")
    assert use.kind == "RAM"
    assert 0 < use.used_bytes < use.total_bytes


def test_gpu_without_torch_loaded_reports_nothing(monkeypatch):
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    assert memory_use("cuda:0") is None
