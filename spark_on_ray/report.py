"""Result tables -> Parquet and CSV files, PNG charts (matplotlib Agg) and one HTML report.

The analyses' outputs are small (per epoch, per fault, per group, per sample), so they are
collected to the driver as pandas frames and written here: the files land where the user ran the
command, not on whichever node hosted a Spark executor. Charts and HTML are plain functions of
those pandas frames, testable without Spark.
"""

from __future__ import annotations

import base64
import html
import json
import math
from pathlib import Path
from typing import Any, Mapping

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq


def to_pandas(tables: Mapping[str, Any]) -> dict[str, pd.DataFrame]:
    """Collect each Spark DataFrame to the driver (Arrow-enabled ``toPandas``).

    Integer columns stay integers with nulls (pandas ``Int64``) instead of turning into floats.
    """
    from pyspark.sql.types import IntegerType, LongType

    frames = {}
    for name, df in tables.items():
        pdf = df.toPandas()
        for field in df.schema.fields:
            if isinstance(field.dataType, (LongType, IntegerType)) and pdf[field.name].dtype.kind == "f":
                pdf[field.name] = pdf[field.name].astype("Int64")
        frames[name] = pdf
    return frames


def _jsonable_frame(df: pd.DataFrame) -> pd.DataFrame:
    """Array columns (split-brain offsets and masters) as JSON text, for CSV."""
    out = df.copy()
    for col in out.columns:
        if out[col].map(lambda v: isinstance(v, (list, tuple)) or hasattr(v, "tolist")).any():
            out[col] = out[col].map(lambda v: json.dumps(v.tolist() if hasattr(v, "tolist") else list(v))
                                    if v is not None and not (isinstance(v, float) and math.isnan(v)) else None)
    return out


def write_tables(frames: Mapping[str, pd.DataFrame], out_dir: Path) -> list[Path]:
    """Write each table as ``<name>.parquet`` and ``<name>.csv`` under ``out_dir/tables``."""
    table_dir = out_dir / "tables"
    table_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for name, df in frames.items():
        parquet = table_dir / f"{name}.parquet"
        pq.write_table(pa.Table.from_pandas(df, preserve_index=False), parquet)
        csv = table_dir / f"{name}.csv"
        _jsonable_frame(df).to_csv(csv, index=False)
        written += [parquet, csv]
    return written


# -- charts ----------------------------------------------------------------------------------------

def _figure(width: float, height: float) -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(figsize=(width, height))


