"""The shipped d-Simplex pipeline (``pipelines/dsimplex_7task.yaml``) on the generated shapes (issue 28).

The file as shipped trains seven d-Simplex-HOC generations on CIFAR-100 and replaces the model at
tasks 3 and 5 by the authors' ImageNet32 checkpoints (stationary_dsimplex.md §6-§7). Neither can be
fetched here, so this benchmark runs the same file through ``orchestrator run`` with:

- the data: the 24-class shapes of ``pipelines/shapes.yaml`` instead of CIFAR-100, in 7 tasks of
  6 + 6 x 3 classes (the file's 10 + 6 x 15), the gallery its held-out-background test split;
- the third-party checkpoints: three stand-ins trained here as the paper's are, with the stationary
  CE alone (Eq. 2) over the same K = 1024 d-Simplex, classes assigned left to right, on classes of
  the 60-class shapes that the pipeline never trains on (12, 24 and 36 of them, as the paper's
  100, 300 and 600 ImageNet32 classes grow), and given to the file as this project's generation
  files (``orchestrator.models.weights.split_encoder_state``: backbone and ``fc1`` projection);
- fewer epochs (``--epochs``, the file's 70; ``--pretrain-epochs``, the paper's 300), on CPU.

Every other field is the file's: ResNet-18 with the ImageNet stem, embed_dim 1023, HOC λ 0.1, τ 10,
20 memory images per earlier class, fine-tuning from the parent, no backfill, the default gate
(mAP criterion against the gallery's generations, and no drop of the served gallery's mAP). With
``--gate-action force`` a failed gate is recorded and the run goes on, so the whole sequence is
measured. Output: every gate's verdict (from ``orchestrator lineage --json``), then, once task 7
is trained, the 7 x 7 compatibility matrices with AC and AM (§8), and the run's exit status.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from orchestrator.data import ImageTensorDataset, LabeledImages, load_source
from orchestrator.data.images import channel_statistics
from orchestrator.lineage.step_keys import StepKind, deploy_key, kind_of
from orchestrator.methods import create_method
from orchestrator.metrics.compatibility import average_compatibility, average_multi_model_accuracy
from orchestrator.models.checkpoint import checkpoint_exists, load_card, save_generation
from orchestrator.models.checkpoint_layout import WEIGHTS_FILE
from orchestrator.models.encoder import EncoderConfig
from orchestrator.training.config import TrainConfig
from orchestrator.training.loop import train_generation

REPO = Path(__file__).resolve().parents[1]
PIPELINE = REPO / "pipelines" / "dsimplex_7task.yaml"
#: The pipeline's data: the 24-class shapes of pipelines/shapes.yaml (6 shapes x 4 fill patterns).
SHAPES_24 = {"num_shapes": 6, "num_patterns": 4, "train_per_class": 120, "test_per_class": 20, "test_styles": 2,
             "seed": 0}
#: The stand-ins' data: the 60-class shapes (10 x 6), of which only classes the pipeline never
#: trains on are used: fill patterns 4-5 of the first 6 shapes, then every pattern of shapes 6-9.
STAND_IN_DATA = {**SHAPES_24, "num_shapes": 10, "num_patterns": 6, "seed": 1}
STAND_IN_CLASSES = [s * 6 + p for s in range(6) for p in (4, 5)] + [s * 6 + p for s in range(6, 10) for p in range(6)]
#: (file generation index, classes) of each stand-in: the 100-, 300- and 600-class models of the paper.
STAND_INS = ((0, 12), (2, 24), (4, 36))
ENCODER = EncoderConfig(arch="resnet18", embed_dim=1023, small_input=False)
#: The paper's pre-training recipe (stationary_dsimplex.md §7.3), but for the epochs.
PRETRAIN = {"batch_size": 128, "optimizer": "sgd", "lr": 0.1, "momentum": 0.9, "weight_decay": 1e-4,
            "schedule": "cosine", "augment": True}


def train_stand_in(images: LabeledImages, num_classes: int, epochs: int, folder: Path, seed: int = 0) -> Path:
    """Pre-train a third-party stand-in on the first ``num_classes`` of ``STAND_IN_CLASSES`` of
    ``images`` (``STAND_IN_DATA``'s training split): the stationary CE alone over the K = 1024
    d-Simplex, classes left to right (§6.1). Returns the path of its weights file (a generation
    file: backbone and 1023-d projection). A stand-in already in ``folder`` whose card records the
    same recipe is kept (so a run at another fine-tuning budget reuses it)."""
    name = f"stand-in-{num_classes}"
    recipe = {"classes": STAND_IN_CLASSES[:num_classes], "epochs": epochs, "seed": seed, **PRETRAIN,
              "data": STAND_IN_DATA}
    if checkpoint_exists(str(folder / name)) and load_card(str(folder / name)).extra == recipe:
        return folder / name / WEIGHTS_FILE
    images = images.subset(np.flatnonzero(np.isin(images.labels, STAND_IN_CLASSES[:num_classes])))
    mean, std = channel_statistics(images)
    method = create_method("dsimplex", {"num_prototypes": 1024, "class_assignment": "left_to_right"})
    torch.manual_seed(seed)
    model = method.build_model(ENCODER, images.num_classes, torch.as_tensor(np.unique(images.labels)))
    train_generation(method, model, ImageTensorDataset(images, 32, mean, std, augment=True),
                     ImageTensorDataset(images, 32, mean, std), TrainConfig(epochs=epochs, seed=seed, **PRETRAIN))
    save_generation(model, method, None, str(folder / name), name, extra=recipe)
    return folder / name / WEIGHTS_FILE


def pipeline_overrides(checkpoints: dict[int, Path], epochs: int, gate_action: str = "hold") -> list[str]:
    """The ``--set`` arguments that run the shipped file on the shapes with ``checkpoints`` (file
    generation index -> stand-in weights), ``epochs`` per task and every gate's ``gate_action``, on CPU."""
    sets = ["ray.use_gpu=false", "ray.gpus_per_worker=0", "ray.cpus_per_worker=2", "ray.dashboard=false",
            "data.source=shapes", f"data.options={json.dumps(SHAPES_24)}", "data.task_splits={first: 6, step: 3}",
            "gallery.name=shapes-test", "gallery.source=null", "gallery.options=null"]
    sets += [f"generations.{i}.{field}" for i in range(7) for field in (f"training.epochs={epochs}",
                                                                         f"gate.action={gate_action}")]
    sets += [f"generations.{i}.model.pretrained={path}" for i, path in sorted(checkpoints.items())]
    return [arg for value in sets for arg in ("--set", value)]


def format_gates(lineage: dict) -> str:
    """Markdown: every gate of ``orchestrator lineage --json``'s steps: the criterion's verdicts
    against the gallery's generations, the served mAP the plan predicts against the serving
    generation's, and what the deploy step did (deployed, forced past failures, held)."""
    steps = {step["key"]: step for step in lineage["steps"]}
    lines = ["| generation | serving | criterion (mAP) | served mAP: predicted / serving (paired SE) | deploy |",
             "|---|---|---|---|---|"]
    for key, step in steps.items():
        if kind_of(key) is not StepKind.GATE or step["status"] != "committed":
            continue
        gate = step["outputs"]
        verdicts = "; ".join(f"→ {gallery}: {'passes' if ok else 'fails'}" for gallery, ok, _why in gate["verdicts"])
        deploy = steps.get(deploy_key(gate["generation"]))
        if deploy is None:
            outcome = "not run"
        elif deploy["status"] == "committed":
            decision = deploy["outputs"]["gate"]
            outcome = "deployed" if not decision["failures"] else f"{decision['action']} ({'; '.join(decision['failures'])})"
        else:
            outcome = f"held ({deploy['status']})"
        lines.append(f"| {gate['generation']} | {gate['serving']} | {verdicts} | "
                     f"{gate['predicted']:.4f} / {gate['serving_quality']:.4f}{_standard_error(gate)} | {outcome} |")
    return "\n".join(lines)


def _standard_error(gate: dict) -> str:
    """`` (SE 0.0012)``: the paired standard error the gate's noise margin used ("" before it was measured)."""
    return "" if gate.get("predicted_se") is None else f" (SE {gate['predicted_se']:.4f})"


def format_report(report: dict) -> str:
    """Markdown: every update's mAP and CMC@1 criterion, then AC / AM of both matrices."""
    lines = ["| update | mAP cross / old self | mAP criterion | CMC@1 cross / old self | CMC@1 criterion |",
             "|---|---|---|---|---|"]
    for update, metrics in report["updates"].items():
        m, c = metrics["map"], metrics["cmc@1"]
        lines.append(f"| {update} | {m['cross']:.3f} / {m['old_self']:.3f} | {'passes' if m['compatible'] else 'fails'} "
                     f"| {c['cross']:.3f} / {c['old_self']:.3f} | {'passes' if c['compatible'] else 'fails'} |")
    for metric in ("map", "cmc@1"):
        matrix = np.array([[np.nan if v is None else v for v in row] for row in report["matrices"][metric]])
        lines.append(f"\n{metric}: AC {average_compatibility(matrix):.2f}, AM {average_multi_model_accuracy(matrix):.3f}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--storage", type=Path, required=True, help="an empty folder for the stand-ins and the run")
    parser.add_argument("--epochs", type=int, default=20, help="epochs of each task (the file's 70)")
    parser.add_argument("--pretrain-epochs", type=int, default=15, help="epochs of each stand-in (the paper's 300)")
    parser.add_argument("--gate-action", choices=("hold", "force"), default="hold",
                        help="every gate's action: hold (as shipped) stops at the first failed gate; force "
                             "records the failure and goes on")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    images = load_source("shapes", split="train", **STAND_IN_DATA)
    checkpoints = {}
    for index, num_classes in STAND_INS:
        checkpoints[index] = train_stand_in(images, num_classes, args.pretrain_epochs, args.storage / "stand-ins")
        print(f"stand-in of {num_classes} classes: {time.perf_counter() - started:.0f} s", flush=True)
    run_started = time.perf_counter()
    storage = args.storage / "run"
    command = [sys.executable, "-m", "orchestrator"]
    run = subprocess.run([*command, "run", str(PIPELINE), "--storage", str(storage),
                          *pipeline_overrides(checkpoints, args.epochs, args.gate_action)], cwd=REPO)
    print(f"\nrun: exit {run.returncode} after {time.perf_counter() - run_started:.0f} s "
          f"(stand-ins {run_started - started:.0f} s)\n")
    lineage = subprocess.run([*command, "lineage", str(PIPELINE), "--storage", str(storage), "--json"], cwd=REPO,
                             capture_output=True, text=True, check=True)
    print(format_gates(json.loads(lineage.stdout)))
    report = storage / "reports" / "compatibility.json"
    if report.is_file():
        print("\n" + format_report(json.loads(report.read_text(encoding="utf-8"))))
    return run.returncode


if __name__ == "__main__":
    sys.exit(main())
