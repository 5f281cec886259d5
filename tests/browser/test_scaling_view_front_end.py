"""ScalingView's front end in Chromium, with a study's predictions: dashed curves per strategy,
predicted rows and the assumptions (the widget's own script, given its synced state)."""

import json
import os

import pytest

from workbench.cluster.predict import Assumptions, Profile, predict
from workbench.events import EventStream, ScalingFinished, ScalingPoint, ScalingStarted
from workbench.widgets import ScalingView
from workbench.widgets._base import front_end

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

CHROMIUM = "/usr/bin/chromium"

PAGE = """
<div id="root"></div>
<script type="module">
{script}
const state = {state};
const model = {{ get: () => state, on: () => {{}} }};
render({{ model, el: document.getElementById("root") }});
window.rendered = true;
</script>
"""


def study_state() -> dict:
    profile = Profile(model_bytes=4e6, batch_size=256, compute_per_sample=1e-4, latency=1e-3, bandwidth=1e9, hop=2e-3)
    rows = (
        {"workers": 1, "samples_per_s": 9000.0, "speedup": 1.0, "efficiency": 1.0},
        {"workers": 2, "samples_per_s": 12000.0, "speedup": 1.33, "efficiency": 0.67},
    )
    stream = EventStream()
    view = ScalingView().follow(stream)
    stream.emit(ScalingStarted(workers=(1, 2)))
    for row in rows:
        stream.emit(ScalingPoint(**row))
    stream.emit(ScalingFinished(rows=rows, predictions=tuple(predict(profile, [1, 2, 8, 100])),
                                assumptions=tuple(Assumptions(link="10gbe").describe(profile))))  # fmt: skip
    return view.state


def test_predictions_are_dashed_curves_with_rows_and_assumptions():
    if not os.path.exists(CHROMIUM):
        pytest.skip("chromium is not installed")
    from playwright.sync_api import sync_playwright

    script = front_end("scaling_view.js").replace("export default { render };", "")
    html = PAGE.format(script=script, state=json.dumps(study_state()))
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--headless", "--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 600})
            page.set_content(html)
            page.wait_for_function("() => window.rendered === true", timeout=10_000)
            root = page.locator(".wb-scaling")
            dashed = root.locator("path.wb-predicted")
            assert dashed.count() == 4  # two strategies, two charts
            assert sorted({dashed.nth(i).get_attribute("data-strategy") for i in range(4)}) == [
                "allreduce",
                "parameter_server",
            ]
            assert dashed.first.get_attribute("stroke-dasharray") == "5 4"
            assert root.locator("circle.wb-point").count() == 4  # 2 measured counts, 2 charts
            table = root.locator("table").inner_text()
            assert "100 allreduce" in table and "100 parameter_server" in table
            notes = root.locator(".wb-notes").inner_text()
            assert "predicted, dashed: allreduce (green), parameter_server (orange)" in notes
            assert "assumes link: 10 GbE" in notes
            assert "efficiency (dashed: ideal, predicted)" in root.inner_text()
        finally:
            browser.close()
