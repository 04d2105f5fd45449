"""The audit report: one self-contained HTML page (charts as base64 PNGs) rendered from an audit summary.

    from openroute.spark.report import render_report, chart_png

    html = render_report(result.summary())          # what AuditResult.write saves as report.html
    png = chart_png(result.summary(), "state_counts")  # one chart alone, as PNG bytes
"""

from __future__ import annotations

import base64
import html
import io
from collections import defaultdict
from collections.abc import Callable
from typing import Any

#: the charts of the report, in order: name -> title
CHARTS: dict[str, str] = {
    "state_counts": "Messages per state and day of receipt",
    "latency": "Time to final state per route (seconds)",
    "attempts": "Attempts of final messages (whole history, restarts included)",
    "top_errors": "Top error codes (messages that met each, whole history)",
}

_STATE_COLOURS = {
    "OK": "#2e7d32", "FAILED": "#c62828", "SKIPPED": "#9e9e9e", "CANCEL": "#6d4c41", "NEW": "#1565c0",
    "PROCESSING": "#f9a825", "PARTLY_FAILED": "#ef6c00", "POSTPONED": "#8e24aa", "WAITING_FOR_CHILDREN": "#00838f",
}


def _figure() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    return plt.subplots(figsize=(8, 3.6), dpi=100)


def _state_counts(stats: dict[str, list[dict[str, Any]]], ax: Any) -> None:
    per_day: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for row in stats.get("state_counts", []):
        per_day[str(row["day"])][row["state"]] += int(row["count"])
    days = sorted(per_day)
    states = sorted({s for counts in per_day.values() for s in counts})
    bottom = [0] * len(days)
    for state in states:
        values = [per_day[d].get(state, 0) for d in days]
        ax.bar(days, values, bottom=bottom, label=state, color=_STATE_COLOURS.get(state))
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    ax.set_ylabel("messages")
    if states:
        ax.legend(fontsize=7, ncol=3)
    ax.tick_params(axis="x", labelrotation=30, labelsize=7)


def _latency(stats: dict[str, list[dict[str, Any]]], ax: Any) -> None:
    per_route: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for row in stats.get("latency", []):
        route = f"{row['service']}/{row['operation']}"
        for key in ("p50_s", "p95_s", "p99_s"):
            if row.get(key) is not None:
                per_route[route][key].append(float(row[key]))
    routes = sorted(per_route)
    width = 0.27
    for offset, key in enumerate(("p50_s", "p95_s", "p99_s")):
        # a route's worst day is what the operator looks at first
        values = [max(per_route[r][key], default=0.0) for r in routes]
        ax.bar([i + (offset - 1) * width for i in range(len(routes))], values, width, label=key[:-2])
    ax.set_xticks(range(len(routes)), routes, rotation=20, fontsize=7)
    ax.set_ylabel("seconds (worst day)")
    if routes:
        ax.legend(fontsize=7)


def _attempts(stats: dict[str, list[dict[str, Any]]], ax: Any) -> None:
    counts: dict[int, int] = defaultdict(int)
    for row in stats.get("attempts", []):
        counts[int(row["attempts"])] += int(row["count"])
    keys = sorted(counts)
    ax.bar([str(k) for k in keys], [counts[k] for k in keys], color="#1565c0")
    ax.set_xlabel("attempts")
    ax.set_ylabel("messages")


def _top_errors(stats: dict[str, list[dict[str, Any]]], ax: Any) -> None:
    counts: dict[str, int] = defaultdict(int)
    for row in stats.get("top_errors", []):  # the messages that met the code (older summaries: its count)
        counts[f"{row['code']} ({row['service']}/{row['operation']})"] += int(row.get("messages", row["count"]))
    for row in stats.get("business_errors", []):
        counts[f"business {row['code']} ({row['service']}/{row['operation']})"] += int(row["count"])
    worst = sorted(counts.items(), key=lambda item: (-item[1], item[0]))[:12][::-1]
    ax.barh([k for k, _ in worst], [v for _, v in worst], color="#c62828")
    ax.tick_params(axis="y", labelsize=7)
    ax.set_xlabel("messages")


