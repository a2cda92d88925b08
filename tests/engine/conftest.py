import pytest

from tests.engine.tiny import write_drafter, write_target

ARCHS = ["qwen3_5", "qwen3_5_moe", "qwen3"]


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory):
    """arch -> (target dir, drafter dir, HF oracle model), built once per session."""
    out = {}
    for i, arch in enumerate(ARCHS):
        root = tmp_path_factory.mktemp(arch)
        hf = write_target(root / "target", arch, seed=10 + i)
        write_drafter(root / "drafter", root / "target", seed=20 + i)
        out[arch] = (root / "target", root / "drafter", hf)
    return out


MTP_ARCHS = ["qwen3_5", "qwen3_5_moe"]


@pytest.fixture(scope="session")
def mtp_dirs(tmp_path_factory):
    """arch -> (target folder with an MTP layer, the transformers model of its target), built once per session."""
    out = {}
    for i, arch in enumerate(MTP_ARCHS):
        root = tmp_path_factory.mktemp(f"mtp-{arch}")
        out[arch] = (root / "target", write_target(root / "target", arch, seed=70 + i, mtp=True))
    return out
