"""Device-share analysis of a stored run: for the ok trials of page-cache configurations, the
share of fio's bytes that reached the target's device (``iomatrix.telemetry.pagecache``),
derived from their stored telemetry; only those trials' telemetry is read."""

from __future__ import annotations

from typing import Any

from iomatrix.store.records import TrialRecord
from iomatrix.store.rows import decode
from iomatrix.telemetry.host import HostSeries
from iomatrix.telemetry.pagecache import device_share, uses_page_cache


def with_device_shares(conn: Any, run_id: int, trials: tuple[TrialRecord, ...], *,
                       ramp_s: float, fallback: str | None) -> tuple[TrialRecord, ...]:
    """``trials`` with the ok trials of page-cache configurations carrying the share of
    fio's bytes that reached the target's device (``iomatrix.telemetry.pagecache``), derived
    from their stored telemetry; only those trials' telemetry is read."""
    ids = [r[0] for r in conn.execute(
        "SELECT id, mode, params_json FROM configurations WHERE run_id = ?", (run_id,))
        if uses_page_cache(str(r[1]), decode("configurations", "params_json", r[0], r[2]))]
    if not ids:
        return trials
    series: dict[int, HostSeries | None] = {}
    for first in range(0, len(ids), 500):
        chunk = ids[first:first + 500]
        for trial_id, text in conn.execute(
                "SELECT id, telemetry_json FROM trials WHERE run_id = ? AND status = 'ok' AND "
                f"configuration_id IN ({', '.join('?' * len(chunk))})", (run_id, *chunk)):
            series[trial_id] = decode("trials", "telemetry_json", trial_id,
                                       "{}" if text in (None, "") else text)
    return tuple(
        t.model_copy(update={"device_share": device_share(
            series[t.id], t.samples, ramp_s=ramp_s, device=fallback)})
        if t.id in series else t for t in trials)
