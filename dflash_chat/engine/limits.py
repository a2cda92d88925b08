"""The largest size each model metadata field may state, far above any real model's.

A config (or GGUF metadata) is checked against these before anything loops over it or is built from it,
so a damaged or hostile file cannot make the loader build a million layers."""

LIMITS = {
    "num_hidden_layers": 1024,
    "vocab_size": 1 << 22,
    "max_position_embeddings": 1 << 24,
    "num_experts": 4096,
    "num_experts_per_tok": 4096,
    "block_size": 256,
    "mask_token_id": 1 << 22,
}
DEFAULT_LIMIT = 1 << 18  # widths, head counts and dims
