"""The DFlash2 drafter against a torch reference written from z-lab/dflash 07ebd93's rules, and lossless in the
engine (greedy token for token, sampled by chi-square).

The reference below is written from the published definitions (docs/ARCHITECTURE.md, DFlash2 drafters; `GroupedDynamicCausalConv`,
`CandidateSelector`, `DFlash2DraftModel` and the attention mask rule `_attention_mask`), on the checkpoint's
own tensors, with no code of ours: the context rows are hidden_norm(fc(features)) projected by each layer's
k/v (k normed and rotated at the context positions); the block [anchor, mask x (B-1)] is embedded (times
input_embedding_scale); each layer runs conv(side 0) -> attention over [context ; block] -> conv(side 1) and
the same around the MLP, each conv out[i] = sum_t (base[t] + dyn[i, t]) * x[i - t] with zeros before the
block; the head's logits times output_multiplier, soft-capped; the selector walks the top-K from the anchor.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from dflash_chat.engine.load import load_drafter, load_target
from dflash_chat.engine.models.dflash2 import DFlash2Drafter
from dflash_chat.engine.models.span import Span
from dflash_chat.engine.sampling import Draws
from dflash_chat.engine.sampling_params import SamplingParams
from dflash_chat.engine.spec import Engine
from tests.engine.conftest import ARCHS
from tests.engine.helpers import run
from tests.engine.test_sampling import P_MIN, V_SMALL, _exact_marginals, chi_square_p
from tests.engine.tiny import write_drafter, write_target

BLOCK = 8
WINDOW = 6  # smaller than the block: both halves of a bidirectional window matter
LAYER_TYPES = ["sliding_attention", "full_attention", "sliding_attention"]
STEPS = [(0, 13), (13, 14), (14, 21)]  # a prompt, one accepted token, several: contexts past the window


# -- the reference ------------------------------------------------------------------------------------


def _rms(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _rope(x, positions, theta):
    """x [n, heads, d] rotated at positions [n] (rotate-half pairs, as Qwen3)."""
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    angles = positions.double()[:, None] * inv[None, :]
    cos, sin = (
        torch.cat((angles, angles), -1).cos().float()[:, None],
        torch.cat((angles, angles), -1).sin().float()[:, None],
    )
    half = torch.cat((-x[..., d // 2 :], x[..., : d // 2]), dim=-1)
    return x * cos + half * sin


def _conv(x, dynamic, base, group_size):
    """x [L, H], dynamic [L, taps, groups], base [taps, H]: out[i] = sum_t (base[t] + dyn[i, t]) * x[i - t]."""
    L, H = x.shape
    out = torch.zeros_like(x)
    for i in range(L):
        for t in range(base.shape[0]):
            if i - t >= 0:
                out[i] += (base[t] + dynamic[i, t].repeat_interleave(group_size)) * x[i - t]
    return out


def _visible(q_pos, k_pos, causal, window):
    q, k = q_pos[:, None], k_pos[None, :]
    ok = torch.ones(q.shape[0], k.shape[1], dtype=torch.bool)
    if causal:
        ok &= k <= q
    if window is not None:
        ok &= q - k < window
        if not causal:
            ok &= k - q < window
    return ok


def _layer_causal(cfg):
    declared = cfg.get("is_causal", cfg["dflash_config"].get("causal"))
    return [t == "sliding_attention" if declared is None else bool(declared) for t in cfg["layer_types"]]


def reference_block(sd, cfg, embed, lm_head, features, anchor, start):
    """(hidden [B-1, H], logits [B-1, V]) for the block after `anchor` at `start` over context features[:start]."""
    d2 = cfg["dflash_config"]
    eps, theta = cfg["rms_norm_eps"], cfg["rope_parameters"]["rope_theta"]
    nh, nkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    taps, gs = d2["conv_kernel_size"], d2["conv_group_size"]
    ctx = _rms(features[:start] @ sd["fc.weight"].T, sd["hidden_norm.weight"], eps)
    ids = torch.tensor([anchor] + [d2["mask_token_id"]] * (BLOCK - 1))
    x = embed[ids] * d2.get("input_embedding_scale", 1.0)
    pos_c, pos_b = torch.arange(start), torch.arange(start, start + BLOCK)
    for i, (kind, causal) in enumerate(zip(cfg["layer_types"], _layer_causal(cfg), strict=True)):
        w = {k.removeprefix(f"layers.{i}."): v for k, v in sd.items() if k.startswith(f"layers.{i}.")}
        window = cfg["sliding_window"] if kind == "sliding_attention" else None
        h = _rms(x, w["input_layernorm.weight"], eps)
        dyn = (h @ w["attention_conv.kernel_projection.weight"].T).view(BLOCK, 2, taps, -1)
        hc = _conv(h, dyn[:, 0], w["attention_conv.base_kernel"][0], gs)
        q = _rope(
            _rms((hc @ w["self_attn.q_proj.weight"].T).view(BLOCK, nh, hd), w["self_attn.q_norm.weight"], eps),
            pos_b,
            theta,
        )

        def kv(rows, positions, w):
            k = _rms((rows @ w["self_attn.k_proj.weight"].T).view(-1, nkv, hd), w["self_attn.k_norm.weight"], eps)
            return _rope(k, positions, theta), (rows @ w["self_attn.v_proj.weight"].T).view(-1, nkv, hd)

        (kc, vc), (kb, vb) = kv(ctx, pos_c, w), kv(hc, pos_b, w)
        K, V = torch.cat((kc, kb)).repeat_interleave(nh // nkv, 1), torch.cat((vc, vb)).repeat_interleave(nh // nkv, 1)
        scores = torch.einsum("qhd,khd->hqk", q, K) * hd**-0.5
        scores = scores.masked_fill(~_visible(pos_b, torch.cat((pos_c, pos_b)), causal, window), float("-inf"))
        att = (
            torch.einsum("hqk,khd->qhd", scores.softmax(-1), V).reshape(BLOCK, nh * hd) @ w["self_attn.o_proj.weight"].T
        )
        x = x + _conv(att, dyn[:, 1], w["attention_conv.base_kernel"][1], gs)
        h = _rms(x, w["post_attention_layernorm.weight"], eps)
        dyn = (h @ w["mlp_conv.kernel_projection.weight"].T).view(BLOCK, 2, taps, -1)
        hc = _conv(h, dyn[:, 0], w["mlp_conv.base_kernel"][0], gs)
        m = (torch.nn.functional.silu(hc @ w["mlp.gate_proj.weight"].T) * (hc @ w["mlp.up_proj.weight"].T)) @ w[
            "mlp.down_proj.weight"
        ].T
        x = x + _conv(m, dyn[:, 1], w["mlp_conv.base_kernel"][1], gs)
    hidden = _rms(x, sd["norm.weight"], eps)[1:]
    logits = hidden @ lm_head.T * d2.get("output_multiplier", 1.0)
    cap = d2.get("final_logit_softcapping")
    return hidden, cap * torch.tanh(logits / cap) if cap else logits


def reference_scores(sd, cfg, hidden, logits, predecessor, t):
    """(candidate ids [K], scores [K]) of draft position t after the token `predecessor`."""
    unary, ids = torch.topk(logits[t], cfg["dflash_config"]["selector_top_k"])
    gate = sd["candidate_selector.predecessor_codebook"][predecessor] * (
        hidden[t] @ sd["candidate_selector.hidden_projection.weight"].T
    )
    return ids, unary + sd["candidate_selector.successor_codebook"][ids] @ gate


def reference_greedy_path(sd, cfg, hidden, logits, anchor):
    path, pred = [], anchor
    for t in range(hidden.shape[0]):
        ids, scores = reference_scores(sd, cfg, hidden, logits, pred, t)
        pred = int(ids[scores.argmax()])
        path.append(pred)
    return path


# -- fixtures -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    root = tmp_path_factory.mktemp("dflash2")
    write_target(root / "target", "qwen3", seed=51)
    return root, load_target(root / "target", "cpu", torch.float32)


def _drafter(root, model, name, **config_changes):
    folder = root / name
    cfg = write_drafter(
        folder,
        root / "target",
        seed=52,
        layers=3,
        block_size=BLOCK,
        sliding_window=WINDOW,
        layer_types=LAYER_TYPES,
        dflash2=True,
    )
    for key, value in config_changes.items():
        if value is None:
            cfg.pop(key, None)
        elif key in ("input_embedding_scale", "output_multiplier", "final_logit_softcapping"):
            cfg["dflash_config"][key] = value
        else:
            cfg[key] = value
    (folder / "config.json").write_text(json.dumps(cfg))
    return load_drafter(folder, model), load_file(str(folder / "model.safetensors")), cfg


def _inputs(model, drafter, n, seed):
    gen = torch.Generator().manual_seed(seed)
    return (
        torch.randn(n, drafter.fc.in_features, generator=gen),
        torch.randint(0, model.cfg.vocab_size, (n,), generator=gen),
    )


def _propose(drafter, anchor, start, params, draws, q):
    ids = torch.full((BLOCK,), drafter.mask_token_id)
    ids[0] = anchor
    return drafter.propose(ids, Span.eager(start, BLOCK, ids.device), params, draws, q)


# -- the forward pass and the selector against the reference ---------------------------------------------


@pytest.mark.parametrize(
    "case, changes",
    [
        ("not-causal", {}),  # as z-lab's Qwen3.8-27B drafter declares (is_causal false)
        ("undeclared", {"is_causal": None}),  # sliding layers causal, the full layer bidirectional
        ("scaled", {"input_embedding_scale": 1.7, "output_multiplier": 0.6, "final_logit_softcapping": 3.0}),
    ],
)
@torch.no_grad()
def test_dflash2_drafts_match_the_reference(target, case, changes):
    root, model = target
    drafter, sd, cfg = _drafter(root, model, case, **changes)
    assert isinstance(drafter, DFlash2Drafter)
    assert [layer.self_attn.causal for layer in drafter.layers] == _layer_causal(cfg)
    features, tokens = _inputs(model, drafter, 40, seed=3)
    embed, head = model.model.embed_tokens.weight, model.lm_head.weight
    drafter.allocate(64)
    V = model.cfg.vocab_size
    sampled = SamplingParams(temperature=0.8)
    for start, end in STEPS:
        drafter.append_context(features[start:end], end)
        anchor = int(tokens[end])
        want_hidden, want_logits = reference_block(sd, cfg, embed, head, features, anchor, end)
        hidden = drafter.draft_hidden(anchor, end)
        torch.testing.assert_close(hidden, want_hidden, rtol=0, atol=1e-4)
        torch.testing.assert_close(drafter.logits(hidden), want_logits, rtol=0, atol=1e-4)

        greedy = _propose(drafter, anchor, end, SamplingParams(), None, None)
        assert greedy.tolist() == reference_greedy_path(sd, cfg, want_hidden, want_logits, anchor)

        draws = Draws.empty(BLOCK, V, torch.device("cpu")).fill_drafts(torch.Generator().manual_seed(end))
        q = torch.full((BLOCK - 1, V), float("nan"))
        path = _propose(drafter, anchor, end, sampled, draws, q).tolist()
        pred = anchor
        for t, token in enumerate(path):
            ids, scores = reference_scores(sd, cfg, want_hidden, want_logits, pred, t)
            want_q = torch.zeros(V).scatter(0, ids, torch.softmax(scores / sampled.temperature, -1))
            torch.testing.assert_close(q[t], want_q, rtol=0, atol=1e-5)
            assert token in ids.tolist()
            pred = token


@torch.no_grad()
def test_the_convolutions_and_the_selector_change_the_drafts(target):
    """The checks above would pass for a drafter that ignored its DFlash2 parts if those did nothing: with
    identity convolutions and a zero successor codebook (a freshly initialised DFlash2, as vLLM's speculators
    starts one) it drafts exactly as a plain DFlash drafter, and with its own weights it does not."""
    root, model = target
    drafter, sd, cfg = _drafter(root, model, "parts")
    features, tokens = _inputs(model, drafter, 24, seed=9)
    start, anchor = 20, int(tokens[20])

    def draft(d):
        d.allocate(64)
        d.append_context(features[:start], start)
        hidden = d.draft_hidden(anchor, start)
        return hidden, _propose(d, anchor, start, SamplingParams(), None, None)

    own_hidden, own_path = draft(drafter)
    for layer in drafter.layers:
        for conv in (layer.attention_conv, layer.mlp_conv):
            conv.base_kernel.zero_()
            conv.base_kernel[:, 0] = 1.0
            conv.kernel_projection.weight.zero_()
    drafter.candidate_selector.successor_codebook.zero_()
    plain_hidden, plain_path = draft(drafter)
    assert (own_hidden - plain_hidden).abs().max() > 1e-2

    dflash_cfg = dict(cfg, architectures=["DFlashDraftModel"])
    folder = root / "parts-as-dflash"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(dflash_cfg))
    from safetensors.torch import save_file

    save_file(
        {k: v for k, v in sd.items() if "_conv." not in k and "candidate_selector" not in k},
        str(folder / "model.safetensors"),
    )
    as_dflash = load_drafter(folder, model)
    dflash_hidden = draft(as_dflash)[0]
    torch.testing.assert_close(plain_hidden, dflash_hidden, rtol=0, atol=1e-5)
    assert plain_path.tolist() == as_dflash.logits(dflash_hidden).argmax(-1).tolist()
    assert own_path.tolist() != plain_path.tolist() or (own_hidden - plain_hidden).abs().max() > 1e-2


# -- lossless in the engine -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dflash2_dirs(tmp_path_factory):
    out = {}
    for i, arch in enumerate(ARCHS):
        root = tmp_path_factory.mktemp(f"d2-{arch}")
        write_target(root / "target", arch, seed=60 + i)
        write_drafter(root / "drafter", root / "target", seed=70 + i, block_size=BLOCK, dflash2=True)
        out[arch] = root
    return out


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_dflash2_equals_greedy_plain_decoding(arch, dflash2_dirs):
    root = dflash2_dirs[arch]
    model = load_target(root / "target", "cpu", torch.float32)
    spec = Engine(model, load_drafter(root / "drafter", model), max_context=256, draft=BLOCK - 1)
    plain = Engine(model, None, max_context=256)
    params = SamplingParams(max_new_tokens=40)
    for prompt in ([3, 9, 27, 81], [5, 17, 99, 3, 44, 12, 7], [100, 2]):
        expected, _, _ = run(plain, prompt, params)
        got, finished, _ = run(spec, prompt, params)
        assert got == expected
        assert finished.stats.drafted > 0
        plain.reset()
        spec.reset()


@pytest.mark.slow(seconds=14)
def test_sampled_dflash2_output_has_the_target_distribution(tmp_path_factory):
    """Tokens 1-3 of 400 seeded generations at T 0.9 / top-k 10 with a mismatched DFlash2 drafter (q over its
    4 candidates) against the exact marginals. Its logits are scaled up (output_multiplier 6) so its q is
    peaked: a verify that used any other q than the one the drafts were drawn from would skew the output (with q
    written uniform over the candidates, token 2's p is 1e-8 at 400 answers)."""
    root = tmp_path_factory.mktemp("d2-small")
    write_target(root / "target", "qwen3_5", seed=5, vocab_size=V_SMALL, tokenizer=False)
    model = load_target(root / "target", "cpu", torch.float32)
    cfg = write_drafter(root / "drafter", root / "target", seed=8, block_size=4, dflash2=True)
    cfg["dflash_config"]["output_multiplier"] = 6.0
    (root / "drafter" / "config.json").write_text(json.dumps(cfg))
    engine = Engine(model, load_drafter(root / "drafter", model), max_context=32, draft=3)
    prompt = [1, 4, 7]
    params = SamplingParams(temperature=0.9, top_k=10, max_new_tokens=3)
    exact = _exact_marginals(model, prompt, params, steps=3)
    counts = torch.zeros(3, V_SMALL)
    accepted = 0
    for i in range(400):
        engine.reset()
        tokens, finished, _ = run(engine, prompt, SamplingParams(temperature=0.9, top_k=10, max_new_tokens=3, seed=i))
        accepted += finished.stats.accepted
        for pos, t in enumerate(tokens):
            counts[pos, t] += 1
    for pos in range(3):
        assert chi_square_p(counts[pos], exact[pos]) > P_MIN, f"token {pos + 1} is not distributed as the target's"
    assert accepted > 10


# -- GGUF, as llama.cpp's converter (mainline `dflash` arch) and quantizer write DFlash2 drafters -------------


@torch.no_grad()
def test_dflash2_gguf_loads_and_drafts_like_its_folder(target, tmp_path):
    import gguf

    from tests.engine.gguf_write import quantize_like_llama, write_drafter_gguf

    root, model = target
    folder_drafter, sd, cfg = _drafter(root, model, "gguf-source")
    path = write_drafter_gguf(tmp_path / "d2.gguf", sd, cfg, "F32", schema="dflash")
    reader = gguf.GGUFReader(str(path))
    fields = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    assert fields["general.architecture"] == "dflash"
    assert [
        fields[f"dflash.{k}"] for k in ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")
    ] == [2, 8, 8, 4]
    assert fields["dflash.attention.causal"] is False and fields["dflash.block_size"] == BLOCK
    shapes = {t.name: [int(d) for d in t.shape] for t in reader.tensors}  # ggml order (ne0 first)
    H, V = cfg["hidden_size"], model.cfg.vocab_size
    assert shapes["blk.0.attn_conv_base"] == [H, 2, 2] and shapes["blk.2.ffn_conv_base"] == [H, 2, 2]
    assert shapes["blk.1.attn_conv_proj.weight"] == [H, 2 * 2 * H // 8]
    assert shapes["selector_predecessor.weight"] == [8, V] and shapes["selector_hidden.weight"] == [H, 8]

    q8 = quantize_like_llama(path, tmp_path / "d2-q8.gguf", "Q8_0")
    types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(q8)).tensors}
    assert types["blk.0.attn_conv_base"] == "F32" and types["blk.0.attn_conv_proj.weight"] == "Q8_0"
    features, tokens = _inputs(model, folder_drafter, 24, seed=5)
    start, anchor = 20, int(tokens[20])
    results = []
    for drafter in (folder_drafter, load_drafter(path, model), load_drafter(q8, model)):
        assert isinstance(drafter, DFlash2Drafter)
        drafter.allocate(64)
        drafter.append_context(features[:start], start)
        hidden = drafter.draft_hidden(anchor, start)
        results.append((drafter.logits(hidden), _propose(drafter, anchor, start, SamplingParams(), None, None)))
    (want, want_path), (f32, f32_path), (q8_logits, _) = results
    torch.testing.assert_close(f32, want, rtol=0, atol=1e-5)
    assert f32_path.tolist() == want_path.tolist()
    assert (q8_logits - want).abs().max() < 0.05 * want.abs().max()


