"""A saved generation rebuilt: the method its card names builds the model, the checkpoint format
(``orchestrator.models.checkpoint``) checks and fills in the weights."""
from __future__ import annotations

from typing import Any, Mapping

import torch

from orchestrator.methods.registry import create_method
from orchestrator.models.bundle import CompatibleModel
from orchestrator.models.checkpoint import CheckpointCard, read_weights, restore_weights


def load_generation(
    uri: str,
    expected_sha256: str | None = None,
    map_location: str | torch.device = "cpu",
    storage_options: Mapping[str, Any] | None = None,
) -> tuple[CompatibleModel, CheckpointCard]:
    """Rebuild the generation saved at ``uri``: ``(model in eval mode on map_location, card)``.

    The weights are verified before they are deserialised (``read_weights``: ``ChecksumMismatch``
    against the card or ``expected_sha256``, e.g. the lineage's record; FileNotFoundError naming
    ``uri`` for a missing card or weights file).
    """
    state, card = read_weights(uri, expected_sha256, storage_options)
    method = create_method(card.method.name, card.method.params)
    # Decision: the backbone's ``pretrained`` init is not loaded again (the checkpoint holds every
    # weight; a hub download or a path of the training machine must not be needed to load).
    encoder_config = card.encoder_config().model_copy(update={"pretrained": None})
    model = method.build_model(encoder_config, card.num_classes, torch.tensor(card.seen_classes, dtype=torch.long))
    restore_weights(model, state, card, uri)
    return model.to(map_location).eval(), card
