"""Where a multi-machine job's rendezvous secret comes from: --rdzv-secret-file (rdzv.secret_file), else
the LAUNCHER_RDZV_SECRET environment variable (a SLURM submission sets it for its tasks).

Only the path is ever part of the config; the secret itself is read here, by the node agent, and is
written nowhere (docs/security.md).
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path
from typing import Mapping, Optional

from launcher.errors import ConfigError
from launcher.runtime import env

HOW_TO_MAKE = "python3 -c 'import secrets; print(secrets.token_hex(32))' > FILE; chmod 600 FILE"


def read_rdzv_secret(secret_file: Optional[str], environ: Mapping[str, str], warn: bool = False) -> Optional[bytes]:
    """The secret's bytes (surrounding whitespace dropped), or None where none is configured. warn: say so where the
    file is open to other users (once a launch: where it is first read, before anything starts)."""
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
        if warn:  # a file that gives a secret: one that is refused needs no second line
            warn_if_open(secret_file)
        return text.strip().encode()
    value = environ.get(env.RDZV_SECRET, "").strip()
    return value.encode() if value else None


def warn_if_open(secret_file: str) -> None:
    """A secret file that its group or other users may read or write, as ssh says of a private key file (which it
    then refuses to use): anyone who reads it can join the job. A warning, not a refusal."""
    try:
        mode = stat.S_IMODE(os.stat(secret_file).st_mode)
    except OSError:
        return  # the read says why
    if mode & 0o077:
        print(f"warning: --rdzv-secret-file {secret_file} is open to other users (mode {mode:04o}): anyone who can read "
              f"it can join this job or rewrite its rendezvous; make it yours alone: chmod 600 {secret_file}",
              file=sys.stderr, flush=True)
