"""The deployment gate's decision from a measurement and the generation's ``gate`` settings."""
from __future__ import annotations

import dataclasses
import json

import pytest

from orchestrator.config import GateSpec
from orchestrator.pipeline.gate import GateMeasurement, decide, drop_within_noise, noise_unmeasured, wasted_backfill


def measurement(verdicts=(), predicted=None, serving_quality=None, unmeasured="", p_up=None,
                full_backfill=None) -> GateMeasurement:
    return GateMeasurement("g2", "g1", "map", [list(v) for v in verdicts], predicted, serving_quality, unmeasured,
                           p_up, full_backfill)


INCOMPATIBLE = ("g1", False, "below the compatibility criterion: M(g2 → g1) = 0.94 vs 0.96")


def test_passing_checks_deploy():
    m = measurement([("g1", True, "compatible: …")], predicted=0.90, serving_quality=0.90)
    decision = decide(m, GateSpec())
    assert decision.passed and decision.action == "deploy" and decision.describe() == "gate of g2: passed"


def test_a_failed_criterion_takes_the_configured_action_and_names_the_pair():
    m = measurement([("g0", True, "compatible"), ("g1", False, "below the compatibility criterion: M(g2 → g1) = 0.94 vs 0.96")],
                    predicted=0.99, serving_quality=0.90)
    for action in ("hold", "full_backfill", "force"):
        decision = decide(m, GateSpec(action=action))
        assert decision.action == action and decision.failures == ("g2 → g1: below the compatibility criterion: "
                                                                   "M(g2 → g1) = 0.94 vs 0.96",)
    assert decide(m, GateSpec(criterion=False)).passed  # the criterion can be switched off


@pytest.mark.parametrize("predicted, tolerance, passes", [(0.8999, 0.0, False), (0.90, 0.0, True), (0.88, 0.02, True),
                                                          (0.8799, 0.02, False)])
def test_the_quality_check_allows_the_configured_drop(predicted, tolerance, passes):
    decision = decide(measurement(predicted=predicted, serving_quality=0.90), GateSpec(max_quality_drop=tolerance))
    assert decision.passed is passes
    if not passes:
        assert f"served mAP after the plan {predicted:.4f} < {0.90 - tolerance:.4f}" in decision.failures[0]


@pytest.mark.parametrize("predicted, se, sigmas, passes", [(0.8995, 0.001, 2.0, True), (0.8979, 0.001, 2.0, False),
                                                         (0.8995, 0.001, 0.0, False), (0.8995, None, 2.0, False),
                                                         (0.8979, 0.0011, 2.0, True)])
def test_a_drop_within_the_samples_noise_is_not_one(predicted, se, sigmas, passes):
    """The quality check holds only a drop below the floor by more than ``noise_sigmas`` paired
    standard errors; ``noise_sigmas: 0`` (or an unmeasured error) holds any drop."""
    m = GateMeasurement("g2", "g1", "map", [], predicted, 0.90, served_now=0.90, predicted_se=se)
    decision = decide(m, GateSpec(noise_sigmas=sigmas))
    assert decision.passed is passes
    if not passes:
        noise = f" − {sigmas:g} × SE {se:.4f}" if sigmas and se else ""
        assert decision.failures == (f"served mAP after the plan {predicted:.4f} < 0.9000{noise} "
                                     "(g1 serves 0.9000, max_quality_drop 0)",)


def test_a_drop_let_through_as_noise_is_said():
    def note(m, spec=None):
        spec = spec if spec is not None else GateSpec()
        return drop_within_noise(m, spec, decide(m, spec))

    within = GateMeasurement("g2", "g1", "map", [], 0.8995, 0.90, served_now=0.90, predicted_se=0.001)
    assert note(within) == ("gate of g2: served mAP after the plan 0.8995, 0.0005 below what g1 serves (0.9000), "
                            "within the sample's noise (2 × SE 0.0010, gate.noise_sigmas): not held for it")
    assert note(dataclasses.replace(within, predicted=0.90)) is None  # no drop
    assert note(within, GateSpec(max_quality_drop=0.001)) is None  # a drop the spec allows
    assert note(dataclasses.replace(within, predicted=0.897)) is None  # held instead
    assert note(within, GateSpec(noise_sigmas=0)) is None  # held instead
    # escalated to a full backfill: the note is about the gallery it deploys, the fully re-embedded one
    escalated = GateMeasurement("g2", "g1", "map", [["g1", False, "below the criterion"]], 0.89, 0.90,
                                full_backfill=0.896, predicted_se=0.001, full_backfill_se=0.003)
    assert note(escalated, GateSpec(action="full_backfill")) == (
        "gate of g2: a full backfill would serve 0.8960, 0.0040 below what g1 serves (0.9000), within the "
        "sample's noise (2 × SE 0.0030, gate.noise_sigmas): not held for it")
    assert note(escalated, GateSpec(action="force")) is None  # forced: the failure is recorded instead


def test_a_gate_measured_before_the_standard_errors_says_any_drop_holds():
    old = GateMeasurement("g2", "g1", "map", [], 0.8995, 0.90)  # no predicted_se: recorded by an earlier version
    assert not decide(old, GateSpec()).passed
    assert noise_unmeasured(old, GateSpec()) == ("gate of g2: the sample's noise was not measured (a gate recorded "
                                                 "before this version, or fewer than two scored queries): any drop "
                                                 "below the floor holds")
    assert noise_unmeasured(old, GateSpec(noise_sigmas=0)) is None
    assert noise_unmeasured(dataclasses.replace(old, predicted_se=0.001), GateSpec()) is None
    assert noise_unmeasured(measurement(unmeasured="no labels"), GateSpec()) is None


