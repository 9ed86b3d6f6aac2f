"""YAML written by someone who is not trusted with the server's memory: an import file, an
image's cloud-config.

Contract: ``load(text)`` is ``yaml.safe_load`` (the C loader where PyYAML has it) that refuses
the first alias (``*name``) with ``AliasError`` before anything is built. A few hundred bytes of
anchors nesting nine aliases each stand for billions of values once walked or written out again;
none of these documents needs them. Invalid YAML raises ``yaml.YAMLError`` as usual.
"""

import yaml

LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class AliasError(yaml.YAMLError):
    """The document refers to an anchor; ``line`` (1-based) and ``anchor`` say where and which."""

    def __init__(self, line, anchor):
        super().__init__(f"line {line}: the YAML refers to anchor {anchor} (*{anchor})")
        self.line, self.anchor = line, anchor


def refuse_aliases(text):
    """``AliasError`` at the first alias, read from the parser's events."""
    for event in yaml.parse(text, Loader=LOADER):
        if isinstance(event, yaml.AliasEvent):
            raise AliasError(event.start_mark.line + 1, event.anchor)


def load(text):
    refuse_aliases(text)
    return yaml.load(text, Loader=LOADER)  # noqa: S506 (a safe loader)
