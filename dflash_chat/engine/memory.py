"""The one memory model: what the engine allocates for a model pair, term by term.

The picker (models/hardware.py) adds these terms up to decide what fits before any weight is read, so this
module imports nothing heavy (no torch): only the shapes and the rules. The engine's allocations
must follow the same rules; tests/engine/test_memory_model.py loads real pairs of each architecture
and compares these figures with the bytes of the tensors the engine really holds, so a change to
either side that makes them drift fails there.

Notation: C = the context the engine is built for (`Engine(max_context=C)`), B = the most tokens a verify
takes (engine/speculation.py `width`: under `auto`, the widest drafting method the pair has, prompt lookup's
16 at least; 1 when nothing drafts), e = bytes per element of the compute dtype (`compute_bytes`: bf16 on a
GPU, float32 on the CPU, as engine/load.py's default_dtype).

What the engine holds for a whole conversation (`state_bytes`):
- target KV: every full-attention layer keeps K and V of `cache_rows(C, B)` = C + B positions (the
  verify step writes up to B-1 positions past the committed ones), [rows, kv_heads, head_dim] in e;
- target RoPE table: cos and sin, [rows, rotary_dim] in e;
- Gated DeltaNet: per linear-attention layer `RECURRENT_COPIES` float32 states [value_heads,
  key_dim, value_dim] (the live state and the snapshot taken after each prefill for prefix reuse; a
  speculative forward leaves the live state alone, so there is no copy to roll back from) and
  `CONV_COPIES` conv windows [kernel-1, conv_channels] in e (live, snapshot);
- what a verify leaves for its commit, per linear-attention layer (engine/state.py): the block's conv
  output [B, conv_channels], its raw gate projections b and a [B, value_heads] and its conv window
  [kernel-1+B, conv_channels], all in e;
- the prefill snapshot's logits: [vocab] float32;
- drafter KV: per layer K and V of `drafter_cache_rows` positions, [rows, kv_heads, head_dim] in e:
  C + B rows for a full-attention layer; a sliding-window layer only ever reads its last `window`
  context positions plus its block, so it needs min(C + B, window + its block);
- drafter RoPE table: cos and sin, [C + B, head_dim] in e;
- the target's MTP layer, when it has one: its K and V of C + B positions, [rows, kv_heads, head_dim] in
  e, and its newest hidden state [H] in e (live, and in the prefill snapshot);
- the prefill snapshot's copy of the drafter's sliding rings (the layers whose window + B rows are fewer
  than C + B), so a prompt that branches can draft from the snapshot's length again;
- the decode steps' outputs, kept per verify size T in use (engine/steps; `auto`'s sizes, the most
  any draft setting uses): the verify's logits [T, vocab] float32 and, with a drafter or an MTP layer,
  the target features they read [T, (taps + 1 for the MTP layer) * H] in e;
- sampling buffers (made by the first answer at T > 0, the app's default): exponential noise for the
  verify [B, vocab] and for the drafts [B-1, vocab], the drafts' q [B-1, vocab], all float32;
- a DFlash2 drafter only (docs/ARCHITECTURE.md, DFlash2 drafters): the candidate selector's buffers for the B-1 draft positions
  (the top-K candidate ids in int64, their scores and the walk's q over the K candidates in float32,
  and the selector's rank-wide rows: proj(h) and the K successor codebook rows gathered per position,
  [B-1, K+1, rank] in e), and the grouped dynamic convolutions' kernels of one draft step (per layer
  two convolutions, attention_conv and mlp_conv, each [B, 2 * kernel * groups] in e with groups =
  H / conv_group_size), which a captured draft graph keeps in its pool. Both are small (~0.3 MB for
  Qwen3.8-27B's drafter); its larger cost is its weights, which come from the file size as for any
  drafter. Its context cache follows the same sliding-window rule as a DFlash drafter's.

On top of that, the prompt checkpoints that let a branching prompt resume (engine/prefix_cache.py) take at
most the `prefix_cache_mib` budget, in checkpoints of `checkpoint_bytes` each: the GDN states (recurrent and
conv, as one copy of the live ones) and a copy of the drafter's rings. Parked conversations (engine/parked.py)
take host memory, not the device's: at most the `prefix_cache_ram_mib` budget, `row_bytes` a token plus their
checkpoints.

What a step or a prefill chunk needs on top, for a moment (`workspace_bytes`): see there.
Weights are the files' bytes (`weight_bytes`): GGUF tensors stay packed; a BF16 safetensors
checkpoint is held in the compute dtype.

The vision tower (engine/models/vision.py), where it is loaded: its weights in e whatever the file's type (an
mmproj GGUF's tensors are decoded as they load: its linears carry biases the packed modules do not), counted from
its shape (`vision_weight_bytes`), and, while it reads an image, its activations for the largest image the pixel
budget lets in (`vision_workspace_bytes`). The tower runs before the prefill that reads its features, so its
activations and the prefill's workspace are never held at once: the tower costs its weights plus what its
activations need beyond the engine's own workspace (`vision_bytes`).
"""

