"""Draw a ``ReportData`` as one self-contained HTML page.

The page works with no network: plotly.js comes inline from the installed plotly package, the
run's data is embedded as JSON, and a few lines of hand-written JS in the template draw the charts.
Everything shown is read from ``ReportData``; a missing value is shown as "—", never guessed.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import jinja2
from markupsafe import Markup

from iomatrix.report.data import ConfigView, PointView, ReportData
from iomatrix.units import format_size

MISSING = "—"
TEMPLATE = "report.html.j2"
_TEMPLATES = Path(__file__).parent / "templates"


@dataclass(frozen=True)
class ChartGroup:
    """Points that share one chart: same rw, bs, numjobs and rate limit; x is iodepth."""

    rw: str
    bs: int
    numjobs: int
    rate_iops: int | None

    @property
    def title(self) -> str:
        jobs = "1 job" if self.numjobs == 1 else f"{self.numjobs} jobs"
        parts = [self.rw, format_size(self.bs), jobs]
        if self.rate_iops is not None:
            parts.append(f"rate {self.rate_iops:,} IOPS")
        return " · ".join(parts)

    @property
    def slug(self) -> str:
        slug = f"{self.rw}-{format_size(self.bs)}-j{self.numjobs}"
        return slug if self.rate_iops is None else f"{slug}-r{self.rate_iops}"


def chart_groups(points: tuple[PointView, ...] | list[PointView]) -> list[ChartGroup]:
    """One group per (rw, bs, numjobs, rate_iops): rw in order of first appearance, then ascending."""
    rw_order: dict[str, int] = {}
    groups: set[ChartGroup] = set()
    for p in points:
        rw_order.setdefault(p.rw, len(rw_order))
        groups.add(ChartGroup(p.rw, p.bs, p.numjobs, p.rate_iops))
    return sorted(
        groups,
        key=lambda g: (rw_order[g.rw], g.bs, g.numjobs, -1 if g.rate_iops is None else g.rate_iops),
    )


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


def fmt_us(ns: float | None) -> str:
    """Nanoseconds as microseconds with one decimal: 123456 -> '123.5'."""
    v = _num(ns)
    return MISSING if v is None else f"{v / 1000:,.1f}"


def fmt_mib(bytes_per_s: float | None) -> str:
    """Bytes/s as MiB/s with one decimal."""
    v = _num(bytes_per_s)
    return MISSING if v is None else f"{v / 2**20:,.1f}"


def fmt_pct(value: float | None) -> str:
    v = _num(value)
    return MISSING if v is None else f"{v:.1f}"


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


def data_json(data: ReportData) -> str:
    """The run as JSON for a ``<script type="application/json">`` element.

    ``<``, ``>`` and ``&`` are written as ``\\u003c``/``\\u003e``/``\\u0026`` (valid JSON escapes), so
    no string in the data can close the element; ``JSON.parse`` and ``json.loads`` read it back as is.
    """
    text = json.dumps(data.model_dump(mode="json"), ensure_ascii=False, separators=(",", ":"))
    return (
        text.replace("<", "\\u003c")
        .replace(">", "\\u003e")
        .replace("&", "\\u0026")
        .replace("\u2028", "\\u2028")
        .replace("\u2029", "\\u2029")
    )


@lru_cache(maxsize=1)
def plotly_js() -> str:
    """plotly.js from the installed plotly package, safe to inline in a <script> element."""
    from plotly.offline import get_plotlyjs

    return _script_safe(get_plotlyjs())


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
    env.filters.update(
        num0=fmt_int, us=fmt_us, mib=fmt_mib, pct=fmt_pct, text=fmt_text, size=format_size
    )
    return env


def _point_rows(data: ReportData) -> list[PointView]:
    """Points grouped like the charts, then by iodepth, then in configuration order."""
    config_order = {c.key: i for i, c in enumerate(data.configs)}
    group_order = {g: i for i, g in enumerate(chart_groups(data.points))}
    return sorted(
        data.points,
        key=lambda p: (
            group_order[ChartGroup(p.rw, p.bs, p.numjobs, p.rate_iops)],
            p.iodepth,
            config_order.get(p.config_key, len(config_order)),
            p.config_key,
        ),
    )


def _param_names(configs: tuple[ConfigView, ...]) -> list[str]:
    names: dict[str, None] = {}
    for c in configs:
        names.update(dict.fromkeys(c.params))
    return list(names)


def render_html(data: ReportData) -> str:
    """The whole report as one HTML document (no external resources)."""
    labels = {c.key: c.label for c in data.configs}
    modes = {c.key: c.mode for c in data.configs}
    return _environment().get_template(TEMPLATE).render(
        data=data,
        labels=labels,
        modes=modes,
        groups=chart_groups(data.points),
        rows=_point_rows(data),
        show_rate=any(p.rate_iops is not None for p in data.points),
        param_names=_param_names(data.configs),
        data_json=Markup(data_json(data)),
        plotly_js=Markup(plotly_js()),
        missing=MISSING,
    )


def write_report(data: ReportData, out_dir: Path) -> Path:
    """Write ``out_dir/index.html`` (creating ``out_dir``) and return its path."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "index.html"
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(render_html(data), encoding="utf-8")
    tmp.replace(path)
    return path
