"""GGUF and quantize-on-load models through the loader: load_target / load_drafter / load_pair.

Tiny transformers models of each architecture are written to GGUF by the fixture writer (F32 and the
Q4_K_M-style mix) and loaded back through the public loader; hidden size 256 so the K-quants
(256-value blocks) are really used.
"""

from __future__ import annotations

import copy
import random
import statistics

import gguf
import pytest
import torch
from torch import nn

from dflash_chat.engine.load import load_drafter, load_files, load_pair, load_target, load_tokenizer
from dflash_chat.engine.quantized import QuantEmbedding, QuantExperts, QuantLinear
from dflash_chat.engine.sampling_params import SamplingParams
from dflash_chat.engine.spec import Engine
from dflash_chat.engine.weights.gguf import read_gguf
from dflash_chat.engine.weights.quant_tensor import QuantTensor
from dflash_chat.models.hub import ModelFiles
from tests.engine.gguf_write import quantize_like_llama, write_drafter_gguf, write_target_gguf
from tests.engine.helpers import run
from tests.engine.quant_helpers import overwrite_parameters
from tests.engine.tiny import CHAT_TEMPLATE, write_drafter, write_target

ARCHS = ["qwen3_5", "qwen3_5_moe", "qwen3"]
IDS = torch.tensor([1, 5, 9, 200, 17, 3, 42, 7, 99, 300])


class Tiny:
    """One architecture's files: HF folders, the HF oracle, and GGUFs written from them."""

    def __init__(self, root, arch: str, seed: int):
        self.root = root
        self.hf = write_target(root / "target", arch, seed=seed, hidden=256)
        self.target_dir = root / "target"
        self.drafter_dir = root / "drafter"
        self.drafter_cfg = write_drafter(self.drafter_dir, self.target_dir, seed=seed + 1)
        self._files = {}

    def target_gguf(self, mix: str):
        if mix not in self._files:
            tok = load_tokenizer(self.target_dir)
            self._files[mix] = write_target_gguf(
                self.root / f"target-{mix}.gguf",
                self.hf.state_dict(),
                self.hf.config.to_dict(),
                mix,
                tokenizer=tok,
                chat_template=CHAT_TEMPLATE,
            )
        return self._files[mix]

    def drafter_gguf(self, mix: str, schema: str):
        key = (mix, schema)
        if key not in self._files:
            from safetensors.torch import load_file

            state = load_file(str(self.drafter_dir / "model.safetensors"))
            self._files[key] = write_drafter_gguf(
                self.root / f"drafter-{mix}-{schema}.gguf", state, self.drafter_cfg, mix, schema=schema
            )
        return self._files[key]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    cache = {}

    def get(arch: str) -> Tiny:
        if arch not in cache:
            cache[arch] = Tiny(tmp_path_factory.mktemp(arch), arch, seed=30 + ARCHS.index(arch))
        return cache[arch]

    return get


def _logits(model) -> torch.Tensor:
    return model(IDS, model.new_state(32), logits="all")[0]


def _float(t) -> torch.Tensor:
    if isinstance(t, tuple):
        return torch.cat([_float(p) for p in t], dim=1)
    return t.dequantize() if isinstance(t, QuantTensor) else t.float()


def _dequantized_twin(t: Tiny, gguf_path):
    """Our model from the HF folder, then every weight overwritten with the GGUF's values decoded to float."""
    model = load_target(t.target_dir, "cpu", torch.float32)
    overwrite_parameters(model, {k: _float(v) for k, v in read_gguf(gguf_path).tensors.items()})
    return model


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).pow(2).mean().sqrt() / b.pow(2).mean().sqrt()).item()


def _resident_bytes(model: nn.Module) -> int:
    """Bytes of the storages the weights live in, each once (fused projections are views of one storage)."""
    seen = {}
    for t in (*model.parameters(), *model.buffers()):
        storage = t.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


@pytest.mark.parametrize("arch", ARCHS)
def test_f32_gguf_target_equals_the_hf_model(tiny, arch):
    t = tiny(arch)
    model = load_target(t.target_gguf("F32"), "cpu", torch.float32)
    assert not any(isinstance(m, (QuantLinear, QuantEmbedding, QuantExperts)) for m in model.modules())
    with torch.no_grad():
        want = t.hf(IDS[None]).logits[0]
    torch.testing.assert_close(_logits(model), want, rtol=0, atol=1e-4)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("mix", ["Q8_0", "Q4_K_M"])
