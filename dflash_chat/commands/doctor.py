"""`dflash-chat doctor`: is this machine ready? One line per check: OK, or what to do."""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from dflash_chat import paths
from dflash_chat.errors import UserError
from dflash_chat.models import hardware
from dflash_chat.models.sizes import size_text

TORCH_INDEX = "https://download.pytorch.org/whl"
CUDA_TORCH = f"--index-url {TORCH_INDEX}/cu128"
CPU_TORCH = f"--index-url {TORCH_INDEX}/cpu"
MIN_FREE_DISK = 20 * 10**9
HUB_TIMEOUT = 5.0  # seconds to wait for the Hub before calling it unreachable


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
    checks += [
        ram_check(machine),
        *choice_checks(machine),
        *prefix_cache_checks(machine),
        *hub_checks(),
        *config_checks(),
    ]
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


def install_command(args: str) -> str:
    """The pip command that installs into the environment dflash-chat runs from: `pipx runpip
    dflash-chat install ...` for a pipx install (pipx writes pipx_metadata.json into its venvs),
    else this interpreter's `-m pip`."""
    prefix = Path(sys.prefix)
    if (prefix / "pipx_metadata.json").is_file():
        return f"pipx runpip {prefix.name} install {args}"
    return f"{shlex.quote(sys.executable)} -m pip install {args}"


def torch_checks(torch) -> list[Check]:
    if torch is None:
        fix = (
            f"install it: {install_command(f'torch {CUDA_TORCH}')} (CPU only: {install_command(f'torch {CPU_TORCH}')})"
        )
        return [Check(False, "torch is not installed", fix)]
    checks = [Check(True, f"torch {torch.__version__}")]
    if torch.version.cuda is None and not nvidia_gpu_present():  # the build README recommends without a GPU
        checks.append(Check(True, "CUDA: none (a CPU-only torch, and no NVIDIA GPU here: it runs on the CPU)"))
    elif torch.version.cuda is None:
        fix = f"for the NVIDIA GPU here: {install_command(f'--force-reinstall torch {CUDA_TORCH}')}"
        checks.append(Check(False, "CUDA: this torch is a CPU-only build, and this machine has an NVIDIA GPU", fix))
    elif not torch.cuda.is_available():
        checks.append(
            Check(False, f"CUDA {torch.version.cuda}: no GPU visible", "check `nvidia-smi` and CUDA_VISIBLE_DEVICES")
        )
    else:
        checks.append(Check(True, f"CUDA {torch.version.cuda}"))
        for index in range(torch.cuda.device_count()):
            free, total = torch.cuda.mem_get_info(index)
            name = torch.cuda.get_device_name(index)
            checks.append(Check(True, f"GPU {index}: {name}, {size_text(total)} total, {size_text(free)} free"))
    checks.append(kernel_check(torch))
    return checks


def nvidia_gpu_present() -> bool:
    """Whether an NVIDIA GPU is installed, asked of the driver, not of torch (a CPU build of torch sees none):
    the driver's device list, its device files, or its nvidia-smi."""
    import shutil

    gpus = Path("/proc/driver/nvidia/gpus")
    return (gpus.is_dir() and any(gpus.iterdir())) or Path("/dev/nvidia0").exists() or bool(shutil.which("nvidia-smi"))


def kernel_check(torch) -> Check:
    try:
        import triton
    except ImportError:
        if torch.cuda.is_available():
            return Check(
                False, "kernels: Triton is not importable", f"{install_command('triton')} (fused CUDA kernels)"
            )
        return Check(True, "kernels: torch reference paths (no CUDA; Triton not installed)")
    if torch.cuda.is_available():
        return Check(True, f"kernels: Triton {triton.__version__} with CUDA (fused kernels)")
    return Check(True, f"kernels: Triton {triton.__version__} importable; no CUDA, so torch reference paths")


def ram_check(machine: hardware.Machine) -> Check:
    return Check(True, f"RAM: {size_text(machine.ram_total)} total, {size_text(machine.ram_available)} available")


def choice_checks(machine: hardware.Machine) -> list[Check]:
    """What the chat app would run here (the same words as the app and `dflash-chat models`), which drafting
    methods that pick has and why, and whether it loads the vision tower and why."""
    from dflash_chat.commands.models import app_choice
    from dflash_chat.models.catalog import CatalogError, load_catalog

    try:
        explanation, choice = app_choice(machine, load_catalog())
    except CatalogError as exc:
        return [Check(False, f"model: {exc}", f"edit {paths.config_file()}")]
    except UserError as exc:
        return [Check(False, f"model: {exc}", "see `dflash-chat models` and pick one with --model/--quant")]
    if choice is None:
        return [Check(True, f"model: {explanation}")]
    return [
        Check(True, f"model: {explanation}"),
        Check(True, f"drafting: {choice.drafting}"),
        Check(True, f"vision: {choice.vision.why}"),
    ]


