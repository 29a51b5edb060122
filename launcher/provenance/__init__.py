"""What produced a run: its code, packages, machine and environment (launcher.provenance.capture)."""