from __future__ import annotations

from dataclasses import dataclass

from dflash_chat.engine import speculation

PREFILL_CHUNK = 1024  # tokens per prefill forward (engine/spec.py prefills in chunks of this)
RECURRENT_COPIES = 2  # live + prefill snapshot
CONV_COPIES = 2  # live + prefill snapshot
STATE_BYTES = 4  # the recurrent state is float32 on every device
LOGIT_BYTES = 4  # logits are float32
FIXED_WORKSPACE = 2**29  # cuBLAS / Triton workspaces and allocator slack (512 MiB)
CHECKPOINT_BYTES = 2  # BF16: the dtype of the safetensors checkpoints the catalog ships


def compute_bytes(device: str) -> int:
    """Bytes per element of the model dtype on `device`: bf16 on CUDA, float32 on the CPU."""
    return 2 if device.startswith("cuda") else 4


@dataclass(frozen=True)
class TargetShape:
    """What sizes a target's state: hybrid Qwen3.5/3.6 (GDN + attention) or attention-only Qwen3."""

    layers: int
    attention_layers: int
    heads: int
    kv_heads: int
    head_dim: int
    rotary_dim: int
    hidden: int
    intermediate: int  # MoE: the width a token activates (routed experts x width + shared expert)
    vocab: int
    linear_key_heads: int = 0
    linear_value_heads: int = 0
    linear_key_dim: int = 0
    linear_value_dim: int = 0
    conv_kernel: int = 4
    mtp: bool = False  # it has its own MTP layer (Qwen3.5/3.6's `mtp.*`)

    @property
    def linear_layers(self) -> int:
        return self.layers - self.attention_layers

    @property
    def conv_channels(self) -> int:
        return 2 * self.linear_key_heads * self.linear_key_dim + self.linear_value_heads * self.linear_value_dim

    @classmethod
    def of(cls, cfg) -> TargetShape:
        """The shape of an engine TargetConfig (engine/models/config.py), as the loader parsed it."""
        active = cfg.intermediate_size
        if cfg.is_moe:
            active = cfg.num_experts_per_tok * cfg.moe_intermediate_size + cfg.shared_expert_intermediate_size
        return cls(
            layers=cfg.num_layers,
            attention_layers=sum(t == "full_attention" for t in cfg.layer_types),
            heads=cfg.num_heads,
            kv_heads=cfg.num_kv_heads,
            head_dim=cfg.head_dim,
            rotary_dim=cfg.rotary_dim,
            hidden=cfg.hidden_size,
            intermediate=active,
            vocab=cfg.vocab_size,
            linear_key_heads=cfg.linear_num_key_heads,
            linear_value_heads=cfg.linear_num_value_heads,
            linear_key_dim=cfg.linear_key_head_dim,
            linear_value_dim=cfg.linear_value_head_dim,
            conv_kernel=cfg.linear_conv_kernel_dim,
            mtp=cfg.mtp_layers > 0,
        )

    def methods(self, drafter: DrafterShape | None) -> dict[str, int]:
        """The drafting methods an engine of this target (and `drafter`) has -> the most drafts each makes."""
        return speculation.available(drafter.block_size if drafter else None, self.mtp)


DRAFTER_KINDS = ("dflash", "dflash2")  # DFlashDraftModel, DFlash2DraftModel
DFLASH2_FIELDS = ("selector_top_k", "selector_rank", "conv_kernel", "conv_group")


