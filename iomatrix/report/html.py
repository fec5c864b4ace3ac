"""Draw a ``ReportData`` as one self-contained HTML page.

The page works with no network: plotly.js (from the installed plotly package) and the run's
data (JSON) are embedded gzip-compressed and base85-encoded, and the page's script decompresses
them in the browser (``DecompressionStream``) before it draws: a 10,000-point run's page is half
the size it would be inline. The raw samples are embedded the same way as CSV (decompressed when
asked to download them), and ``templates/report.js`` builds the charts and the paged tables. Charts are drawn nearest-the-viewport first, one per task, so the page is usable
while the rest are drawn; ``<html data-charts>`` says "drawing" until every chart is drawn, then
"ready". Everything shown is read from ``ReportData``; a missing value is shown as "—", never
guessed.
"""

from __future__ import annotations

import base64
import csv
import gzip
import io
import json
import math
import re
from functools import lru_cache
from pathlib import Path

import jinja2
from markupsafe import Markup

from iomatrix.analysis.metrics import METRICS, MISSING, RunLatency
from iomatrix.analysis.scaling import SATURATION_RULE
from iomatrix.core.files import output_directory, write_file_atomically
from iomatrix.report.data import PointView, ReportData
from iomatrix.report.levers import LEVERS

TEMPLATE = "report.html.j2"
_TEMPLATES = Path(__file__).parent / "templates"
SIGNIFICANT = 6
"""Significant digits of the floats in the page's JSON."""
COLOR_BY_CONFIG_MAX = 12
"""Up to this many configurations, every chart gives each its own colour; above it, lines are
coloured by the first axis of the matrix (the reader can switch)."""


# --- number formatting: None, NaN and infinities are "not in the data" ----------------------------


def _num(value: float | None) -> float | None:
    if value is None or isinstance(value, bool):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def fmt_int(value: float | None) -> str:
    """12345.6 -> '12,346'."""
    v = _num(value)
    return MISSING if v is None else f"{v:,.0f}"


def fmt_decimals(digits: int):  # type: ignore[no-untyped-def]
    def fmt(value: float | None) -> str:
        v = _num(value)
        return MISSING if v is None else f"{v:,.{digits}f}"
    return fmt


def fmt_figure(value: float | None, figure: str) -> str:
    """A figure (a key of ``METRICS``) in the unit the page shows it in."""
    return METRICS[figure].text(_num(value), unit=True)


def fmt_text(value: object) -> str:
    return MISSING if value is None or value == "" else str(value)


# --- page ------------------------------------------------------------------------------------------


_SCRIPT_END = re.compile(r"<(/script|!--)", re.IGNORECASE)


def _script_safe(js: str) -> str:
    """JS code that can sit inside <script>…</script> without ending it early.

    Only "</script" and "<!--" matter to the HTML parser; in JS they can only occur inside strings,
    regular expressions or comments, where "<\\/script" and "<\\!--" mean the same thing.
    """
    return _SCRIPT_END.sub(lambda m: "<\\" + m.group(1), js)


def rounded(value: object) -> object:
    """``value`` with its floats rounded to ``SIGNIFICANT`` digits, in nested lists (tuples become
    lists) and dicts too (what ``data_json`` writes)."""
    if isinstance(value, float):
        return float(f"{value:.{SIGNIFICANT}g}") if math.isfinite(value) else None
    if isinstance(value, (list, tuple)):
        return [rounded(v) for v in value]
    if isinstance(value, dict):
        return {k: rounded(v) for k, v in value.items()}
    return value


def data_json(data: ReportData) -> str:
    """The run as JSON for the page (the raw CSV is left out: it has an element of its own),
    which embeds it ``packed``.

    The points, the bulk of a large run, are a table: ``{"columns": [field, ...], "rows":
    [[value, ...], ...]}`` with null for a field at its default, which ``read_data_json`` and
    the page turn back into points. Fields at their default elsewhere are left out, and floats
    carry ``SIGNIFICANT`` digits (the page shows at most four; the CSV keeps every digit): a
    10,000-point run parses three times faster.

    ``<``, ``>`` and ``&`` are written as ``\\u003c``/``\\u003e``/``\\u0026`` (valid JSON escapes), so
    no string in the data can close the element; ``JSON.parse`` and ``json.loads`` read it back as is.
    """
    dumped = rounded(data.model_dump(mode="json", exclude={"samples_csv", "points"},
                                     exclude_defaults=True))
    columns = list(PointView.model_fields)
    defaults = [PointView.model_fields[name].get_default() for name in columns]
    rows = []
    for point in data.points:   # its fields are numbers, strings, tuples and dicts of them
        row = point.__dict__
        rows.append([None if (v := row[c]) == d else rounded(v)
                     for c, d in zip(columns, defaults, strict=True)])
    dumped["points"] = {"columns": columns, "rows": rows}   # rounded once, above
    return _script_json(dumped)


def _script_json(value: object) -> str:
    """``value`` as JSON that no string in it can end a <script> element with (see ``data_json``)."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return (
        text.replace("<", "\\u003c")
        .replace(">", "\\u003e")
        .replace("&", "\\u0026")
        .replace("\u2028", "\\u2028")
        .replace("\u2029", "\\u2029")
    )


def metrics_json(latency: RunLatency | None = None) -> str:
    """The metrics for the page's script (``report.js``): each field of ``Metric``, its heading
    and axis title naming the fio latency the run's figures are of (``latency``; fio's total
    latency when not given), in the order charts show them."""
    latency = latency or RunLatency(mean="lat", percentiles="lat")
    return _script_json([{**m.model_dump(), "heading": m.heading_for(latency),
                          "axis": m.axis_for(latency)} for m in METRICS.values()])


def read_data_json(text: str) -> ReportData:
    """``data_json``'s text back as a ReportData (floats rounded, the CSV left empty)."""
    raw = json.loads(text)
    table = raw.pop("points")
    raw["points"] = [{c: v for c, v in zip(table["columns"], row, strict=True) if v is not None}
                     for row in table["rows"]]
    return ReportData.model_validate(raw)


