import pytest
import torch


@pytest.fixture(autouse=True, scope="session")
def _one_thread():
    """Tiny models gain nothing from threads, and on a shared 2-core machine extra threads spin and thrash."""
    torch.set_num_threads(1)


@pytest.fixture(autouse=True, scope="session")
def _kernel_modules_built_for_a_gpu():
    """Import the Triton kernel modules once, as this process's environment has them: a test that sets
    TRITON_INTERPRET for a moment (a fallback check) would otherwise turn them into interpreter builds for
    every later test (the compile checks need real JIT functions). Interpreter runs use child processes."""
    import os

    if os.environ.get("TRITON_INTERPRET") == "1":
        return
    try:
        from dflash_chat.engine.kernels import triton_attention, triton_gdn, triton_glue, triton_quant  # noqa: F401
    except ImportError:  # no triton: the kernels are never used
        pass