def test_the_escalated_full_backfill_is_held_to_the_floor_with_its_own_noise():
    failed = [("g1", False, "below the compatibility criterion")]
    within = GateMeasurement("g2", "g1", "map", [list(v) for v in failed], 0.90, 0.90, full_backfill=0.897,
                             full_backfill_se=0.002)
    assert decide(within, GateSpec(action="full_backfill")).action == "full_backfill"
    beyond = dataclasses.replace(within, full_backfill_se=0.001)
    decision = decide(beyond, GateSpec(action="full_backfill"))
    assert decision.action == "hold"
    assert decision.failures[-1] == "a full backfill would serve mAP 0.8970 < 0.9000 − 2 × SE 0.0010 as well"


def test_an_unmeasured_quality_checks_the_criterion_only():
    m = measurement([("g1", True, "compatible")], unmeasured="the gallery has no labels")
    assert decide(m, GateSpec()).passed
    assert not decide(measurement([("g1", False, "no common distance")], unmeasured="x"), GateSpec()).passed


def test_the_measurement_round_trips_through_json():
    m = measurement([("g1", False, "why")], predicted=0.5, serving_quality=0.6)
    assert GateMeasurement.from_json(json.loads(json.dumps(m.to_json()))) == m


@pytest.mark.parametrize("gain, floor, passes", [(-0.78, -0.2, False), (-0.2, -0.2, True), (-0.034, -0.05, True),
                                                 (-0.78, None, True), (None, -0.2, True)])
def test_the_own_quality_check_holds_p_up_to_min_p_up_when_asked(gain, floor, passes):
    m = GateMeasurement("g2", "g1", "map", [], 0.9, 0.9, "", p_up=gain)
    decision = decide(m, GateSpec(min_p_up=floor))
    assert decision.passed is passes  # None floor: off; None P_up: not measured, which the runner says
    if not passes:
        assert decision.failures == (f"own mAP against the unaligned reference: P_up {gain:+.3f} < min_p_up {floor:g}",)
    assert GateMeasurement.from_json({k: v for k, v in m.to_json().items() if k != "p_up"}).p_up is None  # older gates


@pytest.mark.parametrize("full, tolerance, escalates", [(0.905, 0.0, False), (0.912, 0.0, True), (0.905, 0.01, True),
                                                        (0.069, 0.0, False), (None, 0.0, True)])
def test_a_full_backfill_deploys_only_when_the_fully_reembedded_gallery_holds_the_floor(full, tolerance, escalates):
    """The default pipeline's g2 (a full re-embed serves 0.905 where g1 serves 0.912) and the shapes'
    (0.069 against 0.314) were deployed by the escalation before; None: a gate measured before the
    figure was recorded (the runner says it was not checked)."""
    m = measurement([INCOMPATIBLE], predicted=0.80, serving_quality=0.912, full_backfill=full)
    decision = decide(m, GateSpec(action="full_backfill", max_quality_drop=tolerance))
    criterion = f"g2 → g1: {INCOMPATIBLE[2]}"
    mixed = f"served mAP after the plan 0.8000 < {0.912 - tolerance:.4f} (g1 serves 0.9120, max_quality_drop {tolerance:g})"
    if escalates:
        assert decision.action == "full_backfill" and decision.failures == (criterion, mixed)
    else:
        assert decision.action == "hold"
        assert decision.failures == (criterion, mixed, f"a full backfill would serve mAP {full:.4f} < "
                                                       f"{0.912 - tolerance:.4f} as well")
    for action in ("hold", "force"):  # the figure only bounds the escalation
        assert decide(m, GateSpec(action=action, max_quality_drop=tolerance)).action == action


def test_a_full_backfill_does_not_mend_the_generations_own_quality():
    m = measurement([INCOMPATIBLE], predicted=0.95, serving_quality=0.90, p_up=-0.4, full_backfill=0.95)
    decision = decide(m, GateSpec(action="full_backfill", min_p_up=-0.2))
    assert decision.action == "hold"
    assert decision.failures[-1] == "own mAP against the unaligned reference: P_up -0.400 < min_p_up -0.2"
    assert len(decision.failures) == 2  # the criterion's, then the own quality's, named once
    assert decide(m, GateSpec(action="full_backfill")).action == "full_backfill"  # min_p_up off


def test_a_gate_measured_before_the_full_backfill_figure_reads_as_unmeasured():
    m = measurement([INCOMPATIBLE], predicted=0.5, serving_quality=0.6, full_backfill=0.7)
    older = {k: v for k, v in m.to_json().items() if k != "full_backfill"}
    assert GateMeasurement.from_json(older).full_backfill is None
    assert GateMeasurement.from_json(json.loads(json.dumps(m.to_json()))) == m


def test_a_backfill_that_serves_below_no_backfill_is_noted_not_failed():
    """The default run's g2 before the least_compatible order: 0.9281 planned, 0.9312 with nothing
    re-embedded, both above what g1 serves (0.9118): deployed, with the note."""
    wasted = GateMeasurement("g2", "g1", "map", [], predicted=0.9281, serving_quality=0.9118, no_backfill=0.9312)
    assert decide(wasted, GateSpec()).passed
    assert wasted_backfill(wasted) == ("gate of g2: the planned backfill serves mAP 0.9281, below the 0.9312 of "
                                       "re-embedding nothing; another backfill.order or budget would serve better")
    for predicted, nothing in ((0.9667, 0.9312), (0.9312, 0.9312), (0.9281, None), (None, 0.9312)):
        m = GateMeasurement("g2", "g1", "map", [], predicted=predicted, serving_quality=0.9118, no_backfill=nothing)
        assert wasted_backfill(m) is None
    older = {**wasted.to_json()}
    del older["no_backfill"]  # a gate measured before the field was recorded
    assert wasted_backfill(GateMeasurement.from_json(older)) is None
