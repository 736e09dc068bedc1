"""The head-node pull agent (one stdlib-only file, shipped as is) and its installer."""
