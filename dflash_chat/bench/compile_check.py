"""Compile the Triton kernels for a GPU family on a machine without a GPU, and read what ptxas made of them.

The real host code runs on meta tensors (shapes and dtypes, no memory) with the launch hook of
`triton_quant` / `triton_glue` / `triton_attention` / `triton_gdn` replaced, so every launch it would make is
captured with its exact arguments and configuration. Each is then specialised the way Triton's JIT would (dtypes,
16-byte divisibility, ints equal to 1) and built with `triton.compile` for an explicit `GPUTarget("cuda", cc, 32)`:
no driver needed.
From the result:
- registers and spilled bytes: Triton's own ptxas run again with -v on the kernel's PTX;
- load widths: the global loads (LDG) of the SASS (cuobjdump on the cubin), counted by width in bits;
- the main loop: SASS instructions between the last backward branch and its target, and how many of them
  touch shared memory (a GEMV that needs none must have none), to predict instructions per weight value.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dflash_chat.engine.kernels.configs import Family

ARCHES = {"sm_86": 86, "sm_89": 89, "sm_90": 90}


@dataclass
class Captured:
    kernel: Any  # the JITFunction
    args: tuple
    kwargs: dict
    values_per_thread: int | None = None  # weight values one thread handles per main-loop iteration


@dataclass
class Report:
    kernel: str
    case: str
    arch: str
    regs: int
    spill_bytes: int
    stack_bytes: int
    loads: dict[int, int]  # LDG instructions by width in bits
    loop_instructions: int
    loop_shared: int  # LDS/STS/LDSM/STSM/BAR in the main loop
    values_per_thread: int | None
    seconds: float
    notes: list[str] = field(default_factory=list)

    @property
    def instructions_per_value(self) -> float | None:
        if not self.values_per_thread or self.loop_instructions <= 0:
            return None
        return self.loop_instructions / self.values_per_thread

    def narrow_loads(self) -> int:
        return sum(n for width, n in self.loads.items() if width < 32)


@contextlib.contextmanager
def capture(family: Family) -> Iterator[list[Captured]]:
    """Launches of the kernels modules go to a list instead of a GPU; launch choices follow `family`."""
    from dflash_chat.engine.kernels import triton_attention, triton_gdn, triton_glue, triton_quant

    launches: list[Captured] = []

    def record(kernel, grid, *args, **kwargs):
        values = None
        if "BN" in kwargs and kwargs.get("FMT", 100) < 100 and "num_warps" in kwargs:
            values = kwargs["BN"] * 256 // (32 * kwargs["num_warps"])
        launches.append(Captured(kernel, args, kwargs, values))

    stand_ins: list[tuple[ModuleType, str, Any]] = [
        (module, "_launch", record) for module in (triton_quant, triton_glue, triton_attention, triton_gdn)
    ]
    stand_ins += [(triton_quant, "_family", lambda device: family), (triton_quant, "_sms", lambda device: family.sms)]
    with _replaced(stand_ins):
        yield launches


@contextlib.contextmanager
def _replaced(stand_ins: list[tuple[ModuleType, str, Any]]) -> Iterator[None]:
    """Each (module, name, value): module.name is value until the block ends, then what it was."""
    saved = [(module, name, getattr(module, name)) for module, name, _ in stand_ins]
    for module, name, value in stand_ins:
        setattr(module, name, value)
    try:
        yield
    finally:
        for module, name, value in saved:
            setattr(module, name, value)


_OPTIONS = ("num_warps", "num_stages", "enable_fp_fusion")


def _specialise(c: Captured):
    """(signature, constexprs, attrs, options) as the JIT would build them for these arguments."""
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import BaseBackend

    fn = c.kernel
    names = fn.arg_names
    values = dict(zip(names, c.args, strict=False))  # (the rest are keywords)
    values.update({k: v for k, v in c.kwargs.items() if k not in _OPTIONS})
    signature, constexprs, attrs = {}, {}, {}
    for i, param in enumerate(fn.params):
        value = values[param.name]
        if param.is_constexpr:
            signature[param.name] = "constexpr"
            constexprs[(i,)] = value
            continue
        kind, spec = native_specialize_impl(BaseBackend, value, False, True, True)[:2]
        if kind == "constexpr":  # ints equal to 1
            signature[param.name] = "constexpr"
            constexprs[(i,)] = spec
            continue
        signature[param.name] = kind
        if isinstance(spec, str) and spec:
            attrs[(i,)] = BaseBackend.parse_attr(spec)
    options = {k: v for k, v in c.kwargs.items() if k in _OPTIONS}
    options.setdefault("enable_fp_fusion", True)
    return signature, constexprs, attrs, options


def _key(c: Captured, arch: str, cc: int | None = None) -> tuple:
    signature, constexprs, attrs, options = _specialise(c)

    def items(d):
        return tuple(sorted((k, repr(v)) for k, v in d.items()))

    return (c.kernel.__name__, arch, tuple(signature.items()), items(constexprs), items(attrs), items(options))


_LDG = re.compile(r"\bLDG(?:STS)?\.E((?:\.[A-Z0-9_]+)*)")
_ADDR = re.compile(r"/\*([0-9a-f]{4,})\*/")
_BRA = re.compile(r"\bBRA\s+(?:`\(\.L_x_\d+\)|0x([0-9a-f]+))")


def _load_width(suffix: str) -> int:
    parts = suffix.split(".")
    for width in ("128", "64"):
        if width in parts:
            return int(width)
    if {"U8", "S8"} & set(parts):
        return 8
    if {"U16", "S16"} & set(parts):
        return 16
    return 32


def _found(pattern: re.Pattern[str], text: str) -> str:
    """The first group of `pattern`'s first match in text (ptxas and cuobjdump always print what is asked for)."""
    match = pattern.search(text)
    if match is None:
        raise ValueError(f"{pattern.pattern!r} not found in the tool's output")
    return match.group(1)


