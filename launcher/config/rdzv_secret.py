"""Where a multi-machine job's rendezvous secret comes from: --rdzv-secret-file (rdzv.secret_file), else
the LAUNCHER_RDZV_SECRET environment variable (a SLURM submission sets it for its tasks).

Only the path is ever part of the config; the secret itself is read here, by the node agent, and is
written nowhere (docs/security.md).
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Optional

from launcher.errors import ConfigError
from launcher.runtime import env

HOW_TO_MAKE = "python3 -c 'import secrets; print(secrets.token_hex(32))' > FILE; chmod 600 FILE"


def read_rdzv_secret(secret_file: Optional[str], environ: Mapping[str, str]) -> Optional[bytes]:
    """The secret's bytes (surrounding whitespace dropped), or None where none is configured."""
    if secret_file:
        try:
            text = Path(secret_file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            reason = e.strerror if isinstance(e, OSError) and e.strerror else e.__class__.__name__
            raise ConfigError(f"--rdzv-secret-file {secret_file} cannot be read ({reason}): give a readable file "
                              f"holding the job's secret, the same on every node (make one: {HOW_TO_MAKE})") from e
        if not text.strip():
            raise ConfigError(f"--rdzv-secret-file {secret_file} is empty: put the job's secret in it, the same "
                              f"on every node (make one: {HOW_TO_MAKE})")
        return text.strip().encode()
    value = environ.get(env.RDZV_SECRET, "").strip()
    return value.encode() if value else None
