"""The HTML report as a person sees it: rendered by headless Chromium (Debian's `chromium`, which `make test`
installs), answer first, nothing running off the right edge. The screenshot is kept in test-artifacts/."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from analysis.report import write_report

from run_records import STARVED_LOG, write_failed_run, write_run

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts"
WINDOW = (1024, 1600)  # a laptop-width window: the runs table alone has 13 columns
PROBE = """<script>
const root = document.documentElement;
const tables = [...document.querySelectorAll('table')];
const probe = document.createElement('pre');
probe.id = 'probe';
probe.textContent = JSON.stringify({
  scrollWidth: root.scrollWidth, clientWidth: root.clientWidth,
  rightmostTableEdge: Math.max(...tables.map(table => table.getBoundingClientRect().right)),
  headings: [...document.querySelectorAll('h1, h2')].map(heading => heading.textContent),
  firstTableTop: tables[0].getBoundingClientRect().top,
  firstTableHeaders: [...tables[0].querySelectorAll('th')].map(th => th.textContent),
  firstTableRows: [...tables[0].querySelectorAll('tr')].slice(1)
    .map(tr => [...tr.querySelectorAll('td')].map(td => td.textContent)),
  heldFixed: [...tables[1].querySelectorAll('td')].map(td => td.textContent),
});
document.body.appendChild(probe);
</script>"""


def chromium(*args: str) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("chromium")
    assert binary, "Debian's chromium is not installed (make test installs it)"
    return subprocess.run([binary, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                           f"--window-size={WINDOW[0]},{WINDOW[1]}", *args], capture_output=True, text=True,
                          timeout=120)


@pytest.fixture(scope="module")
def report_page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A kv_cache_memory_bytes sweep: one point too small to start, one starved of KV cache, one ample."""
    root = tmp_path_factory.mktemp("browser")
    write_failed_run(root, limits={"kv_cache_memory_bytes": 65_536, "max_num_seqs": 2})
    write_run(root, limits={"kv_cache_memory_bytes": 4_194_304, "max_num_seqs": 2}, log=STARVED_LOG,
              prompt_tokens=1100, ttft_ms=900.0, samples=[(2, 2, 0.6, 0), (3, 2, 0.97, 1)])
    write_run(root, limits={"kv_cache_memory_bytes": 1_073_741_824, "max_num_seqs": 2},
              samples=[(2, 2, 0.01, 0), (2, 2, 0.01, 0)])
    return write_report(limit="kv_cache_memory_bytes", out=root / "report", run_dirs=[root]).html


def test_the_report_opens_on_the_answer_and_stays_inside_the_page(report_page: Path, tmp_path: Path) -> None:
    probed_page = tmp_path / "probed.html"
    probed_page.write_text(report_page.read_text().replace("</body>", PROBE + "</body>"))
    dumped = chromium("--dump-dom", probed_page.as_uri())
    assert dumped.returncode == 0, dumped.stderr[-2000:]
    probed = re.search(r"<pre id=\"probe\">(.*?)</pre>", dumped.stdout, re.S)
    assert probed, dumped.stdout[-2000:]  # the probe ran and wrote its figures into the page
    probe = json.loads(probed.group(1)
                       .replace("&quot;", '"').replace("&amp;", "&").replace("&lt;", "<").replace("&gt;", ">"))

    assert probe["scrollWidth"] <= probe["clientWidth"] == WINDOW[0]  # no horizontal scrolling
    assert probe["rightmostTableEdge"] <= probe["clientWidth"]
    assert probe["headings"][1] == "Answer"  # right under the title, before any other table
    assert probe["firstTableHeaders"] == ["kv_cache_memory_bytes", "bound by", "shown by", "what to change"]
    assert probe["firstTableTop"] < 200
    answers = {
        row[0]: dict(zip(["bound by", "shown by", "what to change"], row[1:], strict=True))
        for row in probe["firstTableRows"]
    }
    assert {value: answer["bound by"] for value, answer in answers.items()} == {
        "65536": "weights and start-up headroom", "4194304": "KV cache capacity",
        "1073741824": "max_num_seqs (scheduling)"}
    assert "preemptions_during_run=1" in answers["4194304"]["shown by"]  # the figure that shows the KV bound
    assert answers["1073741824"]["what to change"].startswith("raise max_num_seqs")  # waited while KV was free
    # held fixed: a name with its unit, then a plain value (no Python quotes)
    held = dict(zip(probe["heldFixed"][::2], probe["heldFixed"][1::2], strict=True))
    assert held["concurrency (requests)"] == "4" and held["order"] == "inventory"

    ARTIFACTS.mkdir(exist_ok=True)
    screenshot = ARTIFACTS / "report-1024px.png"
    shot = chromium(f"--screenshot={screenshot}", report_page.as_uri())
    assert shot.returncode == 0, shot.stderr[-2000:]
    header = screenshot.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n" and int.from_bytes(header[16:20], "big") == WINDOW[0]
