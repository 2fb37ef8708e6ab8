"""Open an evaluation report in headless Chromium, fail on console errors, save a screenshot.

    python scripts/screenshot_report.py eval/report.html --out eval/report.png
    python scripts/screenshot_report.py report.html --chromium /usr/bin/chromium --height 6000

Checks, each a non-zero exit with the reason on stderr:
* the report references nothing outside itself (every ``src``/``href`` is a ``data:`` URI or an
  in-page anchor; a report is meant to be mailed around);
* Chromium logs no console message for the page (the report has no script, so any message, e.g.
  an uncaught error or a blocked resource, is a defect);
* Chromium exits 0 and writes a PNG.

Chromium's own start-up noise (D-Bus, GPU) is ignored: only ``CONSOLE`` lines are the page's.
The screenshot is the top ``--width`` x ``--height`` pixels (the CLI has no full-page mode).
Needs a Chromium binary (``apt-get install chromium``); nothing is downloaded.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from html.parser import HTMLParser
from pathlib import Path

_CONSOLE = re.compile(r":CONSOLE[:(]\d*\)?\]\s*(.*)")
_CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


class _Refs(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.external: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for key, value in attrs:
            if key in ("src", "href") and value and not value.startswith(("data:", "#")):
                self.external.append(f"<{tag} {key}={value[:80]!r}>")


def external_references(html_text: str) -> list[str]:
    """Tags that load something from outside the file."""
    p = _Refs()
    p.feed(html_text)
    p.close()
    return p.external


def find_chromium(explicit: str | None) -> str | None:
    if explicit:
        return explicit if Path(explicit).exists() or shutil.which(explicit) else None
    return next((p for c in _CANDIDATES if (p := shutil.which(c))), None)


def screenshot(
    html_path: Path, out: Path, *, chromium: str, width: int, height: int, timeout: float
) -> list[str]:
    """Render ``html_path`` to ``out``; returns the page's console messages."""
    with tempfile.TemporaryDirectory(prefix="jaxrl-chromium-") as profile:
        cmd = [
            chromium,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--hide-scrollbars",
            "--no-first-run",
            "--disable-extensions",
            f"--user-data-dir={profile}",
            f"--window-size={width},{height}",
            "--enable-logging=stderr",
            "--v=0",
            f"--screenshot={out.resolve()}",
            html_path.resolve().as_uri(),
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    console = [m.group(1) for line in proc.stderr.splitlines() if (m := _CONSOLE.search(line))]
    if proc.returncode != 0:
        raise RuntimeError(f"chromium exited {proc.returncode}:\n{proc.stderr[-2000:]}")
    return console


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("report", type=Path, help="the report.html to open")
    ap.add_argument("--out", type=Path, help="PNG path (default: next to the report)")
    ap.add_argument("--chromium", help="browser binary (default: chromium on PATH)")
    ap.add_argument("--width", type=int, default=1280)
    ap.add_argument("--height", type=int, default=3000)
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds before giving up")
    args = ap.parse_args(argv)

    if not args.report.is_file():
        print(f"error: {args.report} is not a file", file=sys.stderr)
        return 2
    browser = find_chromium(args.chromium)
    if browser is None:
        print(
            f"error: no Chromium found ({args.chromium or ', '.join(_CANDIDATES)}); "
            "install it (apt-get install chromium) or pass --chromium",
            file=sys.stderr,
        )
        return 3
    external = external_references(args.report.read_text(encoding="utf-8"))
    if external:
        print(f"error: report is not self-contained: {external[:5]}", file=sys.stderr)
        return 1
    out = args.out or args.report.with_suffix(".png")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.unlink(missing_ok=True)
    try:
        console = screenshot(
            args.report,
            out,
            chromium=browser,
            width=args.width,
            height=args.height,
            timeout=args.timeout,
        )
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if console:
        print("error: console messages:\n  " + "\n  ".join(console), file=sys.stderr)
        return 1
    if not out.is_file() or out.read_bytes()[:8] != b"\x89PNG\r\n\x1a\n":
        print(f"error: chromium wrote no PNG at {out}", file=sys.stderr)
        return 1
    print(f"ok: no console errors; screenshot {out} ({out.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