def test_a_drafter_for_another_target_is_refused(target, tmp_path):
    """A DFlash2 drafter whose codebooks cover another vocabulary is refused with one clear line."""
    from dflash_chat.engine.errors import ModelFormatError

    root, model = target
    _, sd, cfg = _drafter(root, model, "other-vocab")
    folder = tmp_path / "other-vocab"
    folder.mkdir()
    from safetensors.torch import save_file

    sd = dict(sd)
    for name in ("candidate_selector.predecessor_codebook", "candidate_selector.successor_codebook"):
        sd[name] = torch.cat((sd[name], sd[name][:7]))
    save_file(sd, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(dict(cfg, vocab_size=model.cfg.vocab_size + 7)))
    with pytest.raises(ModelFormatError, match="vocabulary") as err:
        load_drafter(folder, model)
    assert "\n" not in str(err.value)


# -- the synthetic Qwen3.8-27B pair (bench --synthetic qwen3.8-27b) -------------------------------------------


def test_synthetic_qwen38_drafter_has_the_published_dflash2_shapes():
    from dflash_chat.bench import synthetic_models

    cfg = synthetic_models.drafter_config("qwen3.8-27b", 64)
    assert cfg.dflash2 is not None and cfg.block_size == 8 and cfg.num_layers == 5
    assert (
        cfg.dflash2.conv_kernel_size,
        cfg.dflash2.conv_group_size,
        cfg.dflash2.selector_rank,
        cfg.dflash2.selector_top_k,
    ) == (2, 16, 256, 16)
    assert cfg.target_layer_ids == [5, 19, 33, 47, 61] and cfg.layer_causal == [False] * 5
    assert synthetic_models.target_config("qwen3.8-27b").num_layers == 64