@dataclass(frozen=True)
class DrafterShape:
    """What sizes a drafter's buffers: its context cache and, for a DFlash2 drafter (`kind`
    "dflash2"), the candidate selector's and the dynamic convolutions' step buffers."""

    layers: int
    kv_heads: int
    head_dim: int
    hidden: int
    block_size: int = 16
    taps: int = 5  # target layers whose hidden states it reads
    sliding_layers: int = 0
    sliding_window: int = 0
    kind: str = "dflash"  # one of DRAFTER_KINDS
    # DFlash2 only (dflash_config): selector_top_k, selector_rank, conv_kernel_size, conv_group_size
    selector_top_k: int = 0
    selector_rank: int = 0
    conv_kernel: int = 0
    conv_group: int = 0  # channels per convolution group

    def problem(self) -> str | None:
        """Why this shape cannot be sized (None when it can): an unknown kind, a DFlash2 shape without
        its selector and convolution sizes, or a DFlash shape with them."""
        if self.kind not in DRAFTER_KINDS:
            return f"kind is {self.kind!r}; known kinds: {', '.join(DRAFTER_KINDS)}"
        if self.kind == "dflash2":
            missing = [name for name in DFLASH2_FIELDS if getattr(self, name) <= 0]
            if missing:
                return f"a dflash2 drafter needs {', '.join(missing)} (from its dflash_config)"
            if self.hidden % self.conv_group:
                return f"hidden {self.hidden} is not a multiple of conv_group {self.conv_group}"
        elif any(getattr(self, name) for name in DFLASH2_FIELDS):
            return f'{", ".join(DFLASH2_FIELDS)} belong to kind = "dflash2"'
        return None

    @property
    def conv_groups(self) -> int:
        """Groups of each grouped dynamic convolution (DFlash2): hidden / channels per group."""
        return self.hidden // self.conv_group if self.conv_group else 0

    @classmethod
    def of(cls, cfg) -> DrafterShape:
        """The shape of an engine DrafterConfig (engine/models/config.py); a DFlash2 drafter's by its DFlash2 part."""
        sliding = sum(t == "sliding_attention" for t in cfg.layer_types) if cfg.sliding_window else 0
        d2 = cfg.dflash2
        extra = {}
        if d2 is not None:
            extra = dict(
                kind="dflash2",
                selector_top_k=d2.selector_top_k,
                selector_rank=d2.selector_rank,
                conv_kernel=d2.conv_kernel_size,
                conv_group=d2.conv_group_size,
            )
        return cls(
            layers=cfg.num_layers,
            kv_heads=cfg.num_kv_heads,
            head_dim=cfg.head_dim,
            hidden=cfg.hidden_size,
            block_size=cfg.block_size,
            taps=len(cfg.target_layer_ids),
            sliding_layers=sliding,
            sliding_window=cfg.sliding_window or 0,
            **extra,
        )


# --- the rules the engine allocates by -------------------------------------------------------------


def cache_rows(context: int, block: int) -> int:
    """Positions every target cache (and a full-attention drafter layer) holds: C + B."""
    return context + block


def drafter_cache_rows(shape: DrafterShape, context: int, block: int) -> list[int]:
    """Positions each drafter layer's context cache holds (sliding-window layers, then full ones) in an engine
    whose verifies take `block` tokens at most."""
    full = cache_rows(context, block)
    window = min(full, shape.sliding_window + shape.block_size)
    return [window] * shape.sliding_layers + [full] * (shape.layers - shape.sliding_layers)


def verify_plan(target: TargetShape, drafter: DrafterShape | None, speculate: str = "auto") -> tuple[int, list[int]]:
    """(B, the verify sizes `auto` runs) of an engine under the speculate setting."""
    most = target.methods(drafter)
    sizes = speculation.method_sizes(speculate, "auto", most)
    return speculation.width(speculate, most), sorted({1} | {T for Ts in sizes.values() for T in Ts})


# --- bytes, term by term ----------------------------------------------------------------------------


