"""The weight t of ``slerp`` (a post-hoc method: a given encoder, frozen, and the Procrustes map plus
spherical interpolation) is searchable by ``orchestrator tune``: a tune file over it parses against a
pipeline with a slerp candidate, and a trial fits the map once, with the trial's t, and reports once."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from orchestrator.data import channel_statistics, load_digits
from orchestrator.methods import create_method
from orchestrator.methods.loading import load_generation
from orchestrator.models.adapters import BACKWARD_ADAPTER, QueryInterpolation
from orchestrator.models.checkpoint import save_generation
from orchestrator.models.encoder import EncoderConfig
from orchestrator.training.generation import GenerationJob
from orchestrator.tuning.config import TuneFileError, load_tune_file, trial_reports
from orchestrator.tuning.space import param_space

REPO = Path(__file__).resolve().parents[2]


def slerp_pipeline(tmp_path: Path) -> str:
    """pipelines/posthoc.yaml with cosine generations and a slerp candidate."""
    config = yaml.safe_load((REPO / "pipelines" / "posthoc.yaml").read_text())
    config["storage"] = str(tmp_path / "run")
    old, independent, candidate = config["generations"]
    old["method"] = {"name": "independent", "params": {}}
    independent["method"] = {"name": "independent", "params": {}}
    candidate["method"] = {"name": "slerp", "params": {"weight": 0.5, "pairs": 500}}
    path = tmp_path / "slerp.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return str(path)


def test_a_tune_file_searches_the_slerp_weight(tmp_path):
    tune = tmp_path / "tune.yaml"
    tune.write_text(f"name: t\npipeline: {slerp_pipeline(tmp_path)}\ntransition: {{parent: g0-old, candidate: g1-posthoc}}\n"
                    "space:\n  weight: {grid: [0.0, 0.3, 0.6]}\nobjective:\n  maximize: cross_map\n")
    tune_file = load_tune_file(str(tune))
    assert tune_file.candidate.method.name == "slerp" and trial_reports(tune_file.candidate) == 1
    domain = param_space(tune_file.spec.space)["weight"]
    assert domain == {"grid_search": [0.0, 0.3, 0.6]}
    # a weight off [0, 1] is refused where it is written, and ASHA cannot wait for a second report
    tune.write_text(tune.read_text().replace("[0.0, 0.3, 0.6]", "[0.5, 1.5]"))
    with pytest.raises(TuneFileError, match=r"space\.weight\.grid.*1\.5"):
        load_tune_file(str(tune))
    tune.write_text(tune.read_text().replace("[0.5, 1.5]", "[0.5]") + "scheduler: {kind: asha, grace_period: 2}\n")
    with pytest.raises(TuneFileError, match="trains no encoder: each trial fits its map and reports once"):
        load_tune_file(str(tune))


def test_a_slerp_parent_off_the_sphere_is_refused_by_validation(tmp_path):
    from orchestrator.config import PipelineConfigError, load_pipeline

    path = Path(slerp_pipeline(tmp_path))
    config = yaml.safe_load(path.read_text())
    config["generations"][0]["method"] = {"name": "hbct", "params": {}}
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    with pytest.raises(PipelineConfigError, match="method 'slerp' interpolates on the unit sphere: the parent must "
                                                  "embed in cosine space, not lorentz"):
        load_pipeline(str(path))


def _saved(tmp_path, name: str, seed: int) -> tuple[str, str]:
    encoder = EncoderConfig(arch="test_convnext", embed_dim=16)
    torch.manual_seed(seed)
    model = create_method("independent", {}).build_model(encoder, 10, range(10)).eval()
    card = save_generation(model, create_method("independent", {}), encoder, str(tmp_path / name), name=name)
    return str(tmp_path / name), card.sha256


def test_a_slerp_trial_fits_once_with_the_trials_weight_and_reports_once(tmp_path, trial_here):
    torch.set_num_threads(1)
    parent_uri, parent_sha = _saved(tmp_path, "old", 1)
    given_uri, given_sha = _saved(tmp_path, "given", 2)
    train = load_digits("train")
    mean, std = channel_statistics(train)
    job = GenerationJob(name="new", method="slerp", method_params={"weight": 0.5, "pairs": 300},
                        encoder=EncoderConfig(arch="test_convnext", embed_dim=16).model_dump(mode="json"),
                        training={"batch_size": 64}, num_classes=10, data_source="digits",
                        output_uri=str(tmp_path / "new"), data_options={"split": "train"}, mean=tuple(mean),
                        std=tuple(std), train_ids=train.ids.tolist(), parent_name="old", parent_uri=parent_uri,
                        parent_sha256=parent_sha, encoder_uri=given_uri, encoder_sha256=given_sha, seed=5)
    reports = trial_here(job, str(tmp_path / "candidates"), {"weight": 0.8})
    assert len(reports) == 1 and "collapsed" not in reports[0]
    assert reports[0]["loss"] > 0 and reports[0]["cross_map"] > 0  # the Procrustes fit's error; the old gallery searched
    candidate, _card = load_generation(str(tmp_path / "candidates" / "t1"))
    backward = candidate.adapters[BACKWARD_ADAPTER]
    assert isinstance(backward, QueryInterpolation) and backward.weight == 0.8  # the trial's t, not the pipeline's 0.5
