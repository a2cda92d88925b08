import pytest
import torch


@pytest.fixture(autouse=True, scope="session")
def _one_thread():
    """Tiny models gain nothing from threads, and on a shared 2-core machine extra threads spin and thrash."""
    torch.set_num_threads(1)
