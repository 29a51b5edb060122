"""The script every rank of a launch()/submit() job runs: `python -m launcher.api.worker CALL_FILE`.

It is an ordinary torchrun-style script to the launcher (the same agent, environment, logs and failure
handling as any script): it loads the call (launcher.api.payload), calls fn(*args) and writes the rank's
signed return value. An exception is written as the rank's signed traceback, then raised again, so the
launcher sees the rank fail, names it and stops the others, as for any script.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from typing import Any, Dict, List

from launcher.api.payload import read_payload, write_outcome
from launcher.api.pickling import register_sources


def extend_path(caller_path: List[str]) -> None:
    """The caller's import folders after the rank's own: a function of an imported module unpickles by name."""
    for entry in caller_path:
        if entry and entry not in sys.path and os.path.isdir(entry):
            sys.path.append(entry)


def own_traceback(error: BaseException) -> str:
    """The traceback from the function's frame on (this file's call frame left out)."""
    tb = error.__traceback__
    return "".join(traceback.format_exception(type(error), error, tb.tb_next if tb is not None else None))


def main(argv: List[str]) -> None:
    if len(argv) != 1:
        raise SystemExit("usage: python -m launcher.api.worker CALL_FILE (launcher.launch and launcher.submit run it)")
    rank = int(os.environ["RANK"])
    loaded: Dict[str, Any] = read_payload(argv[0])
    extend_path(loaded["sys_path"])
    import cloudpickle

    fn, args = cloudpickle.loads(loaded["call"])  # unpickled after the path is extended: by-name references resolve
    register_sources(loaded.get("sources") or {})  # a traceback shows the caller's lines (launcher.api.pickling)
    try:
        value = fn(*args)
    except BaseException as error:  # noqa: BLE001  (recorded, then raised as it was)
        record = {"type": type(error).__name__, "traceback": own_traceback(error)}
        write_outcome(loaded, rank, "error", json.dumps(record).encode())
        raise
    write_outcome(loaded, rank, "result", cloudpickle.dumps(value))


if __name__ == "__main__":
    main(sys.argv[1:])