def test_synthetic_dflash2_drafter_reads_only_the_candidates_codebook_rows():
    """bytes_per_token counts the selector's codebooks by the rows a draft position gathers (its K candidates
    and its predecessor), not whole [V, rank] tables; every other drafter weight once."""
    from dflash_chat.bench import synthetic_models

    synthetic_models.TARGETS["tiny-38"] = dict(
        synthetic_models.TARGETS["qwen3.8-27b"],
        vocab_size=512,
        hidden_size=256,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=128,
        linear_num_key_heads=2,
        linear_num_value_heads=2,
    )
    synthetic_models.DRAFTERS["tiny-38"] = dict(
        synthetic_models.DRAFTERS["qwen3.8-27b"],
        hidden_size=256,
        intermediate_size=512,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
    )
    try:
        target = synthetic_models.build_target("tiny-38", "Q8_0", layers=2)
        drafter = synthetic_models.build_drafter("tiny-38", target)
    finally:
        del synthetic_models.TARGETS["tiny-38"], synthetic_models.DRAFTERS["tiny-38"]
    assert isinstance(drafter, DFlash2Drafter)
    selector = drafter.candidate_selector
    codebooks = [selector.predecessor_codebook, selector.successor_codebook]
    assert all(
        not isinstance(c, type(None)) and c.dtype == torch.float32 and tuple(c.shape) == (512, 256) for c in codebooks
    )
    everything = sum(t.numel() * t.element_size() for t in (*drafter.parameters(), *drafter.buffers()))
    table = sum(c.numel() * c.element_size() for c in codebooks)
    assert synthetic_models.bytes_per_token(drafter) == everything - table + table * (16 + 1) // 512


