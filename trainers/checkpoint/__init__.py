"""Checkpoints: the on-disk format and its files, background writes, the save interval, and when the loop saves."""