_DRAW: dict[str, Callable[[dict[str, list[dict[str, Any]]], Any], None]] = {
    "state_counts": _state_counts, "latency": _latency, "attempts": _attempts, "top_errors": _top_errors,
}


def chart_png(summary: dict[str, Any], name: str) -> bytes:
    """The chart ``name`` (a key of :data:`CHARTS`) of an audit summary as PNG bytes; KeyError for another."""
    draw = _DRAW[name]
    from matplotlib import pyplot as plt

    fig, ax = _figure()
    try:
        draw(summary.get("statistics", {}), ax)
        ax.set_title(CHARTS[name], fontsize=10)
        fig.tight_layout()
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png")
        return buffer.getvalue()
    finally:
        plt.close(fig)


def _table(rows: list[dict[str, Any]], limit: int = 200) -> str:
    if not rows:
        return "<p><em>none</em></p>"
    columns = list(rows[0])
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(_cell(row.get(c)))}</td>" for c in columns) + "</tr>"
        for row in rows[:limit]
    )
    more = f"<p>{len(rows) - limit} more rows in the Parquet table.</p>" if len(rows) > limit else ""
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>{more}"


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)


_STYLE = """
body{font-family:sans-serif;margin:2em;color:#222}table{border-collapse:collapse;font-size:12px;margin:.5em 0 1.5em}
td,th{border:1px solid #ccc;padding:2px 6px;text-align:left}th{background:#f0f0f0}
.pass{color:#2e7d32;font-weight:bold}.fail{color:#c62828;font-weight:bold}img{max-width:100%}
"""

_SECTIONS = (
    ("state_counts", "Counts per state"),
    ("throughput_hourly", "Throughput per hour (messages reaching a final state)"),
    ("latency", "Time to final state"), ("time_in_state", "Time spent in each state"),
    ("attempts", "Attempts histogram"), ("top_errors", "Top error codes"), ("business_errors", "Business errors"),
    ("confirmations", "Confirmations: lag and failures"), ("funnel_postpones", "Funnel postpones"),
)


def render_report(summary: dict[str, Any]) -> str:
    """The HTML report of an audit ``summary`` (:meth:`AuditResult.summary`): checks first, then charts and tables.

    Self-contained: the charts are PNGs embedded as base64, no script, no external file.
    """
    stats = summary.get("statistics", {})
    verdict = '<span class="pass">PASSED</span>' if summary.get("passed") else '<span class="fail">FAILED</span>'
    check_rows = "".join(
        f"<tr><td>{html.escape(name)}</td>"
        f"<td class=\"{'pass' if c['passed'] else 'fail'}\">{'ok' if c['passed'] else 'FAIL'}</td>"
        f"<td>{c['count']}</td><td>{html.escape(c['description'])}</td>"
        f"<td>{html.escape(', '.join(str(i) for i in c['ids'][:50]))}{' ...' if c['count'] > 50 else ''}</td></tr>"
        for name, c in summary.get("checks", {}).items()
    )
    charts = "".join(
        f"<h3>{html.escape(title)}</h3><img alt=\"{html.escape(title)}\" "
        f"src=\"data:image/png;base64,{base64.b64encode(chart_png(summary, name)).decode()}\">"
        for name, title in CHARTS.items()
    )
    tables = "".join(f"<h2>{html.escape(title)}</h2>{_table(stats.get(name, []))}" for name, title in _SECTIONS)
    totals = summary.get("totals", {})
    settings = summary.get("settings", {})
    return (
        "<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>openroute audit</title>"
        f"<style>{_STYLE}</style></head><body>"
        f"<h1>openroute audit: {verdict}</h1>"
        f"<p>Store {html.escape(str(settings.get('url', '')))} at {html.escape(str(settings.get('now', '')))}: "
        f"{totals.get('messages', 0)} messages, {totals.get('transitions', 0)} transitions, "
        f"{totals.get('confirmations', 0)} confirmations, {totals.get('routes', 0)} routes.</p>"
        f"<h2>Consistency checks</h2><table><thead><tr><th>check</th><th>result</th><th>messages</th>"
        f"<th>what it finds</th><th>message ids</th></tr></thead><tbody>{check_rows}</tbody></table>"
        f"<h2>Charts</h2>{charts}{tables}</body></html>"
    )
