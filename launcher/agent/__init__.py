"""torch's elastic agent on this node: starts, watches and stops the workers."""
