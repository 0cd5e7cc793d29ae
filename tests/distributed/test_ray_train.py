"""Generations trained through Ray Train: DDP workers, parent loaded from its checkpoint,
finished generation written as safetensors + card, and resumption after a killed worker.

Every Ray Train run pays the start of a controller and of its worker processes (seconds each on
2 cores), so the parent generation the children align to is trained through Ray Train once for
the module (``parent``) and shared by the tests that need a parent; each child is its own run.
The local Ray is ``local_ray`` of tests/distributed/conftest.py (one per module)."""
from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import psutil
import pytest
import torch

from orchestrator.config.runtime import RaySettings
from orchestrator.data import channel_statistics, load_digits
from orchestrator.distributed.train import GenerationJob, train_generation_with_ray
from orchestrator.methods.loading import load_generation
from orchestrator.models.checkpoint import load_card
from orchestrator.training.generation import GenerationTraining
from orchestrator.training.seeds import derive_seed

pytestmark = pytest.mark.e2e

ENCODER = {"arch": "test_resnet", "embed_dim": 16}
# test_convnext uses LayerNorm, so a model and a frozen copy give identical outputs in train and
# eval mode (BatchNorm would not): test_init_from_parent_and_replacement_start_points needs that
CONVNEXT = {"arch": "test_convnext", "embed_dim": 16}


@pytest.fixture(scope="module")
def digits_stats():
    return channel_statistics(load_digits("train"))


@dataclass(frozen=True)
class Parent:
    uri: str
    sha256: str
    metrics: dict


@pytest.fixture(scope="module")
def parent(local_ray, digits_stats, tmp_path_factory) -> Parent:
    """g0: independent, test_convnext, the old classes (0-4), 2 epochs on one Ray Train worker."""
    out = tmp_path_factory.mktemp("parent")
    train = load_digits("train")
    old_ids = train.ids[train.labels < 5].tolist()
    metrics = train_generation_with_ray(job("g0", "independent", out, digits_stats, train_ids=old_ids, encoder=CONVNEXT),
                                        RaySettings(num_workers=1), storage_path=str(out / "ray"))
    return Parent(str(out / "g0"), load_card(str(out / "g0")).sha256, metrics)


def job(name, method, out, stats, epochs=2, encoder=ENCODER, **kwargs):
    mean, std = stats
    return GenerationJob(name=name, method=method, method_params={}, encoder=encoder,
                         training={"epochs": epochs, "batch_size": 64, "lr": 0.05, "augment": False},
                         num_classes=10, data_source="digits", output_uri=str(out / name),
                         mean=mean, std=std, **kwargs)


def test_parent_and_ddp_child_through_ray_train(local_ray, digits_stats, parent, tmp_path):
    metrics = parent.metrics
    assert metrics["epoch"] == 1 and metrics["lr"] == pytest.approx(0.025)  # cosine step of epoch 1 of 2
    assert metrics["samples"] == 576  # 633 old-class items, 9 full batches of 64
    g0_card = load_card(parent.uri)
    assert g0_card.seen_classes == [0, 1, 2, 3, 4] and g0_card.parent is None and g0_card.sha256 == parent.sha256

    child = job("g1", "bct", tmp_path, digits_stats, epochs=1, encoder=CONVNEXT, parent_name="g0",
                parent_uri=parent.uri, parent_sha256=parent.sha256)
    metrics = train_generation_with_ray(child, RaySettings(num_workers=2), storage_path=str(tmp_path / "ray"))
    assert {"loss/base", "loss/influence"} <= set(metrics)
    assert metrics["loss"] == pytest.approx(metrics["loss/base"] + metrics["loss/influence"])
    # two DDP workers each see half of the 1,258 training items (DistributedSampler, 9 full batches)
    assert metrics["samples"] == 576
    g1, card = load_generation(str(tmp_path / "g1"))
    g0, _ = load_generation(parent.uri)
    assert card.parent == "g0" and card.method.name == "bct" and card.seen_classes == list(range(10))
    changed = [not torch.equal(a, b) for (name, a), (_, b) in zip(g0.state_dict().items(), g1.state_dict().items())
               if name.startswith("encoder.") and a.is_floating_point()]
    assert all(changed)


