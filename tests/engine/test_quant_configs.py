"""The kernels' tiling table agrees with the formats, and launch choices follow the rules they promise."""

from __future__ import annotations

import pytest

from dflash_chat.engine.ggml.formats import FORMATS
from dflash_chat.engine.kernels import configs


@pytest.mark.parametrize("name", list(configs.TILINGS))
def test_tilings_match_the_block_layouts(name):
    fmt, til = FORMATS[name], configs.TILINGS[name]
    assert til.unit_bytes == fmt.type_size * configs.UNIT // fmt.block_size
    assert til.groups * til.runs * til.vec * 4 * til.slots == configs.UNIT
    # "aligned": every block, hence every field the kernel reads, starts on a word
    assert til.aligned == (fmt.type_size % 4 == 0)
    # 4 words per thread only where the fields are 16-byte aligned (one 128-bit load)
    assert til.vec == 2 or til.unit_bytes % 16 == 0


def test_kernels_take_whole_units_of_whole_words():
    assert configs.kernel_supports("Q4_K", 512, 288)
    assert not configs.kernel_supports("Q6_K", 256, 210)  # a row of one 210-byte block is not whole words
    assert configs.kernel_supports("Q6_K", 512, 420)
    assert not configs.kernel_supports("Q8_0", 96, 102)  # K not a multiple of 256
    assert not configs.kernel_supports("F16", 512, 1024)


def test_families():
    assert configs.family_of((9, 0)).name == "sm_90" and configs.family_of((10, 0)).name == "sm_90"
    assert configs.family_of((8, 9)).name == "sm_89"
    assert configs.family_of((8, 6)).name == configs.family_of((8, 0)).name == "sm_86"


def test_launch_choice():
    fam = configs.FAMILIES["sm_90"]
    wide = configs.pick_launch("Q4_K", 1, 17408, 5120, fam)
    assert (wide.kernel, wide.block_m, wide.split, wide.warps) == ("gemv", 1, 1, 4)  # 272 row blocks fill 132 SMs
    narrow = configs.pick_launch("Q6_K", 1, 5120, 17408, fam)
    tiles = 5120 // fam.block_n
    assert narrow.split > 1 and narrow.warps == 8
    assert tiles * narrow.split <= fam.programs_per_sm * fam.sms  # split K only up to the target
    assert 17408 // 256 // narrow.split >= fam.min_units_per_split
    assert configs.pick_launch("Q4_K", 16, 17408, 5120, fam).block_m == 16
    assert configs.pick_launch("Q6_K", 16, 5120, 17408, fam).warps == 4  # tensor cores: 4 warps but for Q8_0
    assert configs.pick_launch("Q8_0", 16, 5120, 17408, fam).warps == 8
    assert configs.pick_launch("Q4_K", 17, 17408, 5120, fam).block_m == 32
    assert configs.pick_experts_launch("Q4_K", 1, fam).kernel == "gemv"
    assert configs.pick_experts_launch("Q4_K", 16, fam).block_m == 16
    assert configs.pick_experts_launch("Q4_K", 512, fam).block_m == 64
