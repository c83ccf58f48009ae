"""The report files of a run: ``report.json``, ``report.md`` and ``report.html``.

`routetune.reporting.report` gathers a run's data from its trial store and ``run.json``;
this module renders it in each format (`routetune.reporting.report_text`,
`routetune.reporting.report_html`) and writes the three files.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from routetune.errors import UsageError
from routetune.records import run_record
from routetune.records.run_record import refuse_links
from routetune.reporting.report import UNREADABLE, build_report, store_dir, unreadable_record
from routetune.reporting.report_html import render_html
from routetune.reporting.report_text import render_markdown


def write_reports(outdir: Path, dest: Path | None = None) -> dict[str, Path]:
    """Write ``report.json``, ``report.md`` and ``report.html`` of the run in `outdir`.

    Args:
        outdir: The run's output directory, or a dated record folder in it
            (``OUTDIR/runs/<time>/``, whose ``run.json`` is read).
        dest: Where to write them; default `outdir`.

    Returns:
        The paths, by format.

    Raises:
        UsageError: `outdir` holds no trial store.
    """
    refuse_links(outdir, label="")  # report writes report.* and SQLite's -wal/-shm files there
    data = build_report(store_dir(outdir), outdir)
    try:  # every report rendered before any is written
        texts = {"md": render_markdown(data), "html": render_html(data),
                 "json": json.dumps(data, indent=1, default=str) + "\n"}
    except UNREADABLE as e:  # the trials are checked as they are read (routetune.records.store)
        raise unreadable_record(outdir, e) from e
    dest = dest or outdir
    try:
        dest.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"{dest}: cannot create the folder for the reports ({e.strerror})"
                         ) from e
    if not os.access(dest, os.W_OK):
        raise UsageError(f"{dest}: a read-only folder; the reports (report.json, report.md, "
                         f"report.html) are written there: make it writable (chmod u+w "
                         f"{dest}), or copy the folder and report the copy")
    paths = {"json": dest / "report.json", "md": dest / "report.md",
             "html": dest / "report.html"}
    for kind, path in paths.items():
        run_record.replace_text(path, texts[kind])  # a planted link is replaced, not followed
    return paths