def prefix_cache_checks(machine: hardware.Machine) -> list[Check]:
    """The prompt checkpoints' and the parked conversations' budgets, and what of the chosen pair fits."""
    from dflash_chat import settings as settings_module
    from dflash_chat.commands.models import app_choice
    from dflash_chat.models.catalog import load_catalog

    try:
        settings = settings_module.load()
        _, choice = app_choice(machine, load_catalog())
    except UserError:  # said by the model and config lines
        return [Check(True, "prefix cache: see the config line")]
    return [prefix_cache_check(machine, settings, choice), parked_check(machine, settings, choice)]


def prefix_cache_check(machine: hardware.Machine, settings, choice) -> Check:
    """The prompt checkpoints' budget (engine/prefix_cache.py), and how many of the chosen pair's fit in it."""
    from dflash_chat.engine import memory

    budget = settings.prefix_cache_mib * 2**20
    head = f"prefix cache: prefix_cache_mib = {settings.prefix_cache_mib} MiB of prompt checkpoints"
    if not budget:
        return Check(True, f"{head}: off (a request that branches from an earlier one prefills again)")
    if choice is None:
        return Check(True, f"{head}, on the model's device, besides the model")
    shape = choice.drafter.shape if choice.drafter else None
    one = memory.checkpoint_bytes(choice.pair.target_shape, shape, choice.context, machine.compute_bytes)
    if not one:
        return Check(True, f"{head}: {choice.pair.title} truncates its caches and needs none")
    return Check(
        True,
        f"{head} on the model's device besides the model: {budget // one} of {choice.pair.title} "
        f"({size_text(one)} each)",
    )


def parked_check(machine: hardware.Machine, settings, choice) -> Check:
    """The parked conversations' budget (engine/parked.py) against the RAM, and how many tokens of the chosen
    pair's conversations fit in it."""
    from dflash_chat.engine import memory

    budget = settings.prefix_cache_ram_mib * 2**20
    head = f"parked conversations: prefix_cache_ram_mib = {settings.prefix_cache_ram_mib} MiB of host memory"
    if not budget:
        return Check(True, f"{head}: off (a second chat or an agent's side request makes the first prefill again)")
    if machine.ram_total and budget > machine.ram_total // 2:
        return Check(
            False,
            f"{head}: more than half of this machine's {size_text(machine.ram_total)} of RAM",
            f"set prefix_cache_ram_mib lower in {paths.config_file()}",
        )
    if choice is None:
        return Check(True, f"{head}, for conversations another request displaced")
    shape = choice.drafter.shape if choice.drafter else None
    one = memory.row_bytes(choice.pair.target_shape, shape, machine.compute_bytes)
    return Check(
        True,
        f"{head} for conversations another request displaced: about {budget // one:,} tokens of "
        f"{choice.pair.title} ({size_text(one * 1000)} per 1000 tokens)",
    )


def hub_checks() -> list[Check]:
    from huggingface_hub import get_token

    from dflash_chat.models import hub  # huggingface_hub and httpx: not on the --help path

    cache = hub.default_cache_dir()
    where = _existing_parent(cache)
    checks = []
    if not os.access(where, os.W_OK):
        checks.append(Check(False, f"HF cache {cache} is not writable", "fix its permissions or set HF_HUB_CACHE"))
    free = shutil.disk_usage(where).free
    if free < MIN_FREE_DISK:
        checks.append(
            Check(
                False,
                f"HF cache {cache}: {size_text(free)} free disk",
                "free space or set HF_HUB_CACHE to a bigger disk",
            )
        )
    else:
        checks.append(Check(True, f"HF cache {cache} ({size_text(free)} free disk)"))
    if hub.is_offline():
        checks.append(Check(True, "Hub: offline (HF_HUB_OFFLINE): cached models only"))
    else:
        checks.append(hub_reachable(hub.default_endpoint()))
    token = "found" if get_token() else "none (the z-lab drafters are gated: `hf auth login` once you need one)"
    checks.append(Check(True, f"Hub token: {token}"))
    return checks


def hub_reachable(endpoint: str, timeout: float | None = None) -> Check:
    """One request to the Hub with a short timeout: does it answer at all?"""
    from huggingface_hub.utils import get_session

    start = time.monotonic()
    try:
        response = get_session().head(endpoint, timeout=timeout or HUB_TIMEOUT, follow_redirects=True)
    except Exception as exc:  # noqa: BLE001 - any transport failure means the same thing here
        return Check(
            False,
            f"Hub: cannot reach {endpoint} ({type(exc).__name__})",
            "check the connection or the proxy (HTTPS_PROXY); HF_HUB_OFFLINE=1 runs downloaded models only",
        )
    if response.status_code >= 500:
        return Check(False, f"Hub: {endpoint} answered HTTP {response.status_code}", "it may be down: try again later")
    return Check(True, f"Hub: {endpoint} reachable ({time.monotonic() - start:.2f} s)")


def config_checks() -> list[Check]:
    from dflash_chat import settings
    from dflash_chat.models.catalog import load_catalog

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
