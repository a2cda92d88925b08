"""A conversation with a model: its messages (conversation), the history store and recorder, and the
backends the app talks to (backends/: the engine in this process, or a server)."""
