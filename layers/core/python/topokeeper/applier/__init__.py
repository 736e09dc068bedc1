"""The head-node applier: one stdlib-only file, shipped as is."""
