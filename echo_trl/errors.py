"""Errors a user can act on.

Every bad-input error names *where* (file and record) and *what* (field path), because
episode data comes from many harnesses and a user must be able to find the one bad record
among thousands without reading a traceback.
"""

from __future__ import annotations


class EchoTrlError(Exception):
    """Base class for errors caused by the user's input or settings (CLI exit code 2)."""


class EpisodeError(EchoTrlError):
    """A recorded episode that cannot become a trajectory.

    Rendered as ``source:record: field: message``, e.g.
    ``episodes.jsonl:17: steps[3].action.tool_name: expected a string, got null``.
    """

    def __init__(
        self, message: str, *, source: str = "<episode>", record: str | None = None, field: str | None = None
    ):
        self.message = message
        self.source = source
        self.record = record
        self.field = field
        super().__init__(self.location() + message)

    def location(self) -> str:
        where = self.source if self.record is None else f"{self.source}:{self.record}"
        return f"{where}: {self.field}: " if self.field else f"{where}: "

    def at(self, *, source: str | None = None, record: str | None = None) -> EpisodeError:
        """The same error, placed in a file/record (readers know where, converters know what)."""
        return EpisodeError(
            self.message,
            source=source or self.source,
            record=record if record is not None else self.record,
            field=self.field,
        )


class TemplateError(EchoTrlError):
    """A tokenizer / chat template that cannot render or align a conversation."""


class DatasetSchemaError(EchoTrlError):
    """A dataset whose columns or feature types are not the ECHO trajectory schema."""
