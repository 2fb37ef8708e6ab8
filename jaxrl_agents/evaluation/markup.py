"""The report page's building blocks: its stylesheet and small HTML helpers (escaping, numbers,
tables, embedded PNGs, coloured deltas). No script, no external resources."""

from __future__ import annotations

import base64
import html
from collections.abc import Sequence
from typing import Any

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:24px auto;max-width:1200px;
color:#222;line-height:1.35;padding:0 16px}
h1{font-size:1.5em}h2{border-bottom:1px solid #ddd;padding-bottom:4px;margin-top:32px}
table{border-collapse:collapse;margin:8px 0 16px;font-size:.9em}
th,td{border:1px solid #ccc;padding:4px 8px;text-align:right;vertical-align:top}
th{background:#f3f3f3}td.l,th.l{text-align:left}
tr.best td{background:#fff6d5;font-weight:600}
.pos{color:#0a7d32}.neg{color:#b3261e}.muted{color:#777}
img{max-width:100%;border:1px solid #eee;margin:6px 0}
details{border:1px solid #ddd;border-radius:4px;margin:6px 0;padding:4px 8px}
details>summary{cursor:pointer}
.ok{color:#0a7d32;font-weight:600}.fail{color:#b3261e;font-weight:600}
.msg{margin:4px 0;padding:4px 8px;border-left:4px solid #bbb;white-space:pre-wrap;
font-family:ui-monospace,Menlo,Consolas,monospace;font-size:.85em;overflow-wrap:anywhere}
.role-system{border-color:#999;background:#fafafa}.role-user{border-color:#1f6feb}
.role-assistant{border-color:#8250df}.role-tool{border-color:#bf8700;background:#fffbea}
.tool-call{display:block;background:#efe6ff;border:1px solid #c9b3ff;border-radius:3px;
padding:2px 6px;margin:3px 0}
.tool-error{background:#ffe9e7;border-color:#b3261e}
.ann{font-size:.8em;color:#555;font-family:ui-monospace,Menlo,monospace}
.tag{display:inline-block;background:#eee;border-radius:3px;padding:0 5px;margin:0 2px;
font-size:.8em}.tag.bad{background:#ffe1de;color:#8a1c14}
.side{display:grid;grid-template-columns:1fr 1fr;gap:12px}
"""


def esc(x: Any) -> str:
    return html.escape(str(x), quote=True)


def fmt_num(x: Any, digits: int = 3) -> str:
    if isinstance(x, bool) or x is None:
        return esc(x)
    if isinstance(x, float):
        return f"{x:.{digits}f}"
    return esc(x)


def html_table(
    header: Sequence[str],
    rows: Sequence[Sequence[Any]],
    *,
    left: int = 1,
    row_class: Sequence[str] | None = None,
) -> str:
    """``left``: number of leading text columns (left-aligned); cells are escaped unless they are
    already markup (``Raw``)."""

    def cell(tag: str, i: int, v: Any) -> str:
        cls = ' class="l"' if i < left else ""
        body = v.html if isinstance(v, Raw) else fmt_num(v)
        return f"<{tag}{cls}>{body}</{tag}>"

    head = "".join(cell("th", i, h) for i, h in enumerate(header))
    body = []
    for r, row in enumerate(rows):
        cls = f' class="{row_class[r]}"' if row_class and row_class[r] else ""
        body.append(f"<tr{cls}>" + "".join(cell("td", i, v) for i, v in enumerate(row)) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


class Raw:
    """Markup :func:`html_table` puts in a cell as it is (other cells are escaped)."""

    def __init__(self, html_text: str):
        self.html = html_text


def img_png(png: bytes, alt: str) -> str:
    data = base64.b64encode(png).decode("ascii")
    return f'<img alt="{esc(alt)}" src="data:image/png;base64,{data}">'


def delta(d: float | int, *, lower_is_better: bool = True) -> Raw:
    if d == 0:
        return Raw('<span class="muted">0</span>')
    good = (d < 0) == lower_is_better
    text = f"{d:+.3f}" if isinstance(d, float) else f"{d:+d}"
    return Raw(f'<span class="{"pos" if good else "neg"}">{text}</span>')
