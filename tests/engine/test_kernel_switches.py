"""The kernel switches come from the environment, read once; a change counts from `reload()` on."""

import pytest
import torch

from dflash_chat.engine.kernels import switches


@pytest.fixture
def env(monkeypatch):
    """An environment with no switch set, for this test only; the switches as they were afterwards."""
    with monkeypatch.context() as patch:
        for name in (
            "TRITON_INTERPRET",
            "DFLASH_CHAT_NO_TRITON",
            "DFLASH_CHAT_TRITON_GDN",
            "DFLASH_CHAT_NO_TRITON_GDN",
        ):
            patch.delenv(name, raising=False)
        switches.reload()
        yield patch
    switches.reload()


def test_the_variables_name_the_switches():
    got = switches.read(
        {
            "TRITON_INTERPRET": "1",
            "DFLASH_CHAT_NO_TRITON_GDN": "1",
            "DFLASH_CHAT_TRITON_ATTENTION": "1",
            "DFLASH_CHAT_TRITON_GDN": "0",
            "DFLASH_CHAT_NO_TRITON_ATTENTION": "",
        }
    )
    assert got == switches.Switches(
        no_triton=False, interpret=True, off=frozenset({"GDN"}), interpreted=frozenset({"ATTENTION"})
    )
    assert switches.read({"DFLASH_CHAT_NO_TRITON": "1"}).no_triton
    assert not switches.read({"TRITON_INTERPRET": "0"}).interpret


def test_a_changed_environment_counts_after_reload(env):
    pytest.importorskip("triton")
    cpu = torch.zeros(1)
    assert not switches.use_triton(cpu)
    env.setenv("TRITON_INTERPRET", "1")
    assert not switches.use_triton(cpu)  # read once: every operation sees the same choice
    switches.reload()
    assert switches.use_triton(cpu)
    assert not switches.kernel_wanted(cpu, "GDN")  # under the interpreter only when asked for by name
    env.setenv("DFLASH_CHAT_TRITON_GDN", "1")
    switches.reload()
    assert switches.kernel_wanted(cpu, "GDN") and not switches.kernel_wanted(cpu, "ATTENTION")
    env.setenv("DFLASH_CHAT_NO_TRITON_GDN", "1")
    switches.reload()
    assert not switches.kernel_wanted(cpu, "GDN")
    env.setenv("DFLASH_CHAT_NO_TRITON", "1")
    switches.reload()
    assert not switches.triton_available() and not switches.use_triton(cpu)
