"""YAML from the user (a --config file, a run's recorded config.yaml, an override's value) read within limits:
a size, a nesting depth and no aliases, so a "billion laughs" or a 50,000-deep document is one line, not a
traceback or a minute of CPU. Values resolve as OmegaConf's loader resolves them (1e-3 is a float).

The pure-Python loader, not libyaml's: its composer is where depth and aliases can be refused before anything
is built, and it reads back the \\uDCxx escapes that a recorded non-UTF-8 script argument is written as.
"""

from __future__ import annotations

import re
from typing import Any, Optional

import yaml

from launcher.errors import ConfigError
from launcher.runtime.formatting import first_line

MAX_YAML_BYTES = 1 << 20  # a config of every key is about 3 KB: a megabyte is a mistake, not a config
MAX_YAML_DEPTH = 32  # the schema nests 3 deep; slurm.extra or wandb.tags may add a few

_FLOAT = re.compile(r"""^(?:
     [-+]?[0-9]+(?:_[0-9]+)*\.[0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?[0-9]+(?:_[0-9]+)*(?:[eE][-+]?[0-9]+)
    |\.[0-9]+(?:_[0-9]+)*(?:[eE][-+][0-9]+)?
    |[-+]?[0-9]+(?:_[0-9]+)*(?::[0-5]?[0-9])+\.[0-9_]*
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""", re.X)  # OmegaConf's: YAML 1.1's float, plus 1e-3 without a dot


class _Refused(Exception):
    """A limit the document broke: the reason, as the one line will say it."""


# The YAML types a config holds (what OmegaConf takes); another tag (!!set, !!binary, !!omap, ...) is refused
TAGS = frozenset(f"tag:yaml.org,2002:{name}" for name in ("str", "int", "float", "bool", "null", "map", "seq"))


class LimitedLoader(yaml.SafeLoader):
    """SafeLoader that refuses aliases, tags other than TAGS and nesting deeper than MAX_YAML_DEPTH while composing."""

    _depth = 0

    def compose_node(self, parent: Optional[yaml.Node], index: Any) -> Optional[yaml.Node]:
        if self.check_event(yaml.AliasEvent):
            raise _Refused("uses a YAML alias (*name), which is refused here (an alias can expand without bound): "
                           "write the value out")
        self._depth += 1
        try:
            if self._depth > MAX_YAML_DEPTH:
                raise _Refused(f"nests deeper than {MAX_YAML_DEPTH} levels, the limit: flatten it")
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        if node is not None and node.tag not in TAGS:
            tag = node.tag.replace("tag:yaml.org,2002:", "!!")
            raise _Refused(f"uses the YAML tag {tag} (line {node.start_mark.line + 1}), which is refused here: "
                           "write a plain value, a list [a, b] or a mapping {k: v}")
        return node

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> Any:
        seen = set()
        for key_node, _ in node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
            if key is not None and key in seen:
                raise _Refused(f"repeats the key '{key}' (line {key_node.start_mark.line + 1}): keep one")
            seen.add(key)
        return super().construct_mapping(node, deep)


LimitedLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers
            if tag not in ("tag:yaml.org,2002:timestamp", "tag:yaml.org,2002:float")]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
LimitedLoader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT, list("-+0123456789."))


def load_yaml(text: str, where: str, fix: Optional[str] = "fix the file") -> Any:
    """text -> its value, or ConfigError naming the limit it broke or the YAML error (where: how to name it).

    fix=None: only the limits are checked here; a YAML error returns None, left to the loader that reads the
    text next (OmegaConf's libyaml one, for an override's value: it takes a tab this one refuses)."""
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_YAML_BYTES:
        raise ConfigError(f"{where} is {size} bytes, over the limit of {MAX_YAML_BYTES} for a config: "
                          "keep only key: value lines that differ from the defaults")
    try:
        return yaml.load(text, Loader=LimitedLoader)  # noqa: S506  (a SafeLoader)
    except _Refused as e:
        raise ConfigError(f"{where} {e}") from e
    except ValueError as e:  # int() refuses more than 4,300 digits
        raise ConfigError(f"{where} holds a number too long to read ({len(text)} characters): "
                          "no setting takes a number that large; give a smaller one") from e
    except yaml.YAMLError as e:
        if fix is None:
            return None
        first = first_line(e) or e.__class__.__name__
        raise ConfigError(f"{where} is not valid YAML ({first}): {fix}") from e


class _Dumper(yaml.SafeDumper):
    """Quotes a string wherever LimitedLoader would read it back as something else ('1e-3', 'true'); pure
    Python, so a non-UTF-8 script argument (a surrogate escape) is written as "\\uDCFF" instead of failing."""


_Dumper.yaml_implicit_resolvers = LimitedLoader.yaml_implicit_resolvers


def dump_yaml(data: Any) -> str:
    """Plain data -> YAML text that load_yaml reads back to the same data, key order kept."""
    return yaml.dump(data, Dumper=_Dumper, default_flow_style=False, allow_unicode=True, sort_keys=False)
