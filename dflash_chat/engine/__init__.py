"""Everything torch lives here. Nothing in this package imports ui/ or chat/."""
