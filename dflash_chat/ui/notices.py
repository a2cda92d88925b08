"""Notifications as plain text.

What the app says often holds text it does not control: paths, model names, error messages. Read as
Textual markup, '[/x]' in a folder name fails at paint time and '[@click=...]' runs an action, so
every screen of the app shows its notices as plain text.
"""

from __future__ import annotations

from textual.notifications import SeverityLevel


class PlainNotices:
    """Mixin for a Screen: `notify` without markup."""

    def notify(
        self,
        message: str,
        *,
        title: str = "",
        severity: SeverityLevel = "information",
        timeout: float | None = None,
        markup: bool = False,
    ) -> None:
        super().notify(message, title=title, severity=severity, timeout=timeout, markup=markup)
