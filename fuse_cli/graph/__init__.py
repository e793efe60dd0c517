"""Model I/O and the graph-editing primitives every pass shares."""
