"""Everything torch lives here: prompt ids in, tokens and events out. Nothing in this package imports the app
(runtime/, chat/, ui/, serve/) or keeps a conversation; docs/ARCHITECTURE.md has the map."""