def test_a_target_through_llama_quantize_loads_like_the_converter_output(tiny, arch, mix, tmp_path):
    """Published GGUFs went through llama-quantize, which writes shapes without trailing 1-sized dims:
    the MoE shared-expert gate, [hidden, 1] as converted, comes out [hidden]."""
    t = tiny(arch)
    path = quantize_like_llama(t.target_gguf("F32"), tmp_path / f"{arch}-{mix}.gguf", mix)
    dims = {tensor.name: len(tensor.shape) for tensor in gguf.GGUFReader(path).tensors}
    if arch == "qwen3_5_moe":
        assert dims["blk.0.ffn_gate_inp_shexp.weight"] == 1
    want = _logits(load_target(t.target_gguf(mix), "cpu", torch.float32))
    assert torch.equal(_logits(load_target(path, "cpu", torch.float32)), want)


def _format_error(fmt) -> float:
    """Relative RMS error of `fmt` on Gaussian values (how the tiny models' weights are drawn)."""
    x = torch.randn(64, 1024, generator=torch.Generator().manual_seed(0))
    return _rel(QuantTensor.from_float(x, fmt).dequantize(), x)


def _noise_baseline(t: Tiny, packed: dict, seeds=(0, 1, 2)) -> float:
    """Median logit error of the HF model when each packed weight gets Gaussian noise of its format's size."""
    sd = t.hf.state_dict()
    out = []
    for seed in seeds:
        g = torch.Generator().manual_seed(seed)
        noisy = copy.deepcopy(t.hf)
        params = noisy.state_dict()
        with torch.no_grad():
            for name, fmts in packed.items():
                eps = max(_format_error(f) for f in fmts)
                params[name].add_(torch.randn(params[name].shape, generator=g) * eps * sd[name].pow(2).mean().sqrt())
            out.append(_rel(noisy(IDS[None]).logits[0], t.hf(IDS[None]).logits[0]))
    return statistics.median(out)


@pytest.mark.parametrize("arch", ARCHS)
def test_q4_k_m_gguf_target_stays_packed_and_computes_the_decoded_model(tiny, arch):
    t = tiny(arch)
    path = t.target_gguf("Q4_K_M")
    model = load_target(path, "cpu", torch.float32)
    stored = read_gguf(path)
    # never expanded: every matrix the file stores packed is a Quant* module holding the packed bytes
    packed = {
        k: v
        for k, v in stored.tensors.items()
        if isinstance(v, QuantTensor) or (isinstance(v, tuple) and any(isinstance(p, QuantTensor) for p in v))
    }
    assert isinstance(model.model.embed_tokens, QuantEmbedding) and isinstance(model.lm_head, QuantLinear)
    for name, module in model.named_modules():
        if isinstance(module, (nn.Linear, nn.Embedding)):
            assert f"{name}.weight" not in packed, f"{name} was expanded to floats"
    if arch == "qwen3_5_moe":
        assert sum(isinstance(m, QuantExperts) for m in model.modules()) == model.cfg.num_layers
    file_bytes = sum(int(r.n_bytes) for r in stored.header.tensors)
    held = _resident_bytes(model)
    # same bytes as the file's tensors, give or take RoPE frequencies and ssm_out's column index
    assert abs(held - file_bytes) <= 0.01 * file_bytes, (held, file_bytes)
    assert held < 0.25 * _resident_bytes(load_target(t.target_gguf("F32"), "cpu", torch.float32))

    got = _logits(model)
    torch.testing.assert_close(got, _logits(_dequantized_twin(t, path)), rtol=0, atol=1e-4)
    # Against the HF (unquantized) model the tolerance comes from the format: Q4_K rounds each weight
    # to 16 levels per 32 values (Q6_K: 64 levels per 16), a relative RMS error eps of ~7% (~2%) on
    # Gaussian weights, measured here by quantizing Gaussian values. A random network amplifies any
    # perturbation of that size by a gain nobody can state a priori, so the same run measures it:
    # the HF model with Gaussian noise of eps * RMS on each packed weight. The file's error must be of
    # that order (within 2x of the noise's median). A wrongly decoded or reordered tensor is off by
    # ~140% of its RMS, 20x more, and fails this by far.
    with torch.no_grad():
        want = t.hf(IDS[None]).logits[0]
        fmts = {
            k: {p.fmt for p in (v if isinstance(v, tuple) else (v,)) if isinstance(p, QuantTensor)}
            for k, v in packed.items()
        }
        baseline = _noise_baseline(t, fmts)
    assert _rel(got, want) <= 2 * baseline, (_rel(got, want), baseline)


