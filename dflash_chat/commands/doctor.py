"""`dflash-chat doctor`: is this machine ready? One line per check: OK, or what to do."""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from dflash_chat import hardware, paths
from dflash_chat.errors import UserError
from dflash_chat.hardware import gb

CUDA_TORCH = "pip install torch --index-url https://download.pytorch.org/whl/cu128"
MIN_FREE_DISK = 20 * 10**9


@dataclass(frozen=True)
class Check:
    ok: bool
    text: str
    fix: str = ""

    def line(self) -> str:
        return f"OK   {self.text}" if self.ok else f"FIX  {self.text} -> {self.fix}"


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "doctor",
        help="check Python, torch, CUDA, GPUs, kernels, disk, cache and config",
        description="Check that this machine can run dflash-chat; each line is OK or says what to do.",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    checks = [python_check()]
    torch = _import_torch()
    checks += torch_checks(torch)
    machine = hardware.probe()
    checks += [ram_check(machine), choice_check(machine), *hub_checks(), *config_checks()]
    for check in checks:
        print(check.line())
    failed = sum(not c.ok for c in checks)
    print("All good." if not failed else f"{failed} thing(s) to fix.")
    return 0 if not failed else 1


def python_check() -> Check:
    version = platform.python_version()
    if sys.version_info >= (3, 10):
        return Check(True, f"Python {version}")
    return Check(False, f"Python {version}", "install Python 3.10 or newer")


def _import_torch():
    try:
        import torch

        return torch
    except ImportError:
        return None


def torch_checks(torch) -> list[Check]:
    if torch is None:
        fix = f"install it: {CUDA_TORCH} (or plain `pip install torch` for CPU)"
        return [Check(False, "torch is not installed", fix)]
    checks = [Check(True, f"torch {torch.__version__}")]
    if torch.version.cuda is None:
        checks.append(Check(False, "CUDA: this torch is a CPU-only build", f"for an NVIDIA GPU: {CUDA_TORCH}"))
    elif not torch.cuda.is_available():
        checks.append(
            Check(False, f"CUDA {torch.version.cuda}: no GPU visible", "check `nvidia-smi` and CUDA_VISIBLE_DEVICES")
        )
    else:
        checks.append(Check(True, f"CUDA {torch.version.cuda}"))
        for index in range(torch.cuda.device_count()):
            free, total = torch.cuda.mem_get_info(index)
            name = torch.cuda.get_device_name(index)
            checks.append(Check(True, f"GPU {index}: {name}, {gb(total)} total, {gb(free)} free"))
    checks.append(kernel_check(torch))
    return checks


def kernel_check(torch) -> Check:
    try:
        import triton
    except ImportError:
        if torch.cuda.is_available():
            return Check(False, "kernels: Triton is not importable", "pip install triton (fused CUDA kernels)")
        return Check(True, "kernels: torch reference paths (no CUDA; Triton not installed)")
    if torch.cuda.is_available():
        return Check(True, f"kernels: Triton {triton.__version__} with CUDA (fused kernels)")
    return Check(True, f"kernels: Triton {triton.__version__} importable; no CUDA, so torch reference paths")


def ram_check(machine: hardware.Machine) -> Check:
    return Check(True, f"RAM: {gb(machine.ram_total)} total, {gb(machine.ram_available)} available")


def choice_check(machine: hardware.Machine) -> Check:
    from dflash_chat.catalog import CatalogError, load_catalog

    try:
        choice = hardware.choose(machine, load_catalog())
    except CatalogError as exc:
        return Check(False, f"model: {exc}", f"edit {paths.config_file()}")
    except UserError as exc:
        return Check(False, f"model: {exc}", "see `dflash-chat models` and pick one with --model/--quant")
    return Check(True, f"model: {choice.explanation}")


def hub_checks() -> list[Check]:
    from huggingface_hub import get_token

    from dflash_chat import hub  # huggingface_hub and httpx: not on the --help path

    cache = hub.default_cache_dir()
    where = _existing_parent(cache)
    checks = []
    if not os.access(where, os.W_OK):
        checks.append(Check(False, f"HF cache {cache} is not writable", "fix its permissions or set HF_HUB_CACHE"))
    free = shutil.disk_usage(where).free
    if free < MIN_FREE_DISK:
        checks.append(
            Check(False, f"HF cache {cache}: {gb(free)} free disk", "free space or set HF_HUB_CACHE to a bigger disk")
        )
    else:
        checks.append(Check(True, f"HF cache {cache} ({gb(free)} free disk)"))
    endpoint = hub.default_endpoint()
    if hub.is_offline():
        checks.append(Check(True, "Hub: offline (HF_HUB_OFFLINE): cached models only"))
    else:
        checks.append(Check(True, f"Hub: {endpoint}"))
    token = "found" if get_token() else "none (needed only for gated or private repos)"
    checks.append(Check(True, f"Hub token: {token}"))
    return checks


def config_checks() -> list[Check]:
    from dflash_chat import settings
    from dflash_chat.catalog import load_catalog

    config = paths.config_file()
    checks = []
    try:
        settings.load(config)
        user_pairs = sum(p.origin != "catalog" for p in load_catalog(config).pairs)
    except UserError as exc:
        checks.append(Check(False, f"config: {exc}", f"edit {config}"))
    else:
        state = f"{user_pairs} model pair(s) of your own" if config.exists() else "not created yet (defaults)"
        checks.append(Check(True, f"config {config}: {state}"))
    checks.append(Check(True, f"data {paths.data_dir()} (chat history {paths.history_db().name})"))
    return checks


def _existing_parent(path: Path) -> Path:
    for candidate in (path, *path.parents):
        if candidate.exists():
            return candidate
    return Path.cwd()