@dataclass(frozen=True)
class StateBytes:
    """The engine's buffers for one conversation, by term (see the module docstring)."""

    target_kv: int = 0
    target_rope: int = 0
    gdn_recurrent: int = 0
    gdn_conv: int = 0
    gdn_verify: int = 0
    snapshot_logits: int = 0
    drafter_kv: int = 0
    drafter_rope: int = 0
    snapshot_rings: int = 0  # the prefill snapshot's copy of the drafter's sliding rings
    step_outputs: int = 0
    sampling: int = 0
    selector: int = 0  # DFlash2: the candidate selector's buffers
    draft_conv: int = 0  # DFlash2: the dynamic convolutions' kernels of one draft step
    mtp: int = 0  # the target's MTP layer: its KV cache and newest hidden state

    @property
    def total(self) -> int:
        return (
            self.target_kv
            + self.target_rope
            + self.gdn_recurrent
            + self.gdn_conv
            + self.gdn_verify
            + self.snapshot_logits
            + self.drafter_kv
            + self.drafter_rope
            + self.snapshot_rings
            + self.step_outputs
            + self.sampling
            + self.selector
            + self.draft_conv
            + self.mtp
        )


def state_bytes(
    target: TargetShape, drafter: DrafterShape | None, context: int, e: int, speculate: str = "auto"
) -> StateBytes:
    block, verified = verify_plan(target, drafter, speculate)
    rows = cache_rows(context, block)
    recurrent = target.linear_value_heads * target.linear_key_dim * target.linear_value_dim * STATE_BYTES
    conv = (target.conv_kernel - 1) * target.conv_channels * e
    taps = (drafter.taps if drafter else 0) + int(target.mtp)
    state = StateBytes(
        target_kv=target.attention_layers * 2 * rows * target.kv_heads * target.head_dim * e,
        target_rope=2 * rows * target.rotary_dim * e,
        gdn_recurrent=target.linear_layers * RECURRENT_COPIES * recurrent,
        gdn_conv=target.linear_layers * CONV_COPIES * conv,
        gdn_verify=target.linear_layers * verify_record_bytes(target, block, e),
        snapshot_logits=target.vocab * LOGIT_BYTES,
        step_outputs=sum(verified) * (target.vocab * LOGIT_BYTES + taps * target.hidden * e),
        sampling=(3 * block - 2) * target.vocab * LOGIT_BYTES + (block - 1) * LOGIT_BYTES,
        mtp=(2 * rows * target.kv_heads * target.head_dim + 2 * target.hidden) * e if target.mtp else 0,
    )
    if drafter is None:
        return state
    per_row = 2 * drafter.kv_heads * drafter.head_dim * e
    return StateBytes(
        **{
            **state.__dict__,
            "drafter_kv": sum(drafter_cache_rows(drafter, context, block)) * per_row,
            "drafter_rope": 2 * rows * drafter.head_dim * e,
            "snapshot_rings": ring_bytes(drafter, context, e, block),
            "selector": selector_bytes(drafter, e),
            "draft_conv": draft_conv_bytes(drafter, e),
        },
    )


def ring_bytes(drafter: DrafterShape, context: int, e: int, block: int | None = None) -> int:
    """One copy of the drafter's sliding rings: its layers whose window + B rows are fewer than C + B (B: the
    engine's widest verify, `block`, the drafter's own block by default)."""
    block = block or drafter.block_size
    full = cache_rows(context, block)
    per_row = 2 * drafter.kv_heads * drafter.head_dim * e
    return sum(rows for rows in drafter_cache_rows(drafter, context, block) if rows < full) * per_row


def checkpoint_bytes(target: TargetShape, drafter: DrafterShape | None, context: int, e: int) -> int:
    """One prompt checkpoint (engine/prefix_cache.py): every GDN layer's recurrent state (float32) and conv
    state, a copy of the drafter's rings, and the MTP layer's newest hidden state when the target has one."""
    recurrent = target.linear_value_heads * target.linear_key_dim * target.linear_value_dim * STATE_BYTES
    conv = (target.conv_kernel - 1) * target.conv_channels * e
    mtp = target.hidden * e if target.mtp else 0
    return target.linear_layers * (recurrent + conv) + (ring_bytes(drafter, context, e) if drafter else 0) + mtp


