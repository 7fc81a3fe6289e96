"""The wizard's list-valued fields (env vars, tags, mounts): numbered rows of inputs, or JSON.

See jobs/forms.py: rows whose inputs are all empty are skipped, so a template can always
render one blank row; the model checks the shape, as for the API.
"""

from __future__ import annotations

import json

from django import forms
from django.core.exceptions import ValidationError
from django.utils.html import format_html, format_html_join
from django.utils.text import format_lazy
from django.utils.translation import gettext, pgettext_lazy
from django.utils.translation import gettext_lazy as _

TRUE_STRINGS = {"on", "true", "1", "yes"}
ROWS_HINT = _("Clear a row to remove it.")


COLUMN_LABELS = {
    "name": pgettext_lazy("column", "Name"),
    "value": pgettext_lazy("column", "Value"),
    "sensitive": pgettext_lazy("column", "Sensitive"),
    "key": pgettext_lazy("column", "Key"),
    "file_system": pgettext_lazy("column", "File system"),
    "path": pgettext_lazy("column", "Path in it"),
    "mount_path": pgettext_lazy("column", "Mount path"),
    "read_only": pgettext_lazy("column", "Read-only"),
    "options": pgettext_lazy("column", "NFS options"),
    "obs_url": pgettext_lazy("column", "obs:// URL"),
}


class RowsWidget(forms.Widget):
    """Numbered rows of inputs (`<name>-<i>-<column>`), or JSON posted in `<name>` itself."""

    def __init__(self, columns: dict[str, type], attrs=None):
        super().__init__(attrs)
        self.columns = columns

    def _row_keys(self, data, name: str) -> dict[int, dict]:
        rows: dict[int, dict] = {}
        prefix = f"{name}-"
        for key in data:
            if not key.startswith(prefix):
                continue
            index, _, column = key[len(prefix) :].partition("-")
            if index.isdigit() and column in self.columns:
                rows.setdefault(int(index), {})[column] = data.get(key)
        return rows

    def value_from_datadict(self, data, files, name):
        raw = data.get(name)
        if raw not in (None, ""):
            return raw
        rows = self._row_keys(data, name)
        return [rows[i] for i in sorted(rows)] if rows else None

    def value_omitted_from_data(self, data, files, name) -> bool:
        return name not in data and not self._row_keys(data, name)

    def render(self, name, value, attrs=None, renderer=None):
        rows = value if isinstance(value, list) else []
        # Rows the user left empty are dropped (that is how a row is removed), and one blank
        # row is added to type into.
        rows = [r for r in rows if isinstance(r, dict) and any(val not in ("", None, False) for val in r.values())]
        rows.append({})

        def cell(index: int, column: str, kind: type, row: dict):
            field = f"{name}-{index}-{column}"
            if kind is bool:
                checked = " checked" if row.get(column) in (True, "on", "true") else ""
                return format_html(
                    '<td><input type="checkbox" name="{}" aria-label="{}"{}></td>', field, label(column), checked
                )
            text = "" if row.get(column) is None else str(row.get(column))
            return format_html(
                '<td><input type="text" name="{}" value="{}" aria-label="{}"></td>', field, text, label(column)
            )

        def label(column: str) -> str:
            return COLUMN_LABELS.get(column, column.replace("_", " "))

        head = format_html_join("", "<th>{}</th>", ((label(c),) for c in self.columns))
        body = format_html_join(
            "",
            "<tr>{}</tr>",
            (
                (format_html_join("", "{}", ((cell(i, c, k, row),) for c, k in self.columns.items())),)
                for i, row in enumerate(rows)
            ),
        )
        return format_html('<table class="rows" id="rows-{}"><tr>{}</tr>{}</table>', name, head, body)


class RowsField(forms.Field):
    """A list of objects with the given columns (str, bool or int values)."""

    def __init__(self, columns: dict[str, type], **kwargs):
        self.columns = columns
        # How the row editor removes a row: a hint for the page only, so not in the model's help text.
        if kwargs.get("help_text"):
            kwargs["help_text"] = format_lazy("{} {}", kwargs["help_text"], ROWS_HINT)
        kwargs.setdefault("required", False)
        kwargs.setdefault("widget", RowsWidget(columns))
        super().__init__(**kwargs)

    def to_python(self, value):
        if value in (None, "", []):
            return []
        if isinstance(value, str):
            try:
                parsed = json.loads(value)
            except ValueError:
                message = gettext("%(label)s: expected a JSON list of objects.") % {"label": self.label}
                raise ValidationError(message) from None
            return parsed  # the model checks the shape, as for the API
        rows = []
        for raw in value:
            row = {}
            for column, kind in self.columns.items():
                item = raw.get(column)
                if kind is bool:
                    row[column] = str(item).strip().lower() in TRUE_STRINGS if item is not None else False
                elif kind is int:
                    text = "" if item is None else str(item).strip()
                    row[column] = int(text) if text.lstrip("-").isdigit() else text
                else:
                    row[column] = "" if item is None else str(item)
            if all(row[c] in ("", False) for c in self.columns):
                continue
            rows.append(row)
        return rows
