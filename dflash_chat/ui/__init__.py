"""The Textual app: screens, widgets and styles. Nothing here imports torch at import time."""