def row_bytes(target: TargetShape, drafter: DrafterShape | None, e: int) -> int:
    """One token of a parked conversation (engine/parked.py): its rows in every cache whose row j holds
    position j (the target's KV, the drafter's full-attention layers', the MTP layer's KV)."""
    per_row = 2 * target.kv_heads * target.head_dim * e
    rows = target.attention_layers * per_row + (per_row if target.mtp else 0)
    if drafter is not None:
        rows += (drafter.layers - drafter.sliding_layers) * 2 * drafter.kv_heads * drafter.head_dim * e
    return rows


CANDIDATE_ID_BYTES = 8  # int64 token ids


def selector_bytes(drafter: DrafterShape, e: int) -> int:
    """A DFlash2 drafter's candidate selector, for the B-1 draft positions: top-K ids (int64), their
    scores and the walk's q over them (float32), proj(h) and the K gathered successor codebook rows
    ([K+1, rank] in e). 0 for a DFlash drafter."""
    if drafter.kind != "dflash2":
        return 0
    positions, k = drafter.block_size - 1, drafter.selector_top_k
    return positions * (k * (CANDIDATE_ID_BYTES + 2 * LOGIT_BYTES) + (k + 1) * drafter.selector_rank * e)


def draft_conv_bytes(drafter: DrafterShape, e: int) -> int:
    """A DFlash2 drafter's dynamic convolution kernels for one draft step: per layer attention_conv and
    mlp_conv, each [B, 2 * kernel * groups] in e. 0 for a DFlash drafter."""
    if drafter.kind != "dflash2":
        return 0
    per_conv = drafter.block_size * 2 * drafter.conv_kernel * drafter.conv_groups
    return drafter.layers * 2 * per_conv * e


def verify_record_bytes(target: TargetShape, block: int, e: int) -> int:
    """One GDN layer's buffers for what a speculative forward of `block` tokens leaves to its commit."""
    values = block * (target.conv_channels + 2 * target.linear_value_heads)
    return values * e + (target.conv_kernel - 1 + block) * target.conv_channels * e