def test_tied_lm_head_reads_the_quantized_embedding(tiny, tmp_path):
    t = tiny("qwen3")
    sd = {k: v for k, v in t.hf.state_dict().items() if k != "lm_head.weight"}
    path = write_target_gguf(tmp_path / "tied.gguf", sd, t.hf.config.to_dict(), "Q4_K_M")
    model = load_target(path, "cpu", torch.float32)
    assert model.cfg.tie_word_embeddings
    embed, head = model.model.embed_tokens, model.lm_head
    assert isinstance(embed, QuantEmbedding) and isinstance(head, QuantLinear)
    assert head.packed.data_ptr() == embed.packed.data_ptr()  # one copy of the table
    twin = load_target(t.target_dir, "cpu", torch.float32)
    decoded = {k: _float(v) for k, v in read_gguf(path).tensors.items()}
    decoded["lm_head.weight"] = decoded["model.embed_tokens.weight"]
    overwrite_parameters(twin, decoded)
    torch.testing.assert_close(_logits(model), _logits(twin), rtol=0, atol=1e-4)


def _prompts(vocab: int, n: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(rng.randint(3, 24))] for _ in range(n)]


# Each architecture meets a GGUF drafter (both schemas, both quant mixes between them) and a BF16
# safetensors drafter quantized as it loads.
LOSSLESS = [
    ("qwen3_5", "gguf", "Q4_K_M", "dflash-draft"),
    ("qwen3_5", "safetensors", "Q4_K", None),
    ("qwen3_5_moe", "gguf", "Q8_0", "dflash"),
    ("qwen3_5_moe", "safetensors", "Q8_0", None),
    ("qwen3", "gguf", "Q4_K_M", "dflash"),
    ("qwen3", "safetensors", "Q4_K", None),
]


@pytest.fixture(scope="module")
def quantized_target(tiny):
    """arch -> (Q4_K_M target, its prompts, greedy autoregressive answers), built once per arch."""
    cache = {}

    def get(arch: str):
        if arch not in cache:
            target = load_target(tiny(arch).target_gguf("Q4_K_M"), "cpu", torch.float32)
            prompts = _prompts(target.cfg.vocab_size, 2, seed=len(arch))
            ar = Engine(target, None, max_context=96)
            answers = []
            for prompt in prompts:
                ar.reset()
                answers.append(run(ar, prompt, SamplingParams(max_new_tokens=16))[0])
            cache[arch] = target, prompts, answers
        return cache[arch]

    return get


@pytest.mark.parametrize("arch, kind, quant, schema", LOSSLESS)
def test_quantized_pair_is_lossless(tiny, quantized_target, arch, kind, quant, schema):
    t = tiny(arch)
    target, prompts, answers = quantized_target(arch)
    if kind == "gguf":
        drafter = load_drafter(t.drafter_gguf(quant, schema), target)
    else:
        drafter = load_drafter(t.drafter_dir, target, quant=quant)
    assert isinstance(drafter.fc, QuantLinear) and isinstance(drafter.layers[0].mlp.down_proj, QuantLinear)
    spec = Engine(target, drafter, max_context=96)
    for prompt, want in zip(prompts, answers, strict=True):
        spec.reset()
        got, finished, _ = run(spec, prompt, SamplingParams(max_new_tokens=16))
        assert got == want, "DFlash output differs from autoregressive decoding"
        assert finished.stats.drafted > 0