_B85_DIGITS = (b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
               b"!#$%&()*+-;.=>?@^_`{|}~")
"""RFC 1924's base85 digits, "." in place of "<" (see ``packed``)."""


def packed(text: str) -> str:
    """``text`` gzip-compressed and base85-encoded (RFC 1924's alphabet, Python's ``b85encode``,
    with "." for "<"), for a ``data-encoding="gzip+base85"`` element: 5 characters per 4 bytes
    where base64 takes 5⅓ (a 10,000-point page is a quarter MiB smaller), and with no "<" it
    cannot end a <script> element nor open "<!--" in it."""
    import numpy as np

    # level 5: a 10,000-point page's three blobs compress in 0.3 s where 6 (and 9 for plotly.js)
    # took 0.45, for 1 % more bytes
    compressed = gzip.compress(text.encode("utf-8"), compresslevel=5, mtime=0)
    # what base64.b85encode(...).replace("<", ".") writes, column-wise: 4.6 MiB of plotly.js
    # in 20 ms where b85encode takes 400
    cut = -len(compressed) % 4        # the zero bytes that complete the last group
    words = np.frombuffer(compressed + bytes(cut), dtype=">u4").astype(np.uint64)
    digits = np.empty((len(words), 5), dtype=np.uint8)
    for i in range(4, -1, -1):
        words, digits[:, i] = np.divmod(words, 85)
    encoded = np.frombuffer(_B85_DIGITS, dtype=np.uint8)[digits].tobytes()
    return encoded[:len(encoded) - cut].decode("ascii")


def unpacked(blob: str) -> str:
    """``packed``'s text back."""
    return gzip.decompress(base64.b85decode(blob.replace(".", "<"))).decode("utf-8")


@lru_cache(maxsize=1)
def plotly_js() -> str:
    """plotly.js from the installed plotly package, ``packed`` (once per process: 4.6 MiB)."""
    from plotly.offline import get_plotlyjs

    return packed(get_plotlyjs())


@lru_cache(maxsize=8)
def _asset(name: str) -> str:
    return (_TEMPLATES / name).read_text(encoding="utf-8")


@lru_cache(maxsize=1)
def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(_TEMPLATES),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters.update(num0=fmt_int, g=lambda v: f"{v:g}", dec2=fmt_decimals(2),
                       dec3=fmt_decimals(3), text=fmt_text, figure=fmt_figure)
    return env


def _param_names(data: ReportData) -> list[str]:
    names: dict[str, None] = {}
    for c in data.configs:
        names.update(dict.fromkeys(c.params))
    return list(names)


def _gain_charts(data: ReportData) -> list[dict[str, object]]:
    """One chart per (axis, held axes); the page switches its metric."""
    seen: dict[tuple[str, tuple[str, ...]], None] = {}
    for s in data.gains:
        seen.setdefault((s.axis, s.hold), None)
    return [{"axis": axis, "hold": hold} for axis, hold in seen]


def _color_by(data: ReportData) -> str:
    if len(data.configs) <= COLOR_BY_CONFIG_MAX or not data.axes:
        return "configuration"
    return next((axis for axis in data.axes if axis != "mode"), "mode")


def render_html(data: ReportData) -> str:
    """The whole report as one HTML document (no external resources)."""
    # a failure's reason may hold a line break (quoted in the CSV): only without quotes and
    # carriage returns is every line a row, and a line count the cheap answer
    text = data.samples_csv
    plain = '"' not in text and "\r" not in text
    rows = text.count("\n") if plain else sum(1 for _ in csv.reader(io.StringIO(text)))
    csv_rows = max(0, rows - 1)
    return _environment().get_template(TEMPLATE).render(
        data=data,
        param_names=_param_names(data),
        color_by=_color_by(data),
        gain_charts=_gain_charts(data),
        gain_metrics=list(dict.fromkeys(s.metric for s in data.gains)),
        metrics=METRICS,
        metrics_json=Markup(metrics_json(RunLatency(mean=data.latency_mean,  # type: ignore[arg-type]
                                                    percentiles=data.latency_percentiles))),
        has_cpu=any(p.cpu_us_per_io is not None for p in data.points),
        has_bare=any(p.iops_pct is not None for p in data.points),
        has_scaling=any(c.family is not None for c in data.configs),
        scaling_rule=SATURATION_RULE,
        levers={lever: title for lever, title in LEVERS.items()
                if any(lever in c.levers for c in data.configs)},
        csv_rows=csv_rows,
        csv_blob=Markup(packed(data.samples_csv)) if csv_rows else "",
        data_json=Markup(packed(data_json(data))),
        css=Markup(_asset("report.css")),
        report_js=Markup(_script_safe(_asset("report.js"))),
        unpack_js=Markup(_script_safe(_asset("unpack.js"))),
        plotly_js=Markup(plotly_js()),
        missing=MISSING,
    )


def write_report(data: ReportData, out_dir: Path) -> Path:
    """Write ``out_dir/index.html`` (creating ``out_dir``) and return its path."""
    path = output_directory(Path(out_dir)) / "index.html"
    write_file_atomically(path, render_html(data))
    return path
