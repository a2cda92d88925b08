"""What answers the chat: base.py (the seam the chat screen talks to), local.py (the engine in this
process), remote.py (an OpenAI-compatible server)."""