def test_a_wrong_parent_hash_fails_the_run(local_ray, digits_stats, parent, tmp_path):
    assert parent.sha256 != "0" * 64
    bad = job("g1", "l2", tmp_path, digits_stats, epochs=1, encoder=CONVNEXT, parent_name="g0",
              parent_uri=parent.uri, parent_sha256="0" * 64)
    with pytest.raises(RuntimeError, match="g1"):
        train_generation_with_ray(bad, RaySettings(num_workers=1, max_failures=0),
                                  storage_path=str(tmp_path / "ray"))
    assert not (tmp_path / "g1").exists()


def test_local_mode_trains_the_parent_bit_for_bit_in_this_process(local_ray, digits_stats, parent, tmp_path):
    """num_workers 0 (Ray Train's local mode): the parent's job, run in this process with no
    worker actor, writes the same weights (same sha256) and reports the same metrics as the one
    Ray Train worker that trained ``parent``; the process's own torch threads are left as found.
    Its epoch lines reach ``progress`` through an in-process queue, not a Ray queue's actor."""
    train = load_digits("train")
    old_ids = train.ids[train.labels < 5].tolist()
    workers_before, queues_before = _actor_processes(), _actor_processes("_QueueActor")
    threads = torch.get_num_threads()
    lines: list[str] = []
    queues_during: list[set[int]] = []  # new queue actors, looked for while an epoch is reported
    metrics = train_generation_with_ray(job("g0", "independent", tmp_path, digits_stats, train_ids=old_ids,
                                            encoder=CONVNEXT),
                                        RaySettings(num_workers=0), storage_path=str(tmp_path / "ray"),
                                        progress=lines.append,
                                        on_epoch=lambda _: queues_during.append(_actor_processes("_QueueActor")
                                                                                - queues_before))
    assert load_card(str(tmp_path / "g0")).sha256 == parent.sha256
    assert metrics == pytest.approx(parent.metrics)
    assert _actor_processes() == workers_before and torch.get_num_threads() == threads
    assert queues_during == [set(), set()]
    assert [line.split("  ")[0] for line in lines] == ["epoch 1/2", "epoch 2/2"], lines
    bad = job("g1", "l2", tmp_path, digits_stats, epochs=1, encoder=CONVNEXT, parent_name="g0",
              parent_uri=parent.uri, parent_sha256="0" * 64)
    with pytest.raises(RuntimeError, match="training generation 'g1' failed: .*sha256"):
        train_generation_with_ray(bad, RaySettings(num_workers=0), storage_path=str(tmp_path / "ray"))
    assert not (tmp_path / "g1").exists()


def _actor_processes(actor: str = "RayTrainWorker") -> set[int]:
    """PIDs of the ``actor`` processes (a Ray process title; Ray Train's workers by default) of this
    process's local Ray (its raylet is a child of this process, their parent): never another
    test's, which may run beside this one."""
    here = os.getpid()
    workers = set()
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if any(actor in part for part in (proc.info["cmdline"] or [])) and \
                    here in (parent.pid for parent in proc.parents()):
                workers.add(proc.pid)
        except psutil.NoSuchProcess:
            continue
    return workers


def _a_checkpoint_is_registered(run_dir: Path) -> bool:
    """True once Ray Train's checkpoint manager has recorded a checkpoint in its snapshot file.

    A checkpoint folder appears on disk before the controller registers it (registration waits
    for the controller's next poll), so folders alone are no proof the restart can resume."""
    try:
        snapshot = json.loads((run_dir / "checkpoint_manager_snapshot.json").read_text())
    except (OSError, ValueError):
        return False  # not written yet, or caught mid-write
    return snapshot.get("latest_checkpoint_result") is not None


def _kill_a_worker_once_a_checkpoint_is_registered(run_dir: Path, killed: list[int], deadline: float,
                                                   seen_alongside: set[int]) -> None:
    """Kills one Ray Train worker of this process's Ray once a checkpoint is registered; notes in
    ``seen_alongside`` the preemption watchers running beside it then (a local Ray starts none)."""
    while time.time() < deadline and not killed:
        if _a_checkpoint_is_registered(run_dir):
            for pid in _actor_processes():
                seen_alongside.update(_actor_processes("PreemptionWatcher"))
                psutil.Process(pid).kill()
                killed.append(pid)
                return
        time.sleep(0.2)


