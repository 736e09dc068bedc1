"""The AWS emulator's parts; the public API is ``topokeeper.sim.aws_emulator``."""
