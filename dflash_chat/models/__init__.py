"""Which model pairs exist, which one fits this machine, and fetching their files.

catalog (the pairs and their sources), hardware (the GPU probe and the fit), hub (the Hugging Face
cache and downloads), sizes and disk (bytes as people read them, free space), demo (the tiny pair
shipped with the package). No torch at import: `--help` and the first frame stay instant.
"""