def _main_loop(sass: str) -> list[str]:
    """The instructions of the largest loop (a backward branch to an earlier address)."""
    lines = [line for line in sass.splitlines() if _ADDR.search(line) and ";" in line]
    addrs = [int(_found(_ADDR, line), 16) for line in lines]
    best: list[str] = []
    for i, line in enumerate(lines):
        m = _BRA.search(line)
        if not m or m.group(1) is None:
            continue
        target = int(m.group(1), 16)
        if target < addrs[i]:
            start = addrs.index(target) if target in addrs else 0
            if i + 1 - start > len(best):
                best = lines[start : i + 1]
    return best


def _tool(name: str, arch: int) -> str:
    from triton.backends.nvidia.compiler import get_ptxas

    ptxas = get_ptxas(arch).path
    return ptxas if name == "ptxas" else os.path.join(os.path.dirname(ptxas), name)


def compile_one(c: Captured, arch: str, case: str, cc: int | None = None) -> Report:
    """Build one captured launch for `arch` (or any compute capability `cc`, e.g. the GPU's own)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import sm_arch_from_capability
    from triton.compiler import ASTSource

    cc = cc or ARCHES[arch]
    signature, constexprs, attrs, options = _specialise(c)
    start = time.perf_counter()
    src = ASTSource(fn=c.kernel, signature=signature, constexprs=constexprs, attrs=attrs)
    compiled = triton.compile(src, target=GPUTarget("cuda", cc, 32), options=options)
    with tempfile.TemporaryDirectory() as tmp:
        ptx, cubin = os.path.join(tmp, "k.ptx"), os.path.join(tmp, "k.cubin")
        with open(ptx, "w") as f:
            f.write(compiled.asm["ptx"])
        with open(cubin, "wb") as f:
            f.write(compiled.asm["cubin"])
        fmad = [] if options["enable_fp_fusion"] else ["--fmad=false"]
        log = subprocess.run(
            [
                _tool("ptxas", cc),
                "-lineinfo",
                "-v",
                "--regAllocOptLevel=2",
                *fmad,
                f"--gpu-name={sm_arch_from_capability(cc)}",
                ptx,
                "-o",
                os.path.join(tmp, "k.o"),
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stderr
        sass = subprocess.run(
            [_tool("cuobjdump", cc), "-sass", cubin], capture_output=True, text=True, check=True
        ).stdout
    regs = int(_found(re.compile(r"Used (\d+) registers"), log))
    spills = sum(int(n) for n in re.findall(r"(\d+) bytes spill (?:stores|loads)", log))
    stack = int(_found(re.compile(r"(\d+) bytes stack frame"), log))
    loads = Counter(_load_width(m.group(1)) for m in _LDG.finditer(sass))
    loop = _main_loop(sass)
    shared = sum(1 for line in loop if re.search(r"\b(LDS|STS|LDSM|STSM|BAR)\b", line))
    return Report(
        c.kernel.__name__,
        case,
        arch,
        regs,
        spills,
        stack,
        dict(sorted(loads.items())),
        len(loop),
        shared,
        c.values_per_thread,
        time.perf_counter() - start,
    )


def compile_all(cases, arches=tuple(ARCHES), on_report=None) -> list[Report]:
    """cases: (label, fn) pairs; fn(device) runs host code on meta tensors. Each distinct kernel build is
    compiled once per arch (the first case that needs it names it)."""
    from dflash_chat.engine.kernels import configs

    reports, seen = [], set()
    for arch in arches:
        for label, run in cases:
            with capture(configs.FAMILIES[arch]) as launches:
                run()
            for c in launches:
                key = _key(c, arch)
                if key in seen:
                    continue
                seen.add(key)
                report = compile_one(c, arch, label)
                reports.append(report)
                if on_report:
                    on_report(report)
    return reports


def format_report(r: Report) -> str:
    loads = " ".join(f"{w}b x{n}" for w, n in r.loads.items()) or "-"
    per_value = r.instructions_per_value
    loop = f"{r.loop_instructions} instr" + (f" ({per_value:.2f}/value)" if per_value else "")
    if r.loop_shared:
        loop += f", {r.loop_shared} smem"
    return (
        f"{r.arch:<6} {r.kernel:<22} {r.case:<44} regs {r.regs:>3}  spill {r.spill_bytes:>4} B  "
        f"loads {loads:<28} loop {loop}"
    )
