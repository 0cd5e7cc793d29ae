"""Hostile configuration files: each is refused quickly, in bounded memory, with one line naming the
file, the field and the value (issue 13 parts 1 and 2).

Every refusal is measured twice: once timed (under a CPU second), once under ``tracemalloc`` (peak
under 50 MB; tracing slows the YAML scanner many times, so the two are separate runs). Before the
bounds, the 10-line alias bomb below expanded to 10^9 nodes, the 50,000-level document ended in
"maximum recursion depth exceeded" naming no file, and a ``..`` name put a generation's files in
the storage root.
"""
from __future__ import annotations

import json
import re
import time
import tracemalloc
from pathlib import Path

import pytest
import yaml

from orchestrator import limits
from orchestrator.config import GallerySpec, PipelineConfigError, load_pipeline
from orchestrator.names import NAME_HELP
from orchestrator.storage import join_uri
from orchestrator.tuning.config import TuneFileError, load_tune_file
from valid_pipeline import VALID

REPO = Path(__file__).resolve().parents[2]
MAX_SECONDS = 1.0
MAX_PEAK_BYTES = 50 * 2**20



def refusal(path: Path, load=load_pipeline, error=PipelineConfigError) -> str:
    """The one-line error of loading ``path``, checked to come within MAX_SECONDS of CPU time (this
    process's: a busy machine's other processes do not count) and MAX_PEAK_BYTES."""
    started = time.process_time()
    with pytest.raises(error) as info:
        load(path)
    seconds = time.process_time() - started
    tracemalloc.start()
    try:
        with pytest.raises(error):
            load(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    message = str(info.value)
    assert seconds < MAX_SECONDS, (seconds, message)
    assert peak < MAX_PEAK_BYTES, (peak, message)
    assert len(message.splitlines()) == 1, message
    assert message.startswith(f"{path}: "), message
    return message


def write(tmp_path: Path, text: str, name: str = "hostile.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def laughs(levels: int, fan_out: int = 10) -> str:
    """``levels`` lines, each an anchored list of ``fan_out`` aliases of the line before: the last
    one stands for fan_out ** levels strings."""
    lines = [f"lol0: &lol0 [{', '.join(['lol'] * fan_out)}]"]
    for i in range(1, levels):
        lines.append(f"lol{i}: &lol{i} [{', '.join([f'*lol{i - 1}'] * fan_out)}]")
    return "\n".join(lines) + "\n"


def expanded_nodes(levels: int, fan_out: int = 10) -> list[int]:
    """Nodes that line i of ``laughs`` expands to (its list node plus its items'), independently."""
    sizes = [1 + fan_out]
    for _ in range(1, levels):
        sizes.append(1 + fan_out * sizes[-1])
    return sizes


def node_count(node: yaml.Node) -> int:
    """Nodes of a composed YAML tree without aliases (keys, values and collections)."""
    if isinstance(node, yaml.MappingNode):
        return 1 + sum(node_count(k) + node_count(v) for k, v in node.value)
    if isinstance(node, yaml.SequenceNode):
        return 1 + sum(node_count(item) for item in node.value)
    return 1


def first_alias_past_the_bound(levels: int, before: int) -> tuple[int, int]:
    """(line i, item k) of ``laughs`` at which the running count of expanded nodes, ``before``
    nodes already composed, first passes YAML_MAX_NODES: line i's key, then each alias *lol{i-1}
    adds the nodes it stands for."""
    sizes = expanded_nodes(levels)
    running = before + 1 + sizes[0]  # line 0: a key and a list of plain strings
    for i in range(1, levels):
        running += 1
        for k in range(10):
            running += sizes[i - 1]
            if running > limits.YAML_MAX_NODES:
                return i, k
        running += 1
    raise AssertionError("the bomb stays within the bound")


# ------------------------------------------------------------------------- YAML bounds


@pytest.mark.parametrize("levels", [6, 10])  # 10^6 strings (10 s, 900 MB before), a billion
def test_alias_bomb_is_refused_before_expansion(tmp_path, levels):
    path = write(tmp_path, VALID + laughs(levels))
    message = refusal(path)
    line, item = first_alias_past_the_bound(levels, node_count(yaml.compose(VALID)) - 1)
    assert message == (f"{path}: lol{line}[{item}]: the document expands to more than {limits.YAML_MAX_NODES} nodes "
                       f"(limits.YAML_MAX_NODES; an alias counts the nodes it stands for) (got *lol{line - 1}) "
                       f"[line {VALID.count(chr(10)) + 1 + line}]")


@pytest.mark.parametrize("layout", ["flow", "block"])
def test_too_many_nodes_without_aliases(tmp_path, layout):
    count = limits.YAML_MAX_NODES + 1
    items = "[" + ", ".join(["1"] * count) + "]" if layout == "flow" else "\n" + "  - 1\n" * count
    message = refusal(write(tmp_path, VALID + f"many: {items}\n"))
    # VALID's nodes (less the root mapping, counted when it ends), the key, the list node, then items
    item = limits.YAML_MAX_NODES - (node_count(yaml.compose(VALID)) - 1) - 1
    line = 10 if layout == "flow" else 11 + item
    assert f": many[{item}]: the document expands to more than {limits.YAML_MAX_NODES} nodes" in message
    assert f"(got {limits.YAML_MAX_NODES + 1} nodes) [line {line}]" in message


def test_alias_to_its_own_node_is_refused(tmp_path):
    message = refusal(write(tmp_path, VALID + "loop: &loop [1, *loop]\n"))
    assert "loop[1]: an alias inside the node it refers to" in message and "(got *loop) [line 10]" in message


def test_too_many_aliases(tmp_path):
    aliases = ", ".join(["*x"] * (limits.YAML_MAX_ALIASES + 1))
    message = refusal(write(tmp_path, VALID + f"one: &x 1\nmany: [{aliases}]\n"))
    assert f"many[{limits.YAML_MAX_ALIASES}]: more than {limits.YAML_MAX_ALIASES} aliases" in message
    assert "(got *x) [line 11]" in message


# the root mapping is level 1 and `description` level 2; a list's item at level 51 is past the bound,
# in nested mappings it is the key of the mapping at level 50
@pytest.mark.parametrize("opening, closing, step, steps", [("[", "]", "[0]", limits.YAML_MAX_DEPTH - 1),
                                                           ("{a: ", "}", ".a", limits.YAML_MAX_DEPTH - 2)])
def test_nesting_50000_levels(tmp_path, opening, closing, step, steps):
    path = write(tmp_path, VALID + "description: " + opening * 50_000 + "1" + closing * 50_000 + "\n")
    message = refusal(path)
    assert f"nesting deeper than {limits.YAML_MAX_DEPTH} levels" in message
    assert f"(got depth {limits.YAML_MAX_DEPTH + 1}) [line 10]" in message
    field = message.split(": ")[1]
    assert field == "description" + step * steps


def test_nesting_through_aliases(tmp_path):
    half = limits.YAML_MAX_DEPTH // 2 + 1
    text = VALID + f"a: &a {'[' * half}1{']' * half}\nb: {'[' * half}*a{']' * half}\n"
    message = refusal(write(tmp_path, text))
    assert "alias nests the document deeper than" in message and "(got *a) [line 11]" in message


def test_huge_file_is_not_read_past_the_bound(tmp_path):
    path = tmp_path / "huge.yaml"
    with open(path, "wb") as handle:  # 4 GiB, sparse: reading it whole would take the memory with it
        handle.write(VALID.encode())
        handle.truncate(4 << 30)
    message = refusal(path)
    assert message == (f"{path}: (file): file larger than {limits.YAML_MAX_BYTES} bytes (limits.YAML_MAX_BYTES) "
                       f"(got {4 << 30} bytes)")


def test_endless_file_is_not_read_past_the_bound():
    message = refusal(Path("/dev/zero"))
    assert message.endswith(f"(got more than {limits.YAML_MAX_BYTES} bytes)")


def test_huge_value(tmp_path):
    length = limits.YAML_MAX_SCALAR_CHARS + 1
    message = refusal(write(tmp_path, VALID.replace("name: t\n", f"name: t\ndescription: {'y' * length}\n")))
    assert f"description: a value longer than {limits.YAML_MAX_SCALAR_CHARS} characters" in message
    assert f"({length} characters)) [line 2]" in message


def test_huge_integer(tmp_path):
    digits = "9" * 5000  # int() of it would pass Python's own 4300-digit limit and raise ValueError
    message = refusal(write(tmp_path, VALID + f"    data_seed: {digits}\n"))
    assert f"generations[1].data_seed: an integer of more than {limits.YAML_MAX_INT_DIGITS} digits" in message
    assert "(got 99999999999999999999... (5000 characters)) [line 10]" in message


# ------------------------------------------------------------------------- counts


def with_value(field: str, value, config: dict | None = None) -> str:
    """VALID (or ``config``) with ``field`` (dotted, list positions as numbers) set to ``value``."""
    config = yaml.safe_load(VALID) if config is None else config
    *parents, last = [int(p) if p.isdigit() else p for p in field.split(".")]
    node = config
    for part in parents:
        node = node[part] if isinstance(part, int) else node.setdefault(part, {})
    node[last] = value
    return yaml.safe_dump(config, sort_keys=False)


def shown(field: str) -> str:
    """A dotted field as the error shows it: generations.1.x → generations[1].x."""
    return re.sub(r"\.(\d+)\.", r"[\1].", field)


COUNTS = [
    ("gallery.num_shards", limits.MAX_SHARDS),
    ("gallery.items_per_shard", limits.MAX_ITEMS),
    ("gallery.embedding.batch_size", limits.MAX_BATCH_SIZE),
    ("gallery.embedding.concurrency", limits.MAX_WORKERS),
    ("ray.num_workers", limits.MAX_WORKERS),
    ("ray.max_failures", limits.MAX_FAILURES),
    ("ray.checkpoints_to_keep", limits.MAX_CHECKPOINTS_TO_KEEP),
    ("evaluation.gallery_sample", limits.MAX_ITEMS),
    ("search.eval_k", limits.MAX_TOP_K),
    ("data.image_size", limits.MAX_IMAGE_SIZE),
    ("data.train_per_class", limits.MAX_ITEMS),
    ("generations.0.training.epochs", limits.MAX_EPOCHS),
    ("generations.0.training.batch_size", limits.MAX_BATCH_SIZE),
    ("generations.0.training.warmup_epochs", limits.MAX_EPOCHS),
    ("generations.0.model.embed_dim", limits.MAX_EMBED_DIM),
    ("generations.0.model.in_chans", limits.MAX_CHANNELS),
]


@pytest.mark.parametrize("field, bound", COUNTS)
def test_huge_counts_are_refused_and_the_bound_itself_is_not(tmp_path, field, bound):
    value = 1_000_000_000_000
    message = refusal(write(tmp_path, with_value(field, value)))
    assert f": {shown(field)}: Input should be less than or equal to {bound} (got {value}) [line " in message
    if field != "generations.0.model.in_chans":  # the bound itself validates (a model is not built here)
        text = with_value(field, bound)
        if field == "generations.0.model.embed_dim":  # g1's hbct compares its embeddings with g0's: the same size
            text = with_value("generations.1.model.embed_dim", bound, yaml.safe_load(text))
        config = load_pipeline(write(tmp_path, text, "at_bound.yaml"))
        node = config
        for part in field.split("."):
            node = node[int(part)] if part.isdigit() else getattr(node, part)
        assert node == bound


def test_training_workers_go_down_to_local_mode_and_no_further(tmp_path):
    """ray.num_workers 0 is Ray Train's local mode (the driver trains); below it is refused."""
    assert load_pipeline(write(tmp_path, with_value("ray.num_workers", 0))).ray.num_workers == 0
    message = refusal(write(tmp_path, with_value("ray.num_workers", -1), "negative.yaml"))
    assert ": ray.num_workers: Input should be greater than or equal to 0 (got -1) [line " in message


def test_huge_method_parameter_and_ray_resources(tmp_path):
    text = with_value("generations.1.method", {"name": "fct", "params": {"adapter_epochs": 10**12}})
    message = refusal(write(tmp_path, text))
    assert f"generations[1].method.params.adapter_epochs: Input should be less than or equal to {limits.MAX_EPOCHS}" in message
    message = refusal(write(tmp_path, with_value("ray.cpus_per_worker", 1e15), "cpus.yaml"))
    assert (f"ray.cpus_per_worker: Input should be less than or equal to {limits.MAX_CPUS:g} "
            f"(got {json.dumps(1e15)}) [line ") in message


@pytest.mark.parametrize("index, option", [("ivf", "nlist"), ("hnsw", "ef_search"), ("pq", "train_size")])
def test_index_option_counts_are_bounded(tmp_path, index, option):
    bound = limits.MAX_INDEX_OPTIONS[option]
    text = with_value("gallery", {"index": index, "index_options": {option: bound + 1}})
    message = refusal(write(tmp_path, text))
    assert f"gallery.index_options.{option}: at most {bound} (limits.MAX_INDEX_OPTIONS) (got {bound + 1}) [line " in message
    config = load_pipeline(write(tmp_path, with_value("gallery", {"index": index, "index_options": {option: bound}}), "ok.yaml"))
    assert config.gallery.index_options == {option: bound}


def test_class_ids_are_bounded(tmp_path):
    message = refusal(write(tmp_path, with_value("generations.0.classes", [0, 10**12])))
    assert f"generations[0].classes[1]: Input should be less than {limits.MAX_CLASSES} (got 1000000000000)" in message


def test_items_per_shard_cannot_make_more_than_max_shards():
    num_items = 10**9
    with pytest.raises(ValueError) as info:
        GallerySpec(items_per_shard=1).shard_count(num_items)
    assert str(info.value).startswith("gallery.items_per_shard: 1 items per shard make 1000000000 shards")
    per_shard = -(-num_items // limits.MAX_SHARDS)  # the smallest that stays within the bound
    assert GallerySpec(items_per_shard=per_shard).shard_count(num_items) == -(-num_items // per_shard) <= limits.MAX_SHARDS


TUNE = """\
name: t
pipeline: {pipeline}
transition: {{parent: g0-old, candidate: g1}}
space:
  lam: {{loguniform: [0.03, 3.0]}}
search: {{num_samples: 1000000000}}
objective: {{maximize: cross_map}}
"""


def test_huge_tune_counts(tmp_path):
    path = write(tmp_path, TUNE.format(pipeline=REPO / "pipelines" / "lifelong.yaml"), "tune.yaml")
    message = refusal(path, load_tune_file, TuneFileError)
    assert message == (f"{path}: search.num_samples: Input should be less than or equal to {limits.MAX_NUM_SAMPLES} "
                       f"(got 1000000000) [line 6]")
    path = write(tmp_path, TUNE.format(pipeline=REPO / "pipelines" / "lifelong.yaml")
                 .replace("search: {num_samples: 1000000000}", "max_concurrent_trials: 100000"), "tune2.yaml")
    message = refusal(path, load_tune_file, TuneFileError)
    assert f"max_concurrent_trials: Input should be less than or equal to {limits.MAX_WORKERS}" in message


def test_the_tune_file_itself_is_bounded(tmp_path):
    path = write(tmp_path, "name: t\n" + laughs(9), "tune.yaml")
    message = refusal(path, load_tune_file, TuneFileError)
    assert f"expands to more than {limits.YAML_MAX_NODES} nodes" in message


# ------------------------------------------------------------------------- names

BAD_NAMES = [".", "..", "a/b", "a\\b", "/abs", "", "a\0b", "x" * (limits.NAME_MAX_LENGTH + 1), "g\uff10",
             "g\u0435n", ".hidden", "a\n", "a b", "C:x", "../escape"]
NAME_FIELDS = {  # where each kind of name lives: (the text with {name} in it, the field path)
    "pipeline": (VALID.replace("name: t\n", "name: {name}\n"), "name"),
    "generation": (VALID.replace("  - name: g1\n", "  - name: {name}\n"), "generations[1].name"),
    "gallery": (VALID + "gallery:\n  name: {name}\n", "gallery.name"),
}


@pytest.mark.parametrize("kind", NAME_FIELDS)
@pytest.mark.parametrize("bad", BAD_NAMES, ids=repr)
def test_bad_names_are_refused(tmp_path, kind, bad):
    text, field = NAME_FIELDS[kind]
    quoted = json.dumps(bad)  # a YAML double-quoted scalar: escapes for NUL, backslash, Unicode
    path = write(tmp_path, text.replace("{name}", quoted))
    message = refusal(path)
    value = json.dumps(bad, ensure_ascii=False)
    value = value if len(value) <= 80 else value[:77] + "..."
    assert message.startswith(f"{path}: {field}: not a valid name: {NAME_HELP} (got {value}) [line "), message


@pytest.mark.parametrize("bad", BAD_NAMES, ids=repr)
def test_bad_tune_names_are_refused(tmp_path, bad):
    text = TUNE.format(pipeline=REPO / "pipelines" / "lifelong.yaml").replace("search: {num_samples: 1000000000}\n", "")
    path = write(tmp_path, text.replace("name: t\n", f"name: {json.dumps(bad)}\n"), "tune.yaml")
    message = refusal(path, load_tune_file, TuneFileError)
    assert message.startswith(f"{path}: name: not a valid name: {NAME_HELP} (got "), message


@pytest.mark.parametrize("good", ["g9", "g0-old", "phi_star", "v1.2", "-x", "_", "x" * limits.NAME_MAX_LENGTH])
def test_good_names_still_load(tmp_path, good):
    config = load_pipeline(write(tmp_path, VALID.replace("  - name: g1\n", f"  - name: {json.dumps(good)}\n")))
    assert config.generations[1].name == good


@pytest.mark.parametrize("escape", [".", "..", "../..", "a/../../b", "/etc", "a\\..\\b", "s3://other"])
def test_the_storage_layout_cannot_be_left_even_by_a_name_that_slips_through(tmp_path, escape):
    for base in (str(tmp_path), "s3://bucket/run"):
        for layout in (("generations",), ("galleries",), ("tune",), ("galleries", "g", "plans")):
            with pytest.raises(ValueError, match="would leave"):
                join_uri(base, *layout, escape)
