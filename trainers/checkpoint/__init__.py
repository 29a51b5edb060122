"""Checkpoints: saving and loading (the format's files: launcher.runtime.checkpoints), background writes, the save
interval, and when the loop saves."""