def workspace_bytes(
    target: TargetShape, drafter: DrafterShape | None, context: int, e: int, speculate: str = "auto"
) -> int:
    """Memory held only while a prefill chunk or a verify step runs: the larger of the two, plus
    FIXED_WORKSPACE for library workspaces and allocator slack. An estimate (what the engine frees
    again cannot be read back from its tensors), sized generously.

    Prefill chunk (T = min(PREFILL_CHUNK, C) tokens at the end of the context):
    - layer activations: the residual, norm, attention (q with its gate, k, v, out) and MLP (gate,
      up, product) rows, ~(6 H + 3 I) per token in e; a GDN layer's projections and conv window
      (3 conv channels + the z gate) in e and its normalised q, k and output in float32;
    - the causal mask: a bool [T, C + B] plus its copy repeated for each query head per KV head;
    - the drafter's context features: taps x H per token, gathered and concatenated (twice).
    Verify step: the target's logits and probabilities for the block ([B, vocab] float32, twice) and
    the sampling noise ([B, vocab] float32).
    """
    block = verify_plan(target, drafter, speculate)[0]
    rows = cache_rows(context, block)
    tokens = min(PREFILL_CHUNK, context)
    gdn_floats = target.linear_value_heads * (2 * target.linear_key_dim + target.linear_value_dim)
    per_token = (6 * target.hidden + 3 * target.intermediate) * e
    if target.linear_layers:
        per_token += (3 * target.conv_channels + target.linear_value_heads * target.linear_value_dim) * e
        per_token += gdn_floats * STATE_BYTES
    query_groups = max(1, target.heads // max(1, target.kv_heads))
    mask = (1 + query_groups) * tokens * rows
    features = 2 * drafter.taps * tokens * target.hidden * e if drafter else 0
    prefill = tokens * per_token + mask + features
    verify = 3 * block * target.vocab * LOGIT_BYTES
    return FIXED_WORKSPACE + max(prefill, verify)


def weight_bytes(file_bytes: int, kind: str, e: int) -> int:
    """Weights in memory: GGUF tensors stay packed; a BF16 safetensors checkpoint takes the compute dtype."""
    if kind == "safetensors":
        return file_bytes * e // CHECKPOINT_BYTES
    return file_bytes


# --- the vision tower ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class VisionShape:
    """What sizes a vision tower: its config (`vision_config`, engine/models/vision.py VisionConfig) and the pixel
    budget of the images it takes (the largest image is resized to `max_pixels`, engine/models/vision_input.py)."""

    depth: int
    hidden: int
    intermediate: int
    heads: int
    out_hidden: int
    patch: int = 16
    merge: int = 2
    temporal: int = 2
    positions: int = 2304  # the learned table of position embeddings (48 x 48)
    in_channels: int = 3
    max_pixels: int = 16777216  # Qwen3.5's preprocessor_config.json: size.longest_edge

    @classmethod
    def of(cls, cfg, max_pixels: int = 16777216) -> VisionShape:
        """The shape of an engine VisionConfig (engine/models/vision.py) with the pixel budget of its images."""
        return cls(
            depth=cfg.depth,
            hidden=cfg.hidden_size,
            intermediate=cfg.intermediate_size,
            heads=cfg.num_heads,
            out_hidden=cfg.out_hidden_size,
            patch=cfg.patch_size,
            merge=cfg.spatial_merge_size,
            temporal=cfg.temporal_patch_size,
            positions=cfg.num_position_embeddings,
            in_channels=cfg.in_channels,
            max_pixels=max_pixels,
        )

    @property
    def patch_values(self) -> int:
        return self.in_channels * self.temporal * self.patch**2

    @property
    def params(self) -> int:
        """Every weight and bias of the tower: patch embed, position table, blocks, merger."""
        h, i = self.hidden, self.intermediate
        merged = h * self.merge**2
        block = 2 * 2 * h + (3 * h * h + 3 * h) + (h * h + h) + (h * i + i) + (i * h + h)
        merger = 2 * h + (merged * merged + merged) + (merged * self.out_hidden + self.out_hidden)
        return h * self.patch_values + h + self.positions * h + self.depth * block + merger

    @property
    def max_patches(self) -> int:
        """Patches of the largest image the pixel budget lets in (one frame: a still image)."""
        return self.max_pixels // self.patch**2


def vision_weight_bytes(shape: VisionShape, e: int) -> int:
    """The tower's weights, in the compute dtype (an mmproj GGUF's F16, BF16 or Q8_0 tensors decoded as they load)."""
    return shape.params * e


def vision_workspace_bytes(shape: VisionShape, e: int) -> int:
    """The tower's activations while it reads the largest image the budget lets in (N patches), generously: the
    residual [N, hidden] in e and the 2-D rotary's cos and sin (float32) held throughout, plus the largest of its
    stages: the patch rows (float32, then in e) with the embedded patches; the position table's four taps per
    patch, gathered in e and weighted in float32; a block's attention (the norm's output and qkv in e, q or k being
    rotated in float32 (four rows' worth at once), q and k rotated in e, the frames' outputs, joined and laid out, and
    the projection; attention itself streams, without an N x N matrix) or its MLP (fc1 and its GELU in e); the merger
    (the norm, each block's rows side by side, fc1, GELU and the features). tests/engine/test_vision_memory.py
    measures the tower's live tensors against it."""
    n, h = shape.max_patches, shape.hidden
    head_dim = h // shape.heads
    held = n * h * e + 3 * n * head_dim * STATE_BYTES
    merged_rows, merged = n // shape.merge**2, h * shape.merge**2
    stages = (
        n * shape.patch_values * (STATE_BYTES + e) + n * h * e,
        n * 4 * h * (e + STATE_BYTES) + n * h * STATE_BYTES,
        n * (10 * h * e + 4 * h * STATE_BYTES),
        n * 2 * shape.intermediate * e,
        n * h * e + merged_rows * (3 * merged + shape.out_hidden) * e,
    )
    return held + max(stages)


def vision_bytes(shape: VisionShape, engine_workspace: int, e: int) -> int:
    """What loading the tower adds to an engine whose workspace is `engine_workspace` (workspace_bytes): its
    weights, and what its activations need beyond that workspace (the two are never held at once)."""
    return vision_weight_bytes(shape, e) + max(0, vision_workspace_bytes(shape, e) - engine_workspace)
