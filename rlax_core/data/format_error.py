"""``FormatError``: why a raw record cannot become an Example (its dead-letter reason), shared by the
adapters of ``formats`` and ``sql_format`` (which ``formats`` calls), so neither imports the other back."""


class FormatError(ValueError):
    """A raw record cannot become an Example; ``reason`` is its dead-letter category."""

    def __init__(self, reason: str, detail: str):
        self.reason = reason
        self.detail = detail
        super().__init__(f"{reason}: {detail}")
