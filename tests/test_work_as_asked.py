"""The work each request did against what it asked for: a context limit that cuts outputs short
under `ignore_eos`, and prompts that arrive at another length than asked (words are not tokens),
are said in `load`'s table and JSON, in the trial's warnings and in the cell's warnings. Known
truth: the fake server's own settings (tests/truthserver.py: `output_limit` cuts every request
at that many tokens; `prompt_words_per_token` sets how it counts a prompt's words)."""

from __future__ import annotations

import asyncio

from rich.console import Console

from truthput.store.db import Store

from truthserver import TruthConfig, TruthServer


def _load(tmp_path, **cfg):  # type: ignore[no-untyped-def]
    from truthput.load.workload import WorkloadSpec
    from truthput.run.load import LoadOptions, run_load

    async def go():  # type: ignore[no-untyped-def]
        server = await TruthServer(TruthConfig(concurrency=2, step_s=0.002, tokens_per_chunk=(1,), **cfg)).start()
        try:
            opts = LoadOptions(url=server.url, concurrency=[2], duration_s=0.6, sample_interval_s=0,
                               workload=WorkloadSpec(input_tokens=128, output_tokens=40))
            return opts, await run_load(opts, Store(tmp_path / "l.db"))
        finally:
            await server.stop()

    return asyncio.run(go())


def test_outputs_cut_by_a_context_limit_and_prompts_of_another_length_are_said(tmp_path, monkeypatch):
    from truthput.report import loadtable, terminal

    opts, run = _load(tmp_path, output_limit=25, prompt_words_per_token=1.0)
    res = run.outcomes[0].results
    assert res.requests.completion_tokens_asked_mean == 40 and res.requests.completion_tokens_mean == 25
    (cut,) = [w for w in res.requests.work_notes if "fewer completion tokens than asked" in w]
    assert "25 against 40" in cut and "finish_reason: length" in cut, cut
    # 128 tokens asked are built as 96 words, which this server counts one token each
    (prompts,) = [w for w in res.requests.work_notes if w.startswith("prompts arrived as")]
    assert "96 tokens" in prompts and "(asked 128)" in prompts and "tokenizer.json" in prompts, prompts
    assert set(res.requests.work_notes) <= set(res.warnings)

    row = run.rows()[0].model_dump()
    assert row["work"]["completion_tokens_mean"] == 25 and row["work"]["prompt_tokens_asked_mean"] == 128
    assert cut in row["warnings"] and prompts in row["warnings"]

    con = Console(record=True, width=400)
    monkeypatch.setattr(loadtable, "make_console", lambda **_kw: con)
    loadtable.print_summary(run.summary)
    text = con.export_text()
    assert "fewer completion tokens than asked" in text and "prompts arrived as 96 tokens" in text
    # and `truthput report` of the stored load run, in the terminal
    report = Console(record=True, width=400)
    terminal.print_run(Store(tmp_path / "l.db"), "latest", console=report)
    said = report.export_text()
    assert "fewer completion tokens than asked" in said and "prompts arrived as 96 tokens" in said, said


def test_requests_that_did_what_they_asked_raise_nothing(tmp_path):
    _opts, run = _load(tmp_path)
    res = run.outcomes[0].results
    assert res.requests.completion_tokens_mean == 40 and not res.requests.work_notes
    assert abs(res.requests.prompt_tokens_mean - 128) <= 0.05 * 128


def test_a_cells_warnings_carry_the_work_its_trials_did_not_do():
    """`run`'s cells (every view's) say it once per cell, with how many trials."""
    from truthput.analyze.cells import build_cells
    from truthput.measure.model import TrialResults

    class T:  # a stored trial as analysis reads it
        def __init__(self, i: int, notes: list[str]) -> None:
            self.variant, self.concurrency, self.level, self.start_index, self.trial_index = "v", 4, 4, i, 0
            self.status, self.error, self.run_id, self.id, self.start_id = "ok", None, "r", i, i
            self.results = TrialResults()
            self.results.requests.work_notes = notes

    cells = build_cells([T(0, ["prompts arrived as 96 tokens"]), T(1, [])])
    assert "v c=4 (1 of 2 trials): prompts arrived as 96 tokens" in cells[0].warnings, cells[0].warnings