def _save(fig: Any, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _no_data(ax: Any, what: str) -> None:
    ax.text(0.5, 0.5, f"no {what} in this run", ha="center", va="center", transform=ax.transAxes)
    ax.set_axis_off()


def chart_epoch_timeline(timeline: pd.DataFrame, path: Path, run_end_ms: float | None = None) -> Path:
    """One horizontal lane per group; a bar per epoch over wall-clock time, labelled epoch/master.

    An epoch still open at the end of the run is drawn up to ``run_end_ms`` (the last thing observed).
    """
    groups = sorted(timeline["group"].unique()) if len(timeline) else []
    fig, ax = _figure(10, 1.2 + 0.8 * max(1, len(groups)))
    t = timeline.dropna(subset=["start_ms"])
    if t.empty:
        _no_data(ax, "epochs with wall-clock times")
        return _save(fig, path)
    t0 = float(t["start_ms"].min())
    t_end = float(pd.concat([t["end_ms"].dropna(), t["start_ms"]]).astype("float64").max())
    if run_end_ms is not None and not pd.isna(run_end_ms):
        t_end = max(t_end, float(run_end_ms))
    colors = ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown"]
    for lane, group in enumerate(groups):
        rows = t[t["group"] == group].sort_values("epoch")
        for i, row in enumerate(rows.itertuples()):
            start = (float(row.start_ms) - t0) / 1000.0
            end_ms = row.end_ms if not pd.isna(row.end_ms) else max(t_end, float(row.start_ms) + 1.0)
            width = max((float(end_ms) - float(row.start_ms)) / 1000.0, 0.001)
            ax.barh(lane, width, left=start, color=colors[i % len(colors)], edgecolor="black", height=0.6)
            master = "?" if pd.isna(row.master_broker_id) else int(row.master_broker_id)
            ax.text(start + width / 2, lane, f"e{int(row.epoch)}\nm{master}", ha="center", va="center",
                    fontsize=7)
    ax.set_yticks(range(len(groups)))
    ax.set_yticklabels(groups)
    ax.set_xlabel("seconds since first epoch seen")
    ax.set_title("Epoch timeline per group (label: epoch, master broker id)")
    return _save(fig, path)


def chart_lag(lag: pd.DataFrame, path: Path) -> Path:
    """Bytes behind the master over time, one line per replica."""
    fig, ax = _figure(10, 4)
    data = lag.dropna(subset=["master_max_offset"]) if len(lag) else lag
    if data.empty:
        _no_data(ax, "offset samples")
        return _save(fig, path)
    t0 = float(data["time_ms"].min())
    for (group, broker), rows in data.sort_values("time_ms").groupby(["group", "broker_id"]):
        ax.plot((rows["time_ms"] - t0) / 1000.0, rows["lag_bytes"], label=f"{group}/{broker}", linewidth=1)
    ax.set_xlabel("seconds since first sample")
    ax.set_ylabel("bytes behind master")
    ax.set_title("Replication lag per replica")
    ax.legend(fontsize=7, loc="upper right", ncol=2)
    return _save(fig, path)


def chart_failovers(failovers: pd.DataFrame, path: Path) -> Path:
    """One bar per (fault, group): milliseconds from the kill to the first acknowledged send."""
    fig, ax = _figure(10, 4)
    data = failovers.dropna(subset=["failover_ms"]) if len(failovers) else failovers
    if data.empty:
        _no_data(ax, "recovered faults")
        return _save(fig, path)
    labels = [f"#{int(r.fault_id)} {r.kind} {r.group}" for r in data.itertuples()]
    ax.bar(range(len(data)), data["failover_ms"], color="tab:red")
    ax.set_xticks(range(len(data)))
    ax.set_xticklabels(labels, fontsize=7, rotation=45, ha="right")
    ax.set_ylabel("ms to first acknowledged send")
    ax.set_title("Failover duration per fault")
    return _save(fig, path)


def _mark_failovers(ax: Any, failovers: pd.DataFrame, t0: float) -> None:
    """A dashed vertical line at each master kill (seconds since ``t0``)."""
    kills = sorted({float(t) for t in failovers["kill_ms"].dropna()}) if len(failovers) else []
    for i, kill_ms in enumerate(kills):
        ax.axvline((kill_ms - t0) / 1000.0, color="tab:red", linestyle="--", linewidth=0.8,
                   label="master killed" if i == 0 else None)


def chart_consumer_lag(lag: pd.DataFrame, failovers: pd.DataFrame, path: Path) -> Path:
    """Total lag per consumer group over time (one line each), with the master kills marked."""
    fig, ax = _figure(10, 4)
    if not len(lag):
        _no_data(ax, "consumer-group progress samples")
        return _save(fig, path)
    t0 = float(lag["bucket_ms"].min())
    for group, rows in lag.sort_values("bucket_ms").groupby("consumer_group"):
        ax.step((rows["bucket_ms"].astype("float64") - t0) / 1000.0, rows["lag"].astype("float64"), where="post",
                label=str(group), linewidth=1, marker=".", markersize=4)
    _mark_failovers(ax, failovers, t0)
    ax.set_xlabel("seconds since first progress sample")
    ax.set_ylabel("messages not committed (lag)")
    ax.set_title("Consumer-group lag over time")
    ax.legend(fontsize=7, loc="upper right")
    return _save(fig, path)


def chart_redeliveries(redeliveries: pd.DataFrame, path: Path) -> Path:
    """Redeliveries around each failover: one group of bars per failover, one bar per consumer group."""
    fig, ax = _figure(10, 4)
    if not len(redeliveries):
        _no_data(ax, "deliveries around failovers")
        return _save(fig, path)
    faults = sorted(redeliveries["fault_id"].unique())
    groups = sorted(redeliveries["consumer_group"].unique())
    width = 0.8 / max(1, len(groups))
    for j, group in enumerate(groups):
        rows = redeliveries[redeliveries["consumer_group"] == group].set_index("fault_id")
        counts = [float(rows["redeliveries"].get(f, 0)) for f in faults]
        ax.bar([i + j * width for i in range(len(faults))], counts, width=width, label=str(group))
    labels = {int(r.fault_id): f"#{int(r.fault_id)} {r.target}" for r in redeliveries.itertuples()}
    ax.set_xticks([i + width * (len(groups) - 1) / 2 for i in range(len(faults))])
    ax.set_xticklabels([labels[int(f)] for f in faults], fontsize=7, rotation=45, ha="right")
    first = redeliveries.iloc[0]
    before_s = (float(first["kill_ms"]) - float(first["window_start_ms"])) / 1000.0
    after_s = (float(first["window_end_ms"]) - float(first["kill_ms"])) / 1000.0
    ax.set_ylabel(f"redeliveries in [kill - {before_s:g} s, kill + {after_s:g} s)")
    ax.set_title("Redeliveries around each failover, per consumer group")
    ax.legend(fontsize=7, loc="upper right")
    return _save(fig, path)


def run_end_ms(frames: Mapping[str, pd.DataFrame]) -> float | None:
    """The last wall-clock time the results mention (a sample or an acknowledgement), if any."""
    times = []
    if len(frames.get("replication_lag", ())):
        times.append(frames["replication_lag"]["time_ms"].max())
    if len(frames.get("failovers", ())):
        times.append(frames["failovers"]["first_ack_ms"].max())
    times = [float(t) for t in times if not pd.isna(t)]
    return max(times) if times else None


def draw_charts(frames: Mapping[str, pd.DataFrame], out_dir: Path) -> dict[str, Path]:
    """The PNG charts of the report, by name."""
    chart_dir = out_dir / "charts"
    chart_dir.mkdir(parents=True, exist_ok=True)
    return {
        "epoch_timeline": chart_epoch_timeline(frames["epoch_timeline"], chart_dir / "epoch_timeline.png",
                                               run_end_ms(frames)),
        "replication_lag": chart_lag(frames["replication_lag"], chart_dir / "replication_lag.png"),
        "failovers": chart_failovers(frames["failovers"], chart_dir / "failovers.png"),
        "consumer_lag": chart_consumer_lag(frames["consumer_lag"], frames["failovers"], chart_dir / "consumer_lag.png"),
        "redeliveries": chart_redeliveries(frames["redeliveries"], chart_dir / "redeliveries.png"),
    }


# -- HTML ------------------------------------------------------------------------------------------

#: Tables shown in full in the HTML report (long ones are truncated to HTML_MAX_ROWS).
HTML_TABLES = ("delivery", "failovers", "other_faults", "epoch_timeline", "elections", "split_brain",
               "replica_agreement", "truncation_summary", "lag_summary", "queue_positions", "lost_messages",
               "consumer_lag_summary", "redelivery_totals", "redeliveries", "consumer_lag")
HTML_MAX_ROWS = 200


def write_html(frames: Mapping[str, pd.DataFrame], charts: Mapping[str, Path], summary: Mapping[str, Any],
               path: Path, title: str) -> Path:
    """A self-contained HTML report: summary, charts embedded as base64 PNG, the main tables."""
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>",
             "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;font-size:12px}"
             "td,th{border:1px solid #ccc;padding:2px 6px}h2{margin-top:1.5em}</style></head><body>",
             f"<h1>{html.escape(title)}</h1><h2>Summary</h2><table>"]
    for key, value in summary.items():
        if key == "outputs":
            continue
        parts.append(f"<tr><th>{html.escape(str(key))}</th><td>{html.escape(json.dumps(value))}</td></tr>")
    parts.append("</table>")
    for name, png in charts.items():
        data = base64.b64encode(png.read_bytes()).decode("ascii")
        parts.append(f"<h2>{html.escape(name.replace('_', ' '))}</h2>"
                     f"<img alt='{html.escape(name)}' src='data:image/png;base64,{data}'>")
    for name in HTML_TABLES:
        if name not in frames:
            continue
        df = _jsonable_frame(frames[name])
        more = "" if len(df) <= HTML_MAX_ROWS else f" (first {HTML_MAX_ROWS} of {len(df)} rows)"
        parts.append(f"<h2>{html.escape(name.replace('_', ' '))}{more}</h2>")
        parts.append(df.head(HTML_MAX_ROWS).to_html(index=False, na_rep="", border=0) if len(df)
                     else "<p>(empty)</p>")
    parts.append("</body></html>")
    path.write_text("\n".join(parts), encoding="utf-8")
    return path
