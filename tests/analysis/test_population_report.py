"""The report shows the live-token population each run predicted for its load beside what it measured, in
numbers formatted for people, read from the record alone."""

from __future__ import annotations

from pathlib import Path

from analysis.report import write_report
from harness.measure.figures import PopulationFigures
from harness.measure.stats import RunSummary
from harness.schema import RunFile

from run_records import write_run

# What tests/measure/test_population_figures.py works out: 2 live of 3 in flight (max_num_seqs 2) from 4 prompts
# of 8-32 blocks of 128, against 40 usable blocks: p50 5,120 tokens, p99 and max 7,168, 2 of 3 draws fit; the
# busiest scrape saw 90% of the 40 blocks, 36 = 4,608 tokens.
POPULATION = PopulationFigures(concurrency=3, max_num_seqs=2, live_requests=2, block_size_tokens=128,
                               usable_blocks=40, padded_tokens_p50_predicted=5120, padded_tokens_p99_predicted=7168,
                               padded_tokens_max_predicted=7168, fit_share_predicted=0.667, draws=4096, seed=0,
                               peak_tokens_measured=4608)


def test_the_report_shows_the_predicted_population_beside_the_measured_peak(tmp_path: Path) -> None:
    # two runs along max_num_seqs: one whose record holds the population, one from before it was recorded
    with_population = write_run(tmp_path / "runs", limits={"max_num_seqs": 2}, samples=[(1, 2, 0.9, 0), (1, 2, 0.9, 2)])
    summary_file = with_population / RunFile.SUMMARY
    summary = RunSummary.model_validate_json(summary_file.read_text())
    summary_file.write_text(summary.model_copy(update={"population": POPULATION}).model_dump_json(indent=2))
    without = write_run(tmp_path / "runs", limits={"max_num_seqs": 4})
    written = write_report(limit="max_num_seqs", out=tmp_path / "report", run_dirs=[tmp_path / "runs"])
    section = written.markdown.read_text().split("## Predicted vs measured live-token population")[1].split("## ")[0]
    row = next(line for line in section.splitlines() if with_population.name in line)
    # live requests, usable blocks, block size, p50, p99, max, fit share, peak measured, peak usage, preemptions
    # (the counter grew 0 -> 2 over the run's two scrapes)
    assert row.endswith("| 2 | 2 | 40 | 128 | 5,120 | 7,168 | 7,168 | 0.667 | 4,608 | 0.9 | 2 |"), row
    older = next(line for line in section.splitlines() if without.name in line)
    assert older.count("| – ") == 8  # the eight population figures it never recorded
    page = written.html.read_text()
    assert "5,120" in page and "Predicted vs measured live-token population" in page
