"""What a selection study reads and writes: its candidates from lineage, their diagnostics,
outcomes, the analysis, and the study's records in lineage and MLflow.

Every task of `flows.study` opens its own `StudyRecording` from the composed config, as
`flows.recording` does for the pipeline, so tasks pass nothing but ids and paths.
"""
from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from ckpt import manifest as manifest_io
from flows.stage_config import stage_config
from handoff.study_plan import StudyInput, StudyNotPossible, pick_candidates

STUDIES_DIR = "studies"
KIND = "selection"


class StudyRecording:
    def __init__(self, cfg):
        from lineage import LineageStore, mlflow_lineage, store_url

        self.cfg = cfg
        self.store = LineageStore.open(store_url(cfg), create=False)
        self.mlflow = mlflow_lineage(cfg)

    # -- before any RL compute ----------------------------------------------------------
    def prepare(self, overrides: list[str]) -> dict:
        """Candidates checked, diagnostics computed, the study opened in lineage."""
        from core.config.compose import as_dict
        from handoff.candidates import evaluate_candidates
        from handoff.study import diagnostics_from_handoff_metrics

        st = self.cfg.study
        stage_run, picked = self.candidates()
        target = stage_config(overrides, "rl")  # an invalid RL config stops the study here
        selection = self._selection()
        print(f"[study] {len(picked)} candidates of sft stage run #{stage_run.id}: steps "
              f"{[c.step for c in picked]}; diagnostics first", flush=True)
        evaluated = evaluate_candidates([(c.path, c.step) for c in picked], "sft",
                                        self._model_dir(picked[0].path, overrides), target,
                                        selection)
        config = {**as_dict(self.cfg)["study"], "seed": self.cfg.seed,
                  "selection": asdict(selection), "candidates": [c.step for c in picked]}
        study = self.store.start_study(KIND, stage_run.id, config)
        directory = Path(self.cfg.run.dir).resolve() / STUDIES_DIR / f"{KIND}-{study.id:04d}"
        directory.mkdir(parents=True, exist_ok=True)
        candidates = []
        for pick, cand in zip(picked, evaluated):
            diagnostics = diagnostics_from_handoff_metrics(cand.metrics)
            self.store.record_study_candidate(study.id, pick.checkpoint_id, pick.step, diagnostics)
            candidates.append({**asdict(pick), "diagnostics": diagnostics})
        print(f"[study] selection study #{study.id}: files under {directory}", flush=True)
        return {"id": study.id, "dir": str(directory), "rl_steps": st.rl_steps,
                "workers": st.workers, "candidates": candidates}

    def candidates(self) -> tuple:
        """(the SFT stage run, its candidates), or StudyNotPossible: store reads only, so
        `baton study` checks this before Prefect starts."""
        st = self.cfg.study
        stage_run = self._stage_run(st.stage_run_id)
        return stage_run, pick_candidates(stage_run.id, stage_run.stage,
                                          self._committed(stage_run.id),
                                          None if st.steps is None else list(st.steps))

    def _stage_run(self, wanted: int | None):
        if wanted is not None:
            return self.store.stage_run(wanted)  # an unknown id is a clear UnknownRecord
        runs = [run for pipeline in self.store.pipeline_runs()
                for run in self.store.stage_runs(pipeline.id)
                if run.stage == "sft" and run.status == "completed"]
        if not runs:
            raise StudyNotPossible(
                "the lineage store has no completed SFT stage run",
                "Run the pipeline first (`baton run`, at least `--stages cpt,sft`), or pass "
                "study.stage_run_id=<id>")
        return max(runs, key=lambda run: run.id)

    def _committed(self, stage_run_id: int) -> list[StudyInput]:
        """Committed checkpoints still on disk (retention may have removed older ones)."""
        return [StudyInput(c.id, c.path, c.step) for c in self.store.checkpoints(stage_run_id)
                if c.committed and (Path(c.path) / manifest_io.MANIFEST).is_file()]

    def _selection(self):
        from core.config.schema import SelectionConfig

        handoff = self.cfg.pipeline.handoffs.get("sft_rl")
        return handoff.selection if handoff is not None else SelectionConfig()

    @staticmethod
    def _model_dir(checkpoint: str, overrides: list[str]) -> str:
        """The model directory the SFT stage ran with (its launch.json), else this config's."""
        from stages.model import ensure_model_dir

        launch = Path(checkpoint).parent.parent / "launch.json"  # <stage>/checkpoints/step-N
        if launch.is_file():
            return json.loads(launch.read_text())["model_dir"]
        return str(ensure_model_dir(stage_config(overrides, "sft")))

    # -- after each candidate's RL ------------------------------------------------------
    def candidate_outcome(self, study_id: int, candidate: dict, outcome: dict, root: Path) -> None:
        self.store.set_study_candidate_outcome(study_id, candidate["checkpoint_id"], outcome,
                                               str(root))

    def fail_if_running(self, study_id: int) -> None:
        if self.store.study(study_id).status == "running":
            self.store.finish_study(study_id, "failed", results=None, winner_diagnostic=None,
                                    winner_direction=None, verdict=None)

    # -- the analysis ------------------------------------------------------------------
    def analyze(self, study: dict) -> dict:
        from handoff.study import CandidateResult, analyze, verdict_markdown
        from handoff.study_plots import plot_study

        record = self.store.study(study["id"])
        results = [CandidateResult(c.step, c.checkpoint_id, _path(study, c.checkpoint_id),
                                   dict(c.diagnostics), dict(c.outcome))
                   for c in sorted(record.candidates, key=lambda c: c.step)]
        result = analyze(results, resamples=self.cfg.study.bootstrap, seed=self.cfg.seed)
        directory = Path(study["dir"])
        verdict = verdict_markdown(result, results)
        (directory / "verdict.md").write_text(verdict)
        table = directory / "study.json"
        table.write_text(json.dumps({"study_id": study["id"], **result.as_dict(),
                                     "candidates": [asdict(r) for r in results]}, indent=1))
        plots = plot_study(result, results, directory)
        winner = result.winner
        finished = self.store.finish_study(
            study["id"], "completed", results=result.as_dict(),
            winner_diagnostic=winner.diagnostic if winner else None,
            winner_direction=result.winner_direction if winner else None, verdict=verdict)
        parent, children = self.mlflow.log_study(finished, [*plots, table])
        if parent:
            self.store.set_study_mlflow(study["id"], parent, children)
        return {"id": study["id"], "dir": str(directory), "verdict": verdict,
                "winner": winner.diagnostic if winner else None,
                "peak_was_best": result.peak_was_best, "mlflow_run_id": parent}


def study_winner(store):
    """The newest completed selection study's finding, for criterion=study at a handoff."""
    from handoff.selection import NoStudyRecorded, StudyWinner

    study = store.latest_study(KIND)
    if study is None:
        raise NoStudyRecorded(f"at {store.url}")
    best = (study.results or {}).get("winner") or {}
    return StudyWinner(study.id, study.winner_diagnostic, study.winner_direction,
                       best.get("spearman"), (best.get("spearman_lo"), best.get("spearman_hi")))


def _path(study: dict, checkpoint_id: int) -> str:
    return next(c["path"] for c in study["candidates"] if c["checkpoint_id"] == checkpoint_id)
