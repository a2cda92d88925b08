"""GGML's block formats: their layouts, torch dequantizers and quantizers. Below both the kernels (which compute on
the packed blocks) and the weight readers (which hand them out), and depending on neither."""
