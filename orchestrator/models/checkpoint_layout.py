"""The files of a generation's checkpoint folder, named here without torch: code that only hashes,
lists or copies them (the integrity checks on a shard writer, ``verify``) imports this, not the
checkpoint format (``checkpoint``, which loads torch and the model zoo)."""

WEIGHTS_FILE = "model.safetensors"
CARD_FILE = "card.json"