def test_quantized_drafter_matches_its_decoded_float_twin(tiny):
    """A drafter GGUF's packed layers compute what its decoded weights compute (schema and norms read right)."""
    t = tiny("qwen3")
    target = load_target(t.target_dir, "cpu", torch.float32)
    path = t.drafter_gguf("Q4_K_M", "dflash-draft")
    packed = load_drafter(path, target)
    twin = load_drafter(t.drafter_dir, target, causal=packed.cfg.causal)  # the fork's file says causal = false
    overwrite_parameters(twin, {k: _float(v) for k, v in read_gguf(path).tensors.items()})
    features = torch.randn(6, packed.fc.in_features, generator=torch.Generator().manual_seed(3))
    for drafter in (packed, twin):
        drafter.allocate(64)
        drafter.append_context(features, 6)
    draft = packed.logits(packed.draft_hidden(11, 6)).argmax(-1)
    assert torch.equal(draft, twin.logits(twin.draft_hidden(11, 6)).argmax(-1))
    h = torch.randn(4, 256, generator=torch.Generator().manual_seed(4))
    torch.testing.assert_close(
        packed.project_context(torch.cat([h, h], -1)), twin.project_context(torch.cat([h, h], -1)), rtol=0, atol=1e-5
    )


def test_bfloat16_quantized_pair_runs_in_the_model_dtype(tiny):
    t = tiny("qwen3_5")
    pair = load_pair(
        t.target_gguf("Q4_K_M"),
        t.drafter_gguf("Q4_K_M", "dflash-draft"),
        device="cpu",
        dtype=torch.bfloat16,
        max_context=128,
    )
    target = pair.engine.target
    assert pair.dtype == torch.bfloat16
    assert target.model.embed_tokens(torch.tensor([3, 4])).dtype == torch.bfloat16
    assert target.model.norm.weight.dtype == torch.bfloat16
    tokens, finished, _ = run(pair.engine, [5, 17, 99, 3], SamplingParams(max_new_tokens=12))
    assert len(tokens) == 12 and finished.reason == "length" and finished.stats.drafted > 0


def test_gguf_target_without_tokenizer_folder_uses_the_gguf_metadata(tiny):
    t = tiny("qwen3")
    pair = load_pair(t.target_gguf("Q4_K_M"), None, device="cpu", max_context=64)
    official = load_tokenizer(t.target_dir)
    # (the tiny folder tokenizer pre-splits with GPT-2's regex, GGUF's qwen35 tokenizer with Qwen's: they
    # differ on runs of spaces after a newline, so the text here has none; real Qwen files agree throughout)
    messages = [{"role": "user", "content": "The quick brown fox jumps over the lazy dog."}]
    for thinking in (True, False):
        kw = dict(add_generation_prompt=True, enable_thinking=thinking)
        text = pair.tokenizer.apply_chat_template(messages, tokenize=False, **kw)
        assert text == official.apply_chat_template(messages, tokenize=False, **kw)
        assert pair.tokenizer.encode(text) == official.encode(text)
    code = "def main():\n    print('hello world')\n"
    assert pair.tokenizer.decode(pair.tokenizer.encode(code)) == code
    assert "<think>\n\n</think>" in pair.tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True, enable_thinking=False
    )
    assert pair.tokenizer.eos_token_id == official.eos_token_id
    assert pair.target_name == "target-Q4_K_M" and pair.drafter_name is None


def test_model_manager_files_load_with_the_tokenizer_folder(tiny, tmp_path):
    t = tiny("qwen3_5")
    # a GGUF without tokenizer metadata, as some uploads are: the tokenizer must come from the folder
    bare = write_target_gguf(tmp_path / "bare.gguf", t.hf.state_dict(), t.hf.config.to_dict(), "Q4_K_M")
    files = ModelFiles(target=bare, drafter=t.drafter_dir, tokenizer=t.target_dir)
    pair = load_files(files, device="cpu", max_context=64, drafter_quant="Q8_0")
    assert isinstance(pair.engine.drafter.fc, QuantLinear) and pair.engine.drafter.fc.fmt.name == "Q8_0"
    assert pair.tokenizer.chat_template == load_tokenizer(t.target_dir).chat_template
    tokens, _, _ = run(pair.engine, pair.tokenizer.encode("hello world"), SamplingParams(max_new_tokens=4))
    assert len(tokens) == 4


def test_a_folder_holding_one_gguf_loads_that_file(tiny, tmp_path):
    t = tiny("qwen3")
    folder = tmp_path / "download"
    folder.mkdir()
    (folder / "model.gguf").write_bytes(t.target_gguf("F32").read_bytes())
    torch.testing.assert_close(
        _logits(load_target(folder, "cpu", torch.float32)),
        _logits(load_target(t.target_gguf("F32"), "cpu", torch.float32)),
        rtol=0,
        atol=0,
    )