@pytest.mark.parametrize("sampling", [False, True])
def test_dflash2_step_entry_points_read_nothing_from_the_device(sampling, dflash2_dirs):
    """The draft (backbone, top-K, the selector's walk and q) and the verify are device work only: what a
    CUDA graph can hold."""
    from tests.engine.sync_free import NoHostReads

    root = dflash2_dirs["qwen3_5"]
    model = load_target(root / "target", "cpu", torch.float32)
    engine = Engine(model, load_drafter(root / "drafter", model), max_context=200, draft=BLOCK - 1)
    run(engine, [5, 6, 7, 8], SamplingParams(max_new_tokens=3))
    params = SamplingParams(temperature=0.8, top_k=10, top_p=0.9, seed=1) if sampling else SamplingParams()
    steps = engine.steps
    steps.begin(3, len(engine.tokens), params, torch.Generator().manual_seed(0))
    with NoHostReads():
        steps.draft(BLOCK)
        steps.verify(BLOCK, 9)
        steps.commit(BLOCK)
    assert 1 <= steps.read().accepted + 1 <= BLOCK


@torch.no_grad()
@pytest.mark.parametrize("sampled", [False, True])
def test_a_dflash2_draft_for_a_short_verify_is_the_full_drafts_prefix(sampled, dflash2_dirs):
    """The selector's walk over the first T - 1 positions is the full walk's start (each step depends only on
    the steps before it)."""
    from tests.engine.helpers import full_and_short_drafts

    root = dflash2_dirs["qwen3_5"]
    model = load_target(root / "target", "cpu", torch.float32)
    engine = Engine(model, load_drafter(root / "drafter", model), max_context=200)
    (full, full_q), (short, short_q) = full_and_short_drafts(engine, sampled)
    assert torch.equal(short, full)
    if sampled:  # the same q rows, to the last bits a smaller matrix product may round differently
        torch.testing.assert_close(short_q, full_q, rtol=1e-5, atol=1e-7)
        assert bool((short_q.sum(-1) > 0.99).all())


