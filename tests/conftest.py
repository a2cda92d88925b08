import os

# One OpenMP/MKL thread here and in every child process a test starts: the suite runs in two worker processes
# on two cores (tools/test.sh), and tiny models gain nothing from threads. Set before torch is imported.
for _name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_name, "1")

import pytest  # noqa: E402
import torch  # noqa: E402


def pytest_collection_modifyitems(config, items):
    """The `slow` tests first, the longest first (`@pytest.mark.slow(seconds=N)`: about what it takes on one
    core), the rest in their own order. tools/test.sh hands whole files to whichever worker is free in this
    order (a file comes where its first test does), so the files with long tests start first: one started
    late would keep one worker busy while the other idles."""

    installing = _agents_installing()

    def order(item):
        if installing and item.get_closest_marker("agents"):
            return (2, 0)  # last: they wait for the install (tools/test.sh) that runs beside the tests
        slow = item.get_closest_marker("slow")
        return (0, -slow.kwargs.get("seconds", 0)) if slow else (1, 0)

    items.sort(key=order)  # stable: ties keep their collected order


def _agents_installing() -> bool:
    """Whether tools/test.sh started installing the coding agents beside this run. Decided by the script once, not
    by whether the install has ended: every xdist worker must collect the tests in the same order."""
    import os

    return bool(os.environ.get("DFLASH_CHAT_AGENTS_STATUS"))


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


@pytest.fixture(scope="session")
def tool_pair(tmp_path_factory):
    """A tiny pair whose greedy answers are scripted (tests/engine/scripted.py): it closes a forced tool call,
    and otherwise answers `Done.`."""
    from tests.engine.scripted import write_scripted_pair

    return write_scripted_pair(tmp_path_factory.mktemp("tool-pair"))


@pytest.fixture(scope="session")
def calling_pair(tmp_path_factory):
    """The scripted pair that calls `echo` in every answer, on its own."""
    from tests.engine.scripted import write_scripted_pair

    return write_scripted_pair(tmp_path_factory.mktemp("calling-pair"), calls=True)
