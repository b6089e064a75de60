"""Why a candidate site is left alone."""

from __future__ import annotations


class Rejected(Exception):
    """A site that is not (provably) what its pattern fuses; the message is the reason shown to the user.

    ``kind`` is set when the site turned out to be something else than the pattern's kind of site (an attention
    layer, another softmax), so the report does not count it as a site the pattern failed to fuse; ``sources`` is
    how many sources a matched site had, when the report can say it."""

    def __init__(self, reason: str, *, kind: str | None = None, sources: int | None = None) -> None:
        super().__init__(reason)
        self.kind = kind
        self.sources = sources

    @property
    def reason(self) -> str:
        return str(self)