def test_a_qwen38_style_gguf_pair_decodes_losslessly(dflash2_dirs, tmp_path):
    """Qwen3.8-27B as users download it: a qwen35 target GGUF with its MTP block (llama.cpp's converter, then
    its quantizer) and the DFlash2 drafter GGUF (mainline `dflash`, Q8_0). The F32 target's logits are
    transformers' on the same weights, and greedy DFlash2 decoding of the quantized pair is plain decoding's."""
    from transformers import AutoModelForCausalLM

    from dflash_chat.engine.load import load_pair
    from tests.engine.gguf_write import quantize_like_llama, write_drafter_gguf, write_target_gguf

    root = dflash2_dirs["qwen3_5"]
    hf = AutoModelForCausalLM.from_pretrained(str(root / "target"), dtype=torch.float32).eval()
    target_cfg = json.loads((root / "target" / "config.json").read_text())
    f32 = write_target_gguf(tmp_path / "t-f32.gguf", hf.state_dict(), target_cfg, "F32", extra_mtp_layers=1)
    ids = torch.tensor([3, 9, 27, 81, 5, 17])
    ours = load_target(f32, "cpu", torch.float32)
    logits, _ = ours(ids, ours.new_state(32), logits="all")
    torch.testing.assert_close(logits, hf(ids[None]).logits[0], rtol=0, atol=1e-4)

    target = quantize_like_llama(f32, tmp_path / "t-q8.gguf", "Q8_0")
    drafter_cfg = json.loads((root / "drafter" / "config.json").read_text())
    drafter = write_drafter_gguf(
        tmp_path / "d-f32.gguf",
        load_file(str(root / "drafter" / "model.safetensors")),
        drafter_cfg,
        "F32",
        schema="dflash",
    )
    drafter = quantize_like_llama(drafter, tmp_path / "d-q8.gguf", "Q8_0")
    pair = load_pair(target, drafter, tokenizer=root / "target", device="cpu", dtype=torch.float32, draft=BLOCK - 1)
    assert isinstance(pair.engine.drafter, DFlash2Drafter)
    plain = Engine(pair.engine.target, None, max_context=256, end_ids=pair.engine.end_ids)
    params = SamplingParams(max_new_tokens=32)
    for prompt in ([3, 9, 27, 81], [5, 17, 99, 3, 44]):
        expected, _, _ = run(plain, prompt, params)
        got, finished, _ = run(pair.engine, prompt, params)
        assert got == expected and finished.stats.drafted > 0
        plain.reset()
        pair.engine.reset()


