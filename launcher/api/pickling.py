"""The call, pickled by value with its source: a rank's traceback shows the lines of a Jupyter cell or a script.

cloudpickle (3.1 and newer) names every code object it pickles by value "<dynamic-code>", so a traceback
in a rank had no file and no line text for a function from a notebook cell or a script's __main__. Here
the code keeps its own file name, and the lines that linecache holds for each such file in the caller
(IPython keeps every cell's source there, under the cell's file name) travel with the call; a rank puts
them in its own linecache before it calls the function, so `traceback` prints them as the caller would.
"""

from __future__ import annotations

import io
import linecache
import types
from collections import ChainMap
from typing import Any, Callable, Dict, List, Tuple

Sources = Dict[str, List[str]]  # a code file name -> its lines, as linecache.getlines gives them
DYNAMIC = "<dynamic-code>"  # cloudpickle's stand-in for the file name of code pickled by value
MAX_SOURCE_CHARS = 4_000_000  # a file's lines travel only under this size (a huge generated file does not)


def dumps_call(fn: Callable[..., Any], args: Tuple[Any, ...]) -> Tuple[bytes, Sources]:
    """(fn, args) pickled by cloudpickle, each code object pickled by value under its own file name; with the
    source lines of those files that linecache has here."""
    import cloudpickle

    buffer = io.BytesIO()
    pickler = _keeping_filenames(cloudpickle.Pickler, buffer)
    pickler.dump((fn, args))
    return buffer.getvalue(), sources_of(pickler.filenames)


def sources_of(filenames: List[str]) -> Sources:
    found: Sources = {}
    for name in filenames:
        lines = linecache.getlines(name)
        if lines and sum(map(len, lines)) <= MAX_SOURCE_CHARS:
            found[name] = list(lines)
    return found


def register_sources(sources: Sources) -> None:
    """In a rank: the caller's lines for each file, kept by linecache (no mtime: checkcache leaves them alone)."""
    for name, lines in sources.items():
        if isinstance(name, str) and isinstance(lines, list) and all(isinstance(line, str) for line in lines):
            linecache.cache[name] = (sum(map(len, lines)), None, lines, name)


def _keeping_filenames(base: Any, buffer: io.BytesIO) -> Any:
    """An instance of a subclass of cloudpickle.Pickler (base) whose code reducer keeps co_filename."""

    class Pickler(base):
        def __init__(self, file: io.BytesIO) -> None:
            self.filenames: List[str] = []
            # before the pickler's own __init__, which reads its dispatch_table once
            self.dispatch_table = ChainMap({types.CodeType: self._code}, base.dispatch_table)
            super().__init__(file)

        def _code(self, code: types.CodeType) -> Any:
            rebuild, fields = base.dispatch_table[types.CodeType](code)
            if code.co_filename not in self.filenames:
                self.filenames.append(code.co_filename)
            return rebuild, tuple(code.co_filename if field == DYNAMIC else field for field in fields)

    return Pickler(buffer)