def test_killed_worker_resumes_from_the_last_epoch_checkpoint(local_ray, digits_stats, tmp_path):
    storage = tmp_path / "ray"
    killed: list[int] = []
    preemption_watchers: set[int] = set()
    killer = threading.Thread(target=_kill_a_worker_once_a_checkpoint_is_registered,
                              args=(storage / "train-g0", killed, time.time() + 240, preemption_watchers),
                              daemon=True)
    killer.start()
    metrics = train_generation_with_ray(job("g0", "independent", tmp_path, digits_stats, epochs=6),
                                        RaySettings(num_workers=1, max_failures=2), storage_path=str(storage))
    killer.join(timeout=1)
    assert killed, "no Ray Train worker was found to kill"
    assert not preemption_watchers  # a local Ray's node is never drained (runtime.WORKER_ENV_VARS)
    assert metrics["epoch"] == 5
    assert metrics["start_epoch"] > 0  # the second attempt continued from a saved epoch
    model, card = load_generation(str(tmp_path / "g0"))
    assert card.name == "g0" and np.isfinite(metrics["loss"])
    kept = [path for path in (storage / "train-g0").glob("checkpoint_*") if path.is_dir()]
    assert len(kept) == 2  # the newest two of six epochs' checkpoint folders


def test_init_from_parent_and_replacement_start_points(local_ray, digits_stats, parent, tmp_path):
    """init_from_parent starts from the parent's weights; a replacement (replaces) starts from its
    pretrained checkpoint, and that checkpoint, not the parent, is the frozen model it aligns to.
    The first through Ray Train (the job's fields reach the worker); the two replacement cases in
    this process through ``GenerationTraining``, the session every Ray Train worker runs.

    The parent is test_convnext (LayerNorm: a model and a frozen copy give identical outputs in
    train and eval mode): a learning rate of 1e-9 keeps the l2 term at ~0 exactly when the frozen
    model is the starting point."""
    from safetensors.torch import save_file

    quiet = {"epochs": 1, "batch_size": 64, "lr": 1e-9, "momentum": 0.0, "weight_decay": 0.0, "augment": False}
    train = load_digits("train")
    ids = train.ids[train.labels < 5][:256].tolist()  # the parent's classes: same seen_classes buffer

    def spec(name, method, **fields):
        base = job(name, method, tmp_path, digits_stats, train_ids=ids)
        return GenerationJob(**{**base.__dict__, "encoder": CONVNEXT, "seed": derive_seed(0, name), **fields})

    def run(name, method, **fields):
        return train_generation_with_ray(spec(name, method, **fields), RaySettings(num_workers=1),
                                         storage_path=str(tmp_path / "ray"))

    def run_here(name, method, **fields):
        session = GenerationTraining(spec(name, method, **fields))
        session.start()
        metrics = session.train_epoch(0)
        session.finish()
        session.save()
        return metrics

    parent_model, parent_card = load_generation(parent.uri)
    assert parent_card.encoder["arch"] == "test_convnext"
    lineage = {"parent_name": "g0", "parent_uri": parent.uri, "parent_sha256": parent.sha256}

    assert run("g1", "l2", training=quiet, init_from_parent=True, **lineage)["loss/l2"] < 1e-6
    child, _ = load_generation(str(tmp_path / "g1"))
    for (name, a), (_, b) in zip(parent_model.state_dict().items(), child.state_dict().items()):
        assert torch.allclose(a, b, atol=1e-6), name

    backbone = {k.removeprefix("encoder.backbone."): v.contiguous() for k, v in parent_model.state_dict().items()
                if k.startswith("encoder.backbone.")}
    save_file(backbone, str(tmp_path / "third_party.safetensors"))
    pretrained = {**CONVNEXT, "pretrained": str(tmp_path / "third_party.safetensors")}
    replaced = run_here("g2", "l2", training=quiet, replaces=True, encoder=pretrained, **lineage)
    aligned_to_parent = run_here("g3", "l2", training=quiet, encoder=pretrained, **lineage)
    assert replaced["loss/l2"] < 1e-6  # aligned to its own starting checkpoint
    assert aligned_to_parent["loss/l2"] > 1e-3  # same start, aligned to g0 (whose projection differs)
    model, card = load_generation(str(tmp_path / "g2"))
    assert card.parent == "g0"
    for name, value in backbone.items():
        assert torch.allclose(model.state_dict()["encoder.backbone." + name], value, atol=1e-6), name