def test_our_modules_hold_exactly_the_tensors_of_a_published_dflash2_checkpoint():
    """z-lab publishes a DFlash2 checkpoint's config and safetensors header as test fixtures (a 6656-wide, 5-layer
    drafter with output_multiplier and a logit soft cap in dflash_config): our modules, built from that config,
    hold the header's tensors by name and shape, no more and no fewer."""
    from dflash_chat.engine.models.config import DrafterConfig
    from dflash_chat.engine.models.dflash2 import build_drafter

    H, V, I, layers = 6656, 202048, 19968, 5
    config = {
        "architectures": ["DFlash2DraftModel"],
        "model_type": "qwen3",
        "is_causal": False,
        "hidden_size": H,
        "intermediate_size": I,
        "num_hidden_layers": layers,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "rms_norm_eps": 1e-5,
        "vocab_size": V,
        "layer_types": ["sliding_attention"] * layers,
        "sliding_window": 2048,
        "use_sliding_window": True,
        "rope_parameters": {"rope_theta": 500000.0, "rope_type": "default"},
        "dflash_config": {
            "block_size": 16,
            "conv_group_size": 16,
            "conv_kernel_size": 2,
            "final_logit_softcapping": 20.0,
            "mask_token_id": 201818,
            "output_multiplier": 0.19611613513818404,
            "selector_rank": 256,
            "selector_top_k": 16,
            "target_layer_ids": [1, 13, 25, 37, 49],
        },
    }
    header = {
        "candidate_selector.hidden_projection.weight": [256, H],
        "candidate_selector.predecessor_codebook": [V, 256],
        "candidate_selector.successor_codebook": [V, 256],
        "fc.weight": [H, 5 * H],
        "hidden_norm.weight": [H],
        "norm.weight": [H],
    }
    per_layer = {
        "attention_conv.base_kernel": [2, 2, H],
        "attention_conv.kernel_projection.weight": [1664, H],
        "mlp_conv.base_kernel": [2, 2, H],
        "mlp_conv.kernel_projection.weight": [1664, H],
        "input_layernorm.weight": [H],
        "post_attention_layernorm.weight": [H],
        "mlp.down_proj.weight": [H, I],
        "mlp.gate_proj.weight": [I, H],
        "mlp.up_proj.weight": [I, H],
        "self_attn.k_norm.weight": [128],
        "self_attn.q_norm.weight": [128],
        "self_attn.k_proj.weight": [1024, H],
        "self_attn.v_proj.weight": [1024, H],
        "self_attn.q_proj.weight": [4096, H],
        "self_attn.o_proj.weight": [H, 4096],
    }
    header.update({f"layers.{i}.{name}": shape for i in range(layers) for name, shape in per_layer.items()})
    cfg = DrafterConfig.from_dict(config)
    assert cfg.dflash2.output_multiplier == pytest.approx(0.19611613513818404)
    assert cfg.dflash2.final_logit_softcapping == 20.0 and cfg.layer_causal == [False] * layers
    with torch.device("meta"):
        drafter = build_drafter(cfg, H, V)
    assert {name: list(p.shape) for name, p in drafter.named_parameters()} == header
