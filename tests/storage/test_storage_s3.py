"""The storage round trips against a real S3 API: moto's server on loopback (no network)."""
import pytest
import torch

from orchestrator.methods.loading import load_generation
from orchestrator.models.checkpoint import checkpoint_exists, load_card, save_generation
from orchestrator.storage import (
    ChecksumMismatch,
    exists,
    list_dir,
    open_filesystem,
    read_bytes,
    read_json,
    remove,
    write_bytes_atomic,
    write_json_atomic,
)
from orchestrator.training.state import load_training_state, save_training_state
from storage_cases import CASES, ENCODER, assert_same_outputs, assert_same_state, build_case


@pytest.mark.parametrize("case_id", ["hbct-lorentz", "lambda-orth-orthogonal"])
def test_generation_round_trip_on_s3(s3_bucket, case_id):
    bucket, endpoint = s3_bucket
    _, name, params, adapters = next(case for case in CASES if case[0] == case_id)
    method, model = build_case(name, params, adapters)
    options = {"endpoint_url": endpoint}
    uri = f"s3://{bucket}/prefix/gen0"
    assert not checkpoint_exists(uri, options)
    card = save_generation(model, method, ENCODER, uri, name="gen0", storage_options=options)
    assert list_dir(uri, options) == ["card.json", "model.safetensors"]
    assert checkpoint_exists(uri, options) and load_card(uri, options) == card
    loaded, loaded_card = load_generation(uri, expected_sha256=card.sha256, storage_options=options)
    assert loaded_card == card
    assert_same_state(model, loaded)
    assert_same_outputs(model, loaded, adapters)


def test_tampered_object_on_s3(s3_bucket):
    bucket, endpoint = s3_bucket
    options = {"endpoint_url": endpoint}
    method, model = build_case("independent", {"space": "cosine"}, None)
    uri = f"s3://{bucket}/gen0"
    card = save_generation(model, method, ENCODER, uri, name="gen0", storage_options=options)
    data = bytearray(read_bytes(f"{uri}/model.safetensors", options))
    data[100] ^= 0xFF
    write_bytes_atomic(f"{uri}/model.safetensors", bytes(data), options)
    with pytest.raises(ChecksumMismatch) as info:
        load_generation(uri, storage_options=options)
    assert f"s3://{bucket}/gen0/model.safetensors" in str(info.value) and card.sha256 in str(info.value)
    remove(f"{uri}/card.json", storage_options=options)
    with pytest.raises(FileNotFoundError, match=f"s3://{bucket}/gen0"):
        load_generation(uri, storage_options=options)


def test_filesystem_ops_and_training_state_via_env_endpoint(s3_bucket, monkeypatch):
    bucket, endpoint = s3_bucket
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)  # no storage_options: the environment decides
    base = f"s3://{bucket}/runs"
    write_json_atomic(f"{base}/doc.json", {"b": 1, "a": [1.5, None]})
    assert read_json(f"{base}/doc.json") == {"a": [1.5, None], "b": 1}
    assert exists(f"{base}/doc.json") and exists(base) and not exists(f"{base}/nope")
    with pytest.raises(FileNotFoundError, match="nope"):
        read_bytes(f"{base}/nope")

    torch.manual_seed(0)
    net = torch.nn.Linear(3, 2)
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-2)
    for _ in range(2):
        optimizer.zero_grad()
        net(torch.randn(4, 3)).sum().backward()
        optimizer.step()
    save_training_state(f"{base}/train", optimizer.state_dict(), epoch=2, extra={"rng": torch.get_rng_state()})
    restored = load_training_state(f"{base}/train")
    assert restored.epoch == 2 and torch.equal(restored.extra["rng"], torch.get_rng_state())
    expected = optimizer.state_dict()
    assert restored.optimizer_state["param_groups"] == expected["param_groups"]
    for pid, slots in expected["state"].items():
        for key, value in slots.items():
            assert torch.equal(restored.optimizer_state["state"][pid][key], value)

    assert list_dir(base) == ["doc.json", "train"]
    remove(f"{base}/train", recursive=True)
    assert list_dir(base) == ["doc.json"]
    fs, path = open_filesystem(base)
    assert path == f"{bucket}/runs"
