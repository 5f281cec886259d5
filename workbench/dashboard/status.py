"""Whether a cluster's dashboard, and its Workbench page, can be shown, and if not, why."""

from __future__ import annotations

from workbench.dashboard.monitor import NAME
from workbench.dashboard.page import PAGE


def scheduler_status(dask_scheduler) -> dict:
    """Run on the scheduler (``client.run_on_scheduler``): what its dashboard serves."""
    try:
        import distributed.dashboard.scheduler  # noqa: F401 - fails without a bokeh that Dask accepts

        bokeh = ""
    except ImportError as e:
        bokeh = str(e) or "bokeh is not installed"
    # The HTTP server (/metrics, /health) runs anyway; the dashboard is the Bokeh application on it.
    bokeh_apps = [
        app
        for app in getattr(getattr(dask_scheduler, "http_application", None), "applications", [])
        if hasattr(app, "app_paths")
    ]
    paths = {path for app in bokeh_apps for path in app.app_paths}
    return {
        "dashboard": bool(bokeh_apps),
        "bokeh": bokeh,
        "page": PAGE in paths,
        "monitor": NAME in dask_scheduler.plugins,
    }


def dashboard_info(client, link: str) -> dict:
    """``workbench_page`` (its address, or "") and ``dashboard_note`` (why something is missing, or "");
    ``dashboard`` is "" when the scheduler serves no dashboard at ``link`` (only its HTTP routes)."""
    try:
        status = client.run_on_scheduler(scheduler_status)
    except Exception as e:  # noqa: BLE001 - unpickling fails where workbench is not installed
        why = f"{type(e).__name__}: {e}".strip(": ")
        note = "no Workbench page on the dashboard: workbench is not importable where the scheduler runs"
        return {"workbench_page": "", "dashboard_note": (note if link else "no dashboard") + f" ({why})"}
    if not status["dashboard"]:
        reason = (
            f"Dask needs bokeh for it: {status['bokeh']}"
            if status["bokeh"]
            else "the scheduler was started without one"
        )
        return {"dashboard": "", "workbench_page": "", "dashboard_note": f"no dashboard: {reason}"}
    if not (status["page"] and status["monitor"]):
        return {
            "workbench_page": "",
            "dashboard_note": "no Workbench page on the dashboard: start the scheduler with "
            "--preload workbench.dashboard.preload",
        }
    base = link.rsplit("/", 1)[0] if link else ""
    return {"workbench_page": f"{base}{PAGE}" if base else "", "dashboard_note": ""}
