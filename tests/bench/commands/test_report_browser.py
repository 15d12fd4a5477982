"""The HTML report in a real headless browser (Debian's chromium): it renders, logs no console error, and
every chart is an image that loaded with a nonzero natural size. Skipped where chromium is missing."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from histories import commit_runs
from rich.console import Console

from bench.commands import history as history_command
from bench.commands import report as report_command

FIXTURES = Path(__file__).parents[1] / "fixtures"
QUIET = Console(file=open(os.devnull, "w"))  # noqa: SIM115
BROWSER = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(
    BROWSER is None, reason="chromium is not installed (Debian: apt-get install chromium; .ci/run does)"
)
FLAGS = [
    "--headless",
    "--no-sandbox",  # root in CI and containers: chromium refuses to start sandboxed as root
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--enable-logging=stderr",
    "--v=0",
    "--virtual-time-budget=10000",  # let every image decode before the DOM is dumped
]
PROBE = """<script>
window.addEventListener("load", () => {
  const images = [...document.images].map(i => ({alt: i.alt, complete: i.complete,
    width: i.naturalWidth, height: i.naturalHeight}));
  const out = document.createElement("pre");
  out.id = "probe";
  out.textContent = JSON.stringify({title: document.title, h1: document.querySelector("h1").textContent,
    images});
  document.body.appendChild(out);
});
</script>"""
"""Read-only: what the browser made of the page, written into it for --dump-dom (the report itself holds
no script)."""
CONSOLE_LINE = re.compile(r":CONSOLE[:(]|Uncaught")
"""How chromium logs a console message to stderr: `[pid:tid:time:INFO:CONSOLE:1] "text", source: ...`."""


def _browse(page: Path, profile: Path) -> subprocess.CompletedProcess[str]:
    argv = [BROWSER, *FLAGS, f"--user-data-dir={profile}", "--dump-dom", page.as_uri()]
    return subprocess.run(argv, capture_output=True, text=True, timeout=180)


def test_the_html_report_renders_in_chromium_with_its_charts(tmp_path):
    page = tmp_path / "report.html"
    paths = [str(FIXTURES / name) for name in ("scaling.json", "ablation.json", "verify.json")]
    assert report_command.run(paths, out=str(page), console=QUIET) == 0
    html = page.read_text()
    charts = html.count("<img ")
    assert charts > 5
    probed = tmp_path / "probed.html"
    probed.write_text(html.replace("</body>", PROBE + "\n</body>"))
    done = _browse(probed, tmp_path / "profile")
    assert done.returncode == 0, done.stderr[-2000:]
    found = re.search(r'<pre id="probe">(.*?)</pre>', done.stdout, re.DOTALL)
    assert found, f"the page did not finish loading: {done.stdout[-500:]}"
    probe = json.loads(found.group(1).replace("&quot;", '"').replace("&amp;", "&"))
    assert (
        probe["title"].startswith("gdn-cp-bench: tiny-scaling, tiny-ablation")
        and probe["h1"] == probe["title"]
    )
    assert len(probe["images"]) == charts
    assert all(i["complete"] and i["width"] > 0 and i["height"] > 0 for i in probe["images"]), probe["images"]
    # the page as written, without the probe: no console message at all (no error, no warning)
    plain = _browse(page, tmp_path / "profile-plain")
    assert plain.returncode == 0 and "<h2>Overview</h2>" in plain.stdout
    messages = [line for line in (done.stderr + plain.stderr).splitlines() if CONSOLE_LINE.search(line)]
    assert messages == []


def test_the_history_site_renders_in_chromium_with_its_charts(tmp_path):
    """`bench history`'s index and scenario page: each renders, its charts load, its links lead to pages
    that exist, and no page logs a console message."""
    folder = commit_runs(tmp_path, [1.0] * 4 + [1.3] * 4, failed=2)
    site = tmp_path / "site"
    assert history_command.run([str(folder)], out=str(site), console=QUIET) == 0
    pages = sorted(site.glob("*.html"))
    assert pages[0].name == "index.html" and len(pages) == 2
    messages = []
    for page in pages:
        html = page.read_text()
        for href in re.findall(r'href="([^"]+)"', html):
            assert (site / href).is_file(), f"{page.name} links to {href}, which is not in the site"
        probed = tmp_path / f"probed-{page.name}"
        probed.write_text(html.replace("</body>", PROBE + "\n</body>"))
        done = _browse(probed, tmp_path / f"profile-{page.stem}")
        assert done.returncode == 0, done.stderr[-2000:]
        found = re.search(r'<pre id="probe">(.*?)</pre>', done.stdout, re.DOTALL)
        assert found, f"{page.name} did not finish loading: {done.stdout[-500:]}"
        probe = json.loads(found.group(1).replace("&quot;", '"').replace("&amp;", "&"))
        assert len(probe["images"]) == html.count("<img ")
        assert all(i["complete"] and i["width"] > 0 for i in probe["images"]), probe["images"]
        plain = _browse(page, tmp_path / f"profile-plain-{page.stem}")
        assert plain.returncode == 0
        messages += [line for line in (done.stderr + plain.stderr).splitlines() if CONSOLE_LINE.search(line)]
    assert "<img " in pages[1].read_text() and messages == []