def test_split_gguf_loads_from_its_first_part_or_its_folder(tiny, tmp_path):
    t = tiny("qwen3_5")
    first = write_target_gguf(
        tmp_path / "model.gguf", t.hf.state_dict(), t.hf.config.to_dict(), "Q4_K_M", split_max_tensors=20
    )
    assert first.name == "model-00001-of-00003.gguf"
    whole = load_target(t.target_gguf("Q4_K_M"), "cpu", torch.float32)
    want = _logits(whole)
    for path in (first, tmp_path):
        model = load_target(path, "cpu", torch.float32)
        assert _resident_bytes(model) == _resident_bytes(whole)
        assert torch.equal(_logits(model), want)


def test_display_names():
    from pathlib import Path

    from dflash_chat.engine.load import display_name

    cache = Path("/hub/models--z-lab--Qwen3.6-27B-DFlash/snapshots/0123abcd")
    assert display_name(cache) == "z-lab/Qwen3.6-27B-DFlash"
    assert (
        display_name(Path("/hub/models--u--Q-GGUF/snapshots/89ef/Q8_0/Qwen3.6-27B-Q8_0-00001-of-00002.gguf"))
        == "Qwen3.6-27B-Q8_0"
    )
    assert display_name("/models/my-drafter") == "my-drafter"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.gpu
def test_quantized_pair_on_cuda(tiny):
    """On the GPU the packed bytes live on the device, the Triton kernels run, and DFlash stays lossless."""
    t = tiny("qwen3_5")
    target_path, drafter_path = t.target_gguf("Q4_K_M"), t.drafter_gguf("Q4_K_M", "dflash-draft")
    pair = load_pair(target_path, drafter_path, device="cuda", max_context=128)
    target = pair.engine.target
    assert pair.dtype == torch.bfloat16
    packed = [m.packed for m in target.modules() if isinstance(m, (QuantLinear, QuantEmbedding))]
    assert packed and all(p.is_cuda for p in packed)
    assert target.model.embed_tokens(torch.tensor([3, 4], device="cuda")).dtype == torch.bfloat16
    tokens, finished, _ = run(pair.engine, [5, 17, 99, 3], SamplingParams(max_new_tokens=12))
    assert len(tokens) == 12 and finished.stats.drafted > 0

    exact = load_pair(target_path, drafter_path, device="cuda", dtype=torch.float32, max_context=128)
    ar = Engine(exact.engine.target, None, max_context=128)
    for prompt in _prompts(target.cfg.vocab_size, 2, seed=5):
        ar.reset()
        exact.engine.reset()
        want = run(ar, prompt, SamplingParams(max_new_tokens=16))[0]
        assert run(exact.engine, prompt, SamplingParams(max_new_tokens=16))[0] == want


def test_loading_reports_progress_up_to_the_files_bytes(tiny):
    """load_pair's progress: monotonic byte counts of the weights placed, ending at the files' size."""
    from dflash_chat.engine.load import model_bytes

    t = tiny("qwen3_5")
    target_path, drafter_path = t.target_gguf("Q4_K_M"), t.drafter_gguf("Q8_0", "dflash-draft")
    calls = []
    load_pair(
        target_path,
        drafter_path,
        device="cpu",
        max_context=64,
        progress=lambda done, total: calls.append((done, total)),
    )
    total = model_bytes(target_path) + model_bytes(drafter_path)
    assert len(calls) > 10 and calls[-1] == (total, total)
    assert all(a[0] <= b[0] for a, b in zip(calls, calls[1:], strict=False)) and all(c[1] == total for c in calls)
    # the tensors are nearly all of a GGUF: the count reaches most of the way before the final report
    assert calls[-2][0] > 0.8 * total


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.gpu
def test_staged_placement_equals_a_plain_copy():
    from dflash_chat.engine.placement import STAGING_BYTES, Placement

    placement = Placement("cuda")
    for n in (3, STAGING_BYTES // 2 + 5, 2 * STAGING_BYTES + 7):  # inside one buffer, across both, wrapping
        src = torch.randint(0, 256, (n,), dtype=torch.uint8)
        assert torch.equal(placement.place(src).cpu(), src)
    bf = torch.randn(1000, 333).to(torch.bfloat16)
    assert torch.equal(placement.place(bf).cpu(), bf)
