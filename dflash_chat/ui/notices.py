"""Notifications as plain text.

What the app says often holds text it does not control: paths, model names, error messages. Read as
Textual markup, '[/x]' in a folder name fails at paint time and '[@click=...]' runs an action, so
every screen of the app shows its notices as plain text.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from textual.notifications import SeverityLevel

if TYPE_CHECKING:
    from textual.widget import Widget

    _NoticeBase = Widget  # what the mixin's super().notify reaches: the Screen it is mixed into
else:
    _NoticeBase = object


class PlainNotices(_NoticeBase):
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
