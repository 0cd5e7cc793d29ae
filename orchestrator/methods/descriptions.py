"""The torch-free half of every built-in method: its hyperparameters (``Params``, pydantic, the
papers' defaults) and the traits a pipeline file's validation reads (``name``, ``summary``, the
parent and ``embed_dim`` rules, the embedding ``space``).

Each method class in this package derives from its description here (``HBCT(HBCTDescription,
CompatibilityMethod)``), so a trait is written once; ``orchestrator.methods.registry`` looks a
built-in description up by name without importing the method's module, and with it torch
(``orchestrator run`` of a file with an error answers before torch is imported). A plug-in
method's class is its own description (``register_method``).
"""
from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import Any, ClassVar, Literal, Mapping

from pydantic import BaseModel, ConfigDict, Field, model_validator

from orchestrator import limits
from orchestrator.geometry.spaces import Space


class MethodParams(BaseModel):
    """Base class of every method's typed hyperparameters: unknown fields are errors."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class FlatParams(MethodParams):
    """space: ``cosine`` (the Euclidean baselines of HBCT: linear softmax training, cosine
    retrieval) or ``euclidean`` (L2 retrieval)."""

    space: Literal["cosine", "euclidean"] = "cosine"


class SupervisedParams(FlatParams):
    """Space settings of methods that also train in the Lorentz space.

    space: as ``FlatParams``, or ``lorentz`` (HBCT's φ_o / φ_* hyperbolic models: √d rescale,
           clip ζ, exp map, Lorentz MLR head; hbct.md §3-§4).
    curv:  curvature magnitude K of the Lorentz space (ignored by flat spaces).
    clip:  the norm clip ζ of the Lorentz lift (old model ζ_o = 1.0; new models ζ_n = ζ_o + 0.2).
    """

    space: Literal["cosine", "euclidean", "lorentz"] = "cosine"
    curv: float = Field(1.0, gt=0)
    clip: float = Field(1.0, gt=0)


class PrototypePerturbationParams(FlatParams):
    """Settings shared by NDPP and ODPP (spec §7): flat spaces only (prototypes are compared by
    cosine); lam: weight λ of the compatibility loss (Eq. 3); tau: temperature τ of Eq. 6."""

    lam: float = Field(1.0, ge=0)
    tau: float = Field(0.07, gt=0)


class AdvBCTParams(FlatParams):
    """boundary_weight:      weight μ of the elastic-boundary term.
    adversarial_weight:   weight λ of the adversarial term, on top of its epoch decay (E − e + 1)/E.
    grl_gamma:            γ of the gradient-reversal schedule α(p) = 2/(1 + e^{−γp}) − 1.
    discriminator_hidden: width of D's hidden layer.
    iqr_factor:           Tukey fence f of the old radii.
    threshold:            T, the radius the elastic boundary moves towards (chord distances of
                          unit vectors lie in [0, 2]).
    boundary_classes:     which classes get a boundary: "all" (every class with training images,
                          those the old model never saw synthesised from its embeddings of their
                          images) or "seen" (the old model's classes only, as the released code's
                          old "meta").
    adversarial_warmup:   the fraction of the epochs before the gradient reversal acts (α = 0: D
                          learns, the encoder feels nothing); the ramp α(p) then runs over the
                          remaining epochs. 0: the released code's ramp from the first step.
    reversal_clip:        ρ: the reversed gradient reaching the new embeddings is scaled down, per
                          batch, to at most ρ times the norm of the cross-entropy's gradient there.
                          None: unclipped, as released.

    Decision: μ = λ = 1 (the code adds both terms unweighted), γ = 10 (the code's, DANN's), a
    100-unit hidden layer and f = 1.5 are the released code's values (the spec gives none).
    Decision: T = 0.5, the benchmark library's default (``configs/defaults.py``,
    ``TRAIN.THRESHOLD``); its GLDv2 AdvBCT config raises it to 1.0. On the bundled digits (old
    classes 0-4, 12 epochs, seeds 0/1/2) T = 1.0 left the cross-test mAP at +0.018 / −0.002 /
    +0.026 over the old self-test, T = 0.5 at +0.055 / +0.023 / +0.043: the looser boundary lets
    the new classes drift.
    Decision (issue 38): the released schedule stays the default. The warm-up and the clip are
    there for a training from scratch (a fresh encoder's embeddings barely spread, so D's BatchNorm
    makes the reversed gradient largest when the encoder has learned least); w = 0.25, ρ = 0.5
    measured on the digits at 4 epochs over 10 seeds: no seed collapsed with either schedule, and
    the mean P_up (CMC@1 / mAP) was −0.08 / −0.24 against the released −0.06 / −0.22 (cross mAP
    0.504 against 0.538), so it is not the default (benchmarks/README.md, ``seed_collapse.py``).
    """

    boundary_weight: float = Field(1.0, ge=0)
    adversarial_weight: float = Field(1.0, ge=0)
    threshold: float = Field(0.5, gt=0)
    grl_gamma: float = Field(10.0, ge=0)
    discriminator_hidden: int = Field(100, ge=1, le=limits.MAX_EMBED_DIM)
    iqr_factor: float = Field(1.5, ge=0)
    boundary_classes: Literal["all", "seen"] = "all"
    adversarial_warmup: float = Field(0.0, ge=0, lt=1)
    reversal_clip: float | None = Field(None, gt=0)


class BCTParams(FlatParams):
    """lam: weight λ of the influence loss. BCT needs a linear old classifier, so flat spaces only."""

    lam: float = Field(1.0, ge=0)


class BinaryHyperbolicParams(MethodParams):
    """curv:             c, the ball has curvature −c and radius 1/√c (paper: c = 0.1).
    prototype_radius: Euclidean norm r of every prototype in that ball; must be < 1/√c.
                      Default 1.0 (r² = 1, the best cell of Tables 4/10 with c = 0.1).
    num_prototypes:   number of pre-allocated prototypes K (None: the generation's class count).
                      A lifelong pipeline sets the same K ≥ every generation's class count.
    temperature:      divides the distances inside the softmax (1.0 = as printed, eq. 30).
    lam:              weight of the optional alignment term mean_i d_c(h_n,i, h_o,i) to a parent
                      (0.0 = off: shared prototypes already make generations compatible).
    clip:             optional norm clip of the tangent vector before exp_0 (None = as printed).
    """

    curv: float = Field(0.1, gt=0)
    prototype_radius: float = Field(1.0, gt=0)
    num_prototypes: int | None = Field(None, ge=2, le=limits.MAX_CLASSES)
    temperature: float = Field(1.0, gt=0)
    lam: float = Field(0.0, ge=0)
    clip: float | None = Field(None, gt=0)

    @model_validator(mode="after")
    def _prototypes_inside_ball(self) -> "BinaryHyperbolicParams":
        ball_radius = 1.0 / math.sqrt(self.curv)
        if not self.prototype_radius < ball_radius:
            raise ValueError(
                f"prototype_radius must be < 1/sqrt(curv) = {ball_radius:.6g} (the ball radius), "
                f"got prototype_radius={self.prototype_radius!r} with curv={self.curv!r}"
            )
        return self


class DSimplexParams(MethodParams):
    """Hyperparameters of d-Simplex(-HOC) (stationary_dsimplex.md §4, §5, §7.3).

    num_prototypes:   K, the number of pre-allocated prototypes; the embedding must be K − 1
                      dimensional. The paper uses K = 1024; None means embed_dim + 1.
    normalization:    ``unit`` rows (released code, default) or ``frobenius`` (paper App. D, rows
                      of norm 1/√K) — §11 item 1.
    lam:              weight λ of the stationary CE in L_HOC (1 − λ goes to InfoNCE), eq. 3.
    tau:              the factor that MULTIPLIES the cosine in InfoNCE (inverse temperature), eq. 5.
    class_assignment: ``right_to_left`` maps class y to prototype K − 1 − y (fine-tuning classes,
                      §4.3, the code's ``target = K − 1 − y``); ``left_to_right`` maps y to y
                      (pre-training classes). Every generation of one lineage must keep the index
                      sets it uses disjoint from those of models it replaces.
    """

    num_prototypes: int | None = Field(None, ge=2, le=limits.MAX_CLASSES)
    normalization: Literal["unit", "frobenius"] = "unit"
    lam: float = Field(0.1, ge=0, le=1)
    tau: float = Field(10.0, gt=0)
    class_assignment: Literal["right_to_left", "left_to_right"] = "right_to_left"


class FCTParams(FlatParams):
    """Hyperparameters of FCT's forward transformation (lambda_orthogonality.md §5, §10 item 18).

    space:       retrieval space, ``cosine`` (default, as the other flat baselines here) or
                 ``euclidean``.
    form:        ``mlp`` (default) F(x) = W2 relu(W1 x + b1) + b2, or ``affine`` F(x) = W x + b.
                 Decision (§10 item 18 leaves MLP vs affine open): the MLP, because FCT's reference
                 transformation is an MLP (``apple/ml-fct``: two projection blocks and an inner
                 MLP of width 2048, with BatchNorm) and a non-linear F is what distinguishes FCT
                 from λ-orthogonality's affine F; here reduced to two linear layers without
                 BatchNorm (``MLPAdapter``). ``affine`` is the one-layer ablation (identity init).
                 No side-information (§10 item 18): FCT's optional side-info comes from a
                 separately trained self-supervised model this project does not have; F sees the
                 old embedding only, as λ-orthogonality's FCT baseline is described (§5).
    hidden_dim:  width of the MLP's hidden layer (``form="mlp"`` only). Decision: 512 — FCT's
                 reference uses 2048 for 128-d embeddings (16×); 512 is 16× the 32-d embeddings of
                 this project's default experiments, and the fit stays cheap on CPU.
    adapter_epochs, adapter_lr, adapter_batch_size: the fit of F, Adam with a constant learning
                 rate (lr 1e-3, λ-orthogonality's adapter value; FCT's reference uses 5e-4 with a
                 cosine schedule and warm-up over 80 epochs of images), 80 passes over the
                 training embeddings (FCT's epoch count) in shuffled minibatches of 256.
    normalize_inputs: L2-normalise the old embeddings before F (inside the stored map, so a gallery
                 gets the same treatment) and the new targets in L_F. None (default) = True in the
                 cosine space — cosine retrieval ranks directions only, so L_F should not fit norms
                 — and False in the euclidean space, where the new queries keep their scale.
    """

    form: Literal["mlp", "affine"] = "mlp"
    hidden_dim: int = Field(512, ge=1, le=limits.MAX_EMBED_DIM)
    adapter_epochs: int = Field(80, ge=1, le=limits.MAX_EPOCHS)
    adapter_lr: float = Field(1e-3, gt=0)
    adapter_batch_size: int = Field(256, ge=2, le=limits.MAX_BATCH_SIZE)
    normalize_inputs: bool | None = None

    def inputs_normalized(self) -> bool:
        """Whether F works on L2-normalised embeddings (resolves the ``None`` default)."""
        return self.space == "cosine" if self.normalize_inputs is None else self.normalize_inputs


Distance = Literal["geodesic", "lorentz_inner", "squared"]


class HBCTParams(MethodParams):
    """HBCT hyperparameters: the paper's (hbct.md §9), and a learned logit scale where the paper
    leaves the MLR's scale open (issue 14; ``mlr_learn_scale: false`` is the paper's fixed scale).

    curv:          curvature magnitude K of the Lorentz space (the space has curvature −K).
    clip:          norm clip ζ of the lift after the √d rescale. Default 1.2 = the new-model ζ_n =
                   ζ_o + 0.2; a first (old) generation should set 1.0 (ζ_o). Multi-generation
                   pipelines may grow it (ζ_t = 1.0 + 0.2·t, hbct.md §14).
    lam:           λ, weight of the whole alignment part.
    entail_weight: λ_entail, relative weight of the entailment term inside λ (Fig. 7c).
    entail:        False drops the entailment term (Table 2's "w/o entail" rows).
    min_radius:    ε of the cone half-aperture (eq. 11).
    beta:          β of RINCE (eq. 12).
    tau:           temperature τ dividing the distances inside the contrastive exponentials.
    contrastive:   "rince" (HBCT) or "infonce" (Table 2 ablation).
    q_min:         floor on RINCE's q = Uncertainty(h_o). ``rince_loss`` is finite for every q ≥ 0
                   (q = 0 is InfoNCE), so the floor is not needed for stability; it only keeps very
                   certain old embeddings (possible for K ≠ 1 or large ζ_o) on the RINCE side of
                   the InfoNCE limit. With K = 1, ζ_o = 1, q ≥ 0.238 and the floor never binds.
    mlr_init_scale: multiplier s of the Lorentz MLR's class-normal init U(-s/√d, s/√d) (``LorentzMLR``).
                   The MLR logits are linear in ‖z_c‖ and the embeddings lie within ζ of the origin,
                   so s is the initial logit scale; the paper leaves the init open.
    mlr_learn_scale: learn one logit scale t shared by all classes (``LorentzMLR(learn_scale=True)``:
                   logits × exp(log t), log t from 0, clamped at ln mlr_max_scale), as MERU learns its
                   scales. Fills in a choice the paper leaves open (it names no learned scale,
                   hbct.md §15 item 2); eq. 9 is unchanged (t rescales every ‖z_c‖ alike). Default
                   True: the paper's fixed scale collapses at short budgets on many classes
                   (benchmarks/README.md, issue 14, round 4).
    mlr_max_scale: the ceiling of that learned scale t (MERU / CLIP: 100). Default 1.5, the ceiling of
                   an aligned generation (and of φ_*, its recipe without alignment); a parent-free
                   first generation should set ``HBCT.PARENT_FREE_MAX_SCALE`` (3.0), as it sets clip
                   1.0, and ``HBCT.own_parent()`` does.
    lam_warmup:    fraction f of the training's epochs over which λ ramps linearly from 0: at
                   0-based epoch e of E, λ_e = λ · min(1, e / (f·E)); 0 (the paper) keeps λ
                   constant. Fills in a choice the paper leaves open (it gives no schedule of λ).
    distance:      the (dis)similarity inside the contrastive term (Table 5): "geodesic" d_L,
                   "squared" Lorentz distance ‖x−y‖²_L = −2/K − 2⟨x,y⟩_L, or "lorentz_inner"
                   −⟨x,y⟩_L − 1/K (see ``contrastive_distances``).
    """

    curv: float = Field(1.0, gt=0)
    clip: float = Field(1.2, gt=0)
    lam: float = Field(0.3, ge=0)
    entail_weight: float = Field(1.0, ge=0)
    entail: bool = True
    min_radius: float = Field(0.1, gt=0)
    beta: float = Field(0.01, gt=0, le=1)
    tau: float = Field(0.5, gt=0)
    contrastive: Literal["rince", "infonce"] = "rince"
    q_min: float = Field(1e-3, ge=0, le=1)
    distance: Distance = "geodesic"
    mlr_init_scale: float = Field(1.0, gt=0)
    mlr_learn_scale: bool = True
    mlr_max_scale: float = Field(1.5, ge=1)
    lam_warmup: float = Field(0.0, ge=0, le=1)


class HOCParams(FlatParams):
    """lam: weight λ of the cross-entropy (1 − λ goes to InfoNCE); tau: the factor that MULTIPLIES
    the cosine (an inverse temperature: τ = 10 ≡ temperature 0.1), stationary_dsimplex.md eq. 5.

    Decision: λ = 0.9, not the paper's 0.1 (stationary_dsimplex.md §7.3), which weights the
    InfoNCE term nine times the cross-entropy for FINE-TUNING a strong pre-trained model. A new
    model trained from its own initialisation against an old model that saw half the classes
    cannot meet that term, and imitates the old model: on ``shapes-60`` at 4 epochs (5 seeds) its
    self mAP was 0.129 against φ_*'s 0.284 (P_up −0.54); λ 0.5 gave P_up −0.43, λ 0.9 keeps the new
    model at φ_*'s quality and passes the criterion (docs/methods.md, benchmarks/README.md)."""

    lam: float = Field(0.9, ge=0, le=1)
    tau: float = Field(10.0, gt=0)


class HotRefreshParams(FlatParams):
    """lam: weight of the contrastive term; tau: temperature (HBCT's grid τ ∈ {0.5, 1.0})."""

    lam: float = Field(1.0, ge=0)
    tau: float = Field(0.5, gt=0)


class L2Params(SupervisedParams):
    """lam: weight λ of the regression term (HBCT tunes it in [0, 1])."""

    lam: float = Field(1.0, ge=0)


class LambdaOrthParams(FlatParams):
    """Hyperparameters of the λ-orthogonality adapter stage (lambda_orthogonality.md §2.9, §3, §10).

    space:           retrieval space of the generation, ``cosine`` (default) or ``euclidean``.
                     Decision (§10 item 12 leaves L2 vs cosine open): cosine, as for the other
                     flat baselines here; B_⊥ has no bias, so it preserves both distances anyway.
    variant:         ``orthogonal`` (B_⊥, same-distribution adapter data) or ``lambda`` (B_λ,
                     downstream adaptation).
    lam:             λ, the THRESHOLD on D = ‖WWᵀ − I‖_F below which L_λ switches off (not a weight;
                     paper default 12). Used by ``variant="lambda"`` only.
    alpha:           sigmoid steepness α of the gate (not in the paper, §10 item 1). Decision: 10.0,
                     chosen on synthetic problems whose unregularised optimum is far from orthogonal
                     (target map 2-4× scaling, n = 16-64, D* = 17-64 ≫ λ = 12, all loss terms on,
                     unnormalised inputs): with α ≥ 5 the final D settles just below λ (11.5-11.8;
                     Table 12 reports 12.05) and closer to λ as α grows, while α ≤ 2 lets a strong
                     data pull escape the gate (64-d 3× map: D → 31+), since the gate's largest
                     slope, ≈ 1/2 + αλ/4 at D ≈ λ, is what holds D back. 10 doubles the margin of 5.
    w_forward, w_backward, w_contrastive: w1, w2, w3 of eq. 10 (not in the paper; 1.0 each, §10
                     item 2). The weight of L_λ is 1 (paper, App. F).
    contrastive_tau: temperature τ of eq. 8 (divides the cosine); 0.1, StableRep's default (not in
                     the paper).
    adapter_epochs, adapter_lr, adapter_batch_size: the adapter optimisation, Adam with lr 1e-3
                     (paper); epochs and batch size are not in the paper (30 and 256 here).
    normalize_inputs: L2-normalise both models' embeddings before the adapters (and inside the
                     stored maps, so queries get the same treatment). None (default) = True in the
                     cosine space — cosine retrieval ranks directions only, and a parent with raw
                     (un-normalised) cosine embeddings, e.g. dsimplex, would otherwise make the MSE
                     terms fit norms retrieval ignores — and False in the euclidean space, where L2
                     retrieval against the untouched old gallery needs the raw scale.
    procrustes_init: start B_⊥ at the minimiser of L_B over rotations (orthogonal Procrustes /
                     Kabsch on the common prefix) instead of the identity (§10 item 8 leaves the
                     init open). Decision: on, because gradient descent on P = U − Uᵀ from P = 0
                     stalls before rotation angles near π, where expm's differential becomes
                     singular (eigenvalues of P 2π apart): on a random 16-d rotation it stopped at
                     ‖B − R‖_F ≈ 1.8 even with L_B alone. B_λ always starts at the identity.
    """

    variant: Literal["orthogonal", "lambda"] = "orthogonal"
    lam: float = Field(12.0, ge=0)
    alpha: float = Field(10.0, gt=0)
    w_forward: float = Field(1.0, ge=0)
    w_backward: float = Field(1.0, ge=0)
    w_contrastive: float = Field(1.0, ge=0)
    contrastive_tau: float = Field(0.1, gt=0)
    adapter_epochs: int = Field(30, ge=1, le=limits.MAX_EPOCHS)
    adapter_lr: float = Field(1e-3, gt=0)
    adapter_batch_size: int = Field(256, ge=2, le=limits.MAX_BATCH_SIZE)
    normalize_inputs: bool | None = None
    procrustes_init: bool = True

    def inputs_normalized(self) -> bool:
        """Whether the adapters work on L2-normalised embeddings (resolves the ``None`` default)."""
        return self.space == "cosine" if self.normalize_inputs is None else self.normalize_inputs


class LCEParams(FlatParams):
    """lam:             weight λ of the ArcFace term through the old class centres.
    boundary_weight: weight μ of the angular boundary term.
    scale, margin:   ArcFace s and m.
    iqr_factor:      Tukey fence f of the old radii.

    Decision: every default is the AdvBCT benchmark's, which holds the released LCE baseline (the
    spec gives none): λ = μ = 1 (its terms are added unweighted), s = 30, m = 0.3 (``LOSS.SCALE``,
    ``LOSS.MARGIN``), f = 1.5 (``extract_feat.py``). On the bundled digits these defaults are
    compatible at 12 epochs (tests/evaluation/test_learning_compatibility.py).
    """

    lam: float = Field(1.0, ge=0)
    boundary_weight: float = Field(1.0, ge=0)
    scale: float = Field(30.0, gt=0)
    margin: float = Field(0.3, ge=0, lt=math.pi)
    iqr_factor: float = Field(1.5, ge=0)


class NDPPParams(PrototypePerturbationParams):
    """k: neighbours K for both the old (Eq. 4) and the new (Eq. 7) step (spec §13.5: one K),
    clamped to the number of other classes with training images;
    alpha_old / alpha_new: scales α1 (Eq. 5) and α2 (Eq. 8);
    cumulative: Algorithm 1's in-place update p̂ ← p̂ + α2 r_t instead of Eq. 8 (spec §13.3);
    new_perturbation: False gives the "NDPP-old" ablation (Eq. 5 positives for every epoch);
    skip_first_epoch_new: skip r_t at epoch 0, where the new model is untrained (spec §13.6)."""

    k: int = Field(100, ge=1, le=limits.MAX_TOP_K)
    alpha_old: float = Field(0.01, ge=0)
    alpha_new: float = Field(0.01, ge=0)
    cumulative: bool = False
    new_perturbation: bool = True
    skip_first_epoch_new: bool = False


class ODPPParams(PrototypePerturbationParams):
    """theta_old / theta_new: hinge thresholds θ_old, θ_new (spec §13.12: 0.6 both);
    gamma: weight γ of the old-new term (Eq. 11);
    inner_epochs / inner_lr / inner_batch: the inner SGD over r (50 epochs, lr 1e-3, 1024 pairs);
    max_pairs_per_epoch: cap on the pairs drawn per inner epoch (None = N_img, the number of
    training images, as in the paper; set it for CPU runs);
    new_term: False gives the "ODPP-old" ablation (Eq. 9 only);
    seed: seeds the generator that draws the inner pairs."""

    theta_old: float = 0.6
    theta_new: float = 0.6
    gamma: float = Field(1.0, ge=0)
    inner_epochs: int = Field(50, ge=0, le=limits.MAX_EPOCHS)
    inner_lr: float = Field(1e-3, gt=0)
    inner_batch: int = Field(1024, ge=1, le=limits.MAX_BATCH_SIZE)
    max_pairs_per_epoch: int | None = Field(None, ge=1, le=limits.MAX_STEPS)
    new_term: bool = True
    seed: int = 0


class UniBCTParams(FlatParams):
    """lam:           weight λ of the ArcFace compatibility term.
    scale, margin: ArcFace s and m.
    neighbours:    k, the same-class neighbours each old embedding draws from.
    temperature:   τ of the neighbour weights softmax(cos / τ).
    steps:         propagation steps T (0: plain normalised class means, no refinement).

    Decision: λ = 1, s = 30, m = 0.3 are the AdvBCT benchmark's ``uni_bct`` settings (its term is
    added unweighted; ``LOSS.SCALE``, ``LOSS.MARGIN``).
    Decision: k = 10, a neighbourhood small against a class (tens to thousands of items) yet
    enough to average out one noisy neighbour; τ = 0.1, the temperature of the library's other
    cosine softmaxes (HOC's inverse temperature 10); T = 1, one smoothing step. None is released.
    On the bundled digits (few outliers) the refinement moves the compatibility margin within
    seed noise: mAP cross − old self +0.105 with T = 0, +0.108 with k = 5, +0.099 with τ = 0.5
    (one seed each).
    """

    lam: float = Field(1.0, ge=0)
    scale: float = Field(30.0, gt=0)
    margin: float = Field(0.3, ge=0, lt=math.pi)
    neighbours: int = Field(10, ge=1, le=limits.MAX_TOP_K)
    temperature: float = Field(0.1, gt=0)
    steps: int = Field(1, ge=0, le=limits.MAX_STEPS)


class MethodDescription(ABC):
    """A method's name, hyperparameters and traits; an instance holds validated parameters.

    Subclasses set ``name``, ``Params``, ``summary`` and the traits below, and implement ``space``;
    ``orchestrator.methods.base.CompatibilityMethod`` documents the traits and adds the training.
    """

    name: ClassVar[str]
    Params: ClassVar[type[MethodParams]] = MethodParams
    summary: ClassVar[str] = ""
    requires_parent: ClassVar[bool] = True
    requires_parent_embed_dim: ClassVar[bool] = True
    requires_embed_dim_at_least_parents: ClassVar[bool] = False
    replacement_keeps_parent_embed_dim: ClassVar[bool] = False
    #: False for a method that fits only a map to the parent on a given, frozen encoder (the
    #: post-hoc methods, ``orchestrator.methods.posthoc``): it has no training epochs.
    trains_encoder: ClassVar[bool] = True
    #: Parameters that act only when a parent is given (alignment weights): a parent-free method's
    #: old model and reference φ_* set them to their defaults, so variants of one method that differ
    #: only there share their old model and φ_* (``CompatibilityMethod.own_reference``).
    parent_only_params: ClassVar[tuple[str, ...]] = ()

    def __init__(self, params: MethodParams | Mapping[str, Any] | None = None):
        if isinstance(params, MethodParams):
            if not isinstance(params, self.Params):
                raise TypeError(
                    f"method {self.name!r} expects {self.Params.__name__}, got {type(params).__name__}"
                )
            self.params = params
        else:
            self.params = self.Params.model_validate(dict(params or {}))

    @property
    @abstractmethod
    def space(self) -> Space:
        """The space embeddings live in; retrieval uses its distance."""

    @property
    def curv(self) -> float:
        """Curvature magnitude of a hyperbolic space (ignored by flat spaces)."""
        return float(getattr(self.params, "curv", 1.0))

    def check_embed_dim(self, embed_dim: int) -> None:  # noqa: B027 (optional: by default every size)
        """Raise ValueError (one line) when these parameters cannot build a model whose embedding has
        ``embed_dim`` coordinates; the pipeline file's validation calls it for every generation, so
        the mismatch is refused before any training. Every size by default."""


class FlatDescription(MethodDescription):
    """The methods whose base objective is cross-entropy through their own head (``SupervisedMethod``):
    the space is the ``space`` parameter."""

    Params = FlatParams

    @property
    def space(self) -> Space:
        return Space(self.params.space)


class PrototypePerturbationDescription(FlatDescription):
    """NDPP and ODPP (``PerturbedPrototypeMethod``)."""

    Params = PrototypePerturbationParams
    requires_parent = True
    requires_parent_embed_dim = True  # new embeddings against old prototypes (Eq. 6); D_n must equal D_o


class AdvBCTDescription(FlatDescription):
    """``AdvBCT`` (``orchestrator.methods.advbct``) without torch."""

    name = "advbct"
    summary = "CE + elastic boundary around old class centres + adversarial (gradient-reversal discriminator) alignment"
    Params = AdvBCTParams
    requires_parent_embed_dim = True  # the old class centres bound new embeddings; one discriminator for both


class BCTDescription(FlatDescription):
    """``BCT`` (``orchestrator.methods.bct``) without torch."""

    name = "bct"
    summary = "CE + λ·CE through the frozen old classifier (new classes synthesised from old class means)"
    Params = BCTParams
    requires_parent_embed_dim = True  # the old classifier (C, d_old) is applied to new embeddings


class BinaryHyperbolicDescription(MethodDescription):
    """``BinaryHyperbolic`` (``orchestrator.methods.binary_hyperbolic``) without torch."""

    name = "binary_hyperbolic"
    summary = "softmax over −Poincaré distance to fixed pre-allocated simplex prototypes"
    Params = BinaryHyperbolicParams
    requires_parent = False
    requires_parent_embed_dim = True  # the parent shares the prototypes (check_parent); d_c(h_n, h_o)
    parent_only_params = ("lam",)

    @property
    def space(self) -> Space:
        return Space.POINCARE


class DSimplexDescription(MethodDescription):
    """``DSimplex`` (``orchestrator.methods.dsimplex``) without torch."""

    name = "dsimplex"
    summary = "fixed d-Simplex classifier (stationary CE over all K prototypes) + HOC InfoNCE to the parent"
    Params = DSimplexParams
    requires_parent = False
    requires_parent_embed_dim = True  # the same K (embed_dim = K - 1); InfoNCE between old and new embeddings
    parent_only_params = ("lam", "tau")  # without a parent the objective is the stationary CE alone
    replacement_keeps_parent_embed_dim = True  # one fixed classifier (K prototypes) for the whole chain

    @property
    def space(self) -> Space:
        return Space.COSINE

    def num_prototypes(self, embed_dim: int) -> int:
        """K for an encoder of ``embed_dim``: the configured value, or embed_dim + 1."""
        return self.params.num_prototypes if self.params.num_prototypes is not None else embed_dim + 1

    def check_embed_dim(self, embed_dim: int) -> None:  # noqa: B027 (an optional check: by default every size)
        """The d-Simplex of K prototypes lives in R^(K−1): embed_dim must be num_prototypes − 1."""
        k = self.num_prototypes(embed_dim)
        if embed_dim != k - 1:
            raise ValueError(f"dsimplex needs embed_dim == num_prototypes - 1 = {k - 1} (num_prototypes {k})")


class FCTDescription(FlatDescription):
    """``FCT`` (``orchestrator.methods.fct``) without torch."""

    name = "fct"
    summary = "independent CE model + forward transformation F (MLP) fitted old → new by MSE"
    Params = FCTParams
    requires_parent = True
    requires_parent_embed_dim = False  # F maps the parent's d dimensions to this generation's n


class HBCTDescription(MethodDescription):
    """``HBCT`` (``orchestrator.methods.hbct``) without torch."""

    name = "hbct"
    summary = "Lorentz MLR + λ(entailment cone at the old embedding + uncertainty-weighted RINCE)"
    Params = HBCTParams
    requires_parent = False
    requires_parent_embed_dim = True  # entailment cone and RINCE between new and old Lorentz points

    @property
    def space(self) -> Space:
        return Space.LORENTZ


class HOCDescription(FlatDescription):
    """``HOC`` (``orchestrator.methods.hoc``) without torch."""

    name = "hoc"
    summary = "λ·CE + (1−λ)·InfoNCE, old embedding as anchor against the new batch"
    Params = HOCParams
    requires_parent_embed_dim = True  # InfoNCE between old and new embeddings


class HotRefreshDescription(FlatDescription):
    """``HotRefresh`` (``orchestrator.methods.hot_refresh``) without torch."""

    name = "hot_refresh"
    summary = "CE + λ·contrastive alignment to old embeddings, different-label negatives from both models"
    Params = HotRefreshParams
    requires_parent_embed_dim = True  # contrastive term between new and old embeddings


class IndependentDescription(FlatDescription):
    """``Independent`` (``orchestrator.methods.independent``) without torch."""

    name = "independent"
    summary = "base cross-entropy only (old models, and the unaligned reference φ*)"
    Params = SupervisedParams
    requires_parent = False
    requires_parent_embed_dim = False  # a parent, if given, takes no part in the loss


class L2RegressionDescription(FlatDescription):
    """``L2Regression`` (``orchestrator.methods.l2``) without torch."""

    name = "l2"
    summary = "CE + λ·‖new − old‖² feature regression"
    Params = L2Params
    requires_parent_embed_dim = True  # ‖new − old‖² regression


class LambdaOrthogonalityDescription(FlatDescription):
    """``LambdaOrthogonality`` (``orchestrator.methods.lambda_orth``) without torch."""

    name = "lambda_orth"
    summary = "independent CE model + backward B (orthogonal or λ-orthogonal) and forward F adapters"
    Params = LambdaOrthParams
    requires_parent = True
    requires_parent_embed_dim = False  # B and F bridge d and n (common prefix m = min(d, n))
    requires_embed_dim_at_least_parents = True  # B(h_n) has min(d, n) coordinates; the parent's index d


class LCEDescription(FlatDescription):
    """``LCE`` (``orchestrator.methods.lce``) without torch."""

    name = "lce"
    summary = "CE + λ·ArcFace through the old class centres + μ·angular boundary of the old classes"
    Params = LCEParams
    requires_parent_embed_dim = True  # ArcFace through, and boundary around, the old class centres


class NDPPDescription(PrototypePerturbationDescription):
    """``NDPP`` (``orchestrator.methods.ndpp``) without torch."""

    name = "ndpp"
    summary = "CE + λ·prototype contrastive loss, positives pushed away from old and new neighbour prototypes"
    Params = NDPPParams


class ODPPDescription(PrototypePerturbationDescription):
    """``ODPP`` (``orchestrator.methods.odpp``) without torch."""

    name = "odpp"
    summary = "CE + λ·prototype contrastive loss, positives perturbed by SGD on a hinge over similar prototype pairs"
    Params = ODPPParams


class UniBCTDescription(FlatDescription):
    """``UniBCT`` (``orchestrator.methods.unibct``) without torch."""

    name = "unibct"
    summary = "CE + λ·ArcFace through structurally refined old prototypes (intra-class kNN propagation)"
    Params = UniBCTParams
    requires_parent_embed_dim = True  # ArcFace through the old prototypes


# name -> (description, the module whose import registers the method)
BUILTIN: dict[str, tuple[type[MethodDescription], str]] = {
    AdvBCTDescription.name: (AdvBCTDescription, "orchestrator.methods.advbct"),
    BCTDescription.name: (BCTDescription, "orchestrator.methods.bct"),
    BinaryHyperbolicDescription.name: (BinaryHyperbolicDescription, "orchestrator.methods.binary_hyperbolic"),
    DSimplexDescription.name: (DSimplexDescription, "orchestrator.methods.dsimplex"),
    FCTDescription.name: (FCTDescription, "orchestrator.methods.fct"),
    HBCTDescription.name: (HBCTDescription, "orchestrator.methods.hbct"),
    HOCDescription.name: (HOCDescription, "orchestrator.methods.hoc"),
    HotRefreshDescription.name: (HotRefreshDescription, "orchestrator.methods.hot_refresh"),
    IndependentDescription.name: (IndependentDescription, "orchestrator.methods.independent"),
    L2RegressionDescription.name: (L2RegressionDescription, "orchestrator.methods.l2"),
    LambdaOrthogonalityDescription.name: (LambdaOrthogonalityDescription, "orchestrator.methods.lambda_orth"),
    LCEDescription.name: (LCEDescription, "orchestrator.methods.lce"),
    NDPPDescription.name: (NDPPDescription, "orchestrator.methods.ndpp"),
    ODPPDescription.name: (ODPPDescription, "orchestrator.methods.odpp"),
    UniBCTDescription.name: (UniBCTDescription, "orchestrator.methods.unibct"),
}
