"""Static checks of the cluster files under clusters/: they parse, have the shape their tools need,
turn Ray token authentication on for every node, and carry no secrets. Nothing is launched."""
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import jsonschema
import pytest
import ray
import yaml

ROOT = Path(__file__).resolve().parents[2]
CLUSTERS = ROOT / "clusters"
AWS = CLUSTERS / "aws.yaml"
RAYCLUSTER = CLUSTERS / "kuberay" / "raycluster.yaml"
RAYJOB = CLUSTERS / "kuberay" / "rayjob.yaml"
RAYSERVICE = CLUSTERS / "kuberay" / "rayservice.yaml"
LOCAL = CLUSTERS / "local_multinode.sh"


def load(path):
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    assert len(docs) == 1, f"{path.name}: expected one YAML document"
    return docs[0]


# ---------------------------------------------------------------- AWS cluster launcher

def test_aws_launcher_config_shape():
    cfg = load(AWS)
    for key in ("cluster_name", "provider", "available_node_types", "head_node_type",
                "setup_commands", "head_start_ray_commands", "worker_start_ray_commands"):
        assert key in cfg, key
    assert cfg["provider"]["type"] == "aws" and cfg["provider"]["region"]
    types = cfg["available_node_types"]
    assert cfg["head_node_type"] in types
    for name, node in types.items():
        assert node["node_config"]["InstanceType"], name
        assert "resources" in node, name
        # S3 access through an instance profile, never keys
        assert "IamInstanceProfile" in node["node_config"], name
    workers = {n: t for n, t in types.items() if n != cfg["head_node_type"]}
    gpu = [n for n, t in workers.items() if t["resources"].get("GPU", 0) >= 1]
    cpu = [n for n, t in workers.items() if not t["resources"].get("GPU")]
    assert gpu and cpu, "needs a CPU worker type and a GPU worker type"
    total_max = sum(t.get("max_workers", 0) for t in workers.values())
    assert 0 < total_max <= cfg["max_workers"]


def test_aws_config_validates_against_ray_launcher_schema_and_pins_the_image():
    """The launcher's own JSON schema (shipped with the installed Ray) accepts the file, and every
    node runs a container image with the installed Ray's version and a Python >= 3.10."""
    schema = json.loads((Path(ray.__file__).parent / "autoscaler" / "ray-schema.json").read_text())
    cfg = load(AWS)
    jsonschema.validate(cfg, schema)
    images = [cfg["docker"]["image"]] + [node["docker"]["worker_image"] for node in
                                         cfg["available_node_types"].values() if "docker" in node]
    for image in images:
        match = re.fullmatch(r"rayproject/ray:(\d+\.\d+\.\d+)-py3(\d+)-(cpu|gpu)", image)
        assert match, image
        assert match[1] == ray.__version__ and int(match[2]) >= 10, image
    gpu_types = [n for n, t in cfg["available_node_types"].items() if t["resources"].get("GPU")]
    assert all(cfg["available_node_types"][n]["docker"]["worker_image"].endswith("-gpu") for n in gpu_types)


def test_aws_installs_the_project_and_sets_token_auth_on_every_node():
    cfg = load(AWS)
    assert any("pip install" in c for c in cfg["setup_commands"])
    # every `ray start` (head and workers) runs with RAY_AUTH_MODE=token
    for key in ("head_start_ray_commands", "worker_start_ray_commands"):
        starts = [c for c in cfg[key] if "ray start" in c]
        assert starts, key
        for cmd in starts:
            assert re.search(r"RAY_AUTH_MODE=token\s+ray start", cmd), cmd
    assert any("RAY_AUTH_MODE=token" in c for c in cfg["setup_commands"])
    # the token travels as a file, not as a value in this file
    assert any("auth_token" in remote for remote in cfg.get("file_mounts", {}))
    header = AWS.read_text().split("\ncluster_name:")[0]
    for command in ("ray up", "ray job submit", "ray down", "orchestrator run"):
        assert command in header, command


# ---------------------------------------------------------------- KubeRay

def _token_auth(cluster_spec):
    return (cluster_spec.get("authOptions") or {}).get("mode") == "token"


def _containers(cluster_spec):
    groups = [cluster_spec["headGroupSpec"], *cluster_spec["workerGroupSpecs"]]
    for group in groups:
        yield from group["template"]["spec"]["containers"]


def _check_cluster_spec(spec):
    assert spec["headGroupSpec"]["template"]["spec"]["containers"]
    groups = spec["workerGroupSpecs"]
    gpu = [g for g in groups
           for c in g["template"]["spec"]["containers"]
           if "nvidia.com/gpu" in c.get("resources", {}).get("limits", {})]
    cpu = [g for g in groups if g not in gpu]
    assert gpu and cpu, "needs a CPU worker group and a GPU worker group"
    for c in _containers(spec):
        assert c["image"], c["name"]
        env = {e["name"]: e for e in c.get("env", [])}
        if not _token_auth(spec):
            assert env.get("RAY_AUTH_MODE", {}).get("value") == "token", c["name"]
            assert "secretKeyRef" in env["RAY_AUTH_TOKEN"]["valueFrom"], c["name"]
        for e in env.values():          # secrets come from Secrets, not literal values
            if re.search(r"TOKEN|SECRET|PASSWORD|KEY", e["name"]):
                assert "value" not in e and "valueFrom" in e, e["name"]
    if _token_auth(spec):
        assert spec["authOptions"].get("secretName", "orchestrator-ray-token")
        major, minor = (int(x) for x in spec["rayVersion"].split(".")[:2])
        assert (major, minor) >= (2, 52), "token auth needs Ray 2.52+"


def test_raycluster_manifest():
    doc = load(RAYCLUSTER)
    assert doc["apiVersion"] == "ray.io/v1" and doc["kind"] == "RayCluster"
    assert doc["metadata"]["name"]
    _check_cluster_spec(doc["spec"])


def test_rayjob_manifest():
    doc = load(RAYJOB)
    assert doc["apiVersion"] == "ray.io/v1" and doc["kind"] == "RayJob"
    spec = doc["spec"]
    assert "orchestrator run" in spec["entrypoint"]
    assert "pipelines/lifelong.yaml" in spec["entrypoint"]
    assert "--storage s3://" in spec["entrypoint"]
    assert spec["shutdownAfterJobFinishes"] is True
    runtime_env = yaml.safe_load(spec["runtimeEnvYAML"])
    assert runtime_env["working_dir"]
    _check_cluster_spec(spec["rayClusterSpec"])


def test_rayservice_manifest_serves_the_app_builder_with_valid_serve_options():
    import shlex

    from orchestrator.cli import build_parser

    doc = load(RAYSERVICE)
    assert doc["apiVersion"] == "ray.io/v1" and doc["kind"] == "RayService"
    config = yaml.safe_load(doc["spec"]["serveConfigV2"])
    (app,) = config["applications"]
    assert app["import_path"] == "orchestrator.serving.app:app_builder" and app["route_prefix"] == "/"
    args = build_parser().parse_args(["serve", *shlex.split(app["args"]["command"])])  # the serve command's options
    assert args.storage.startswith("s3://") and args.token_env == "ORCHESTRATOR_SERVE_TOKEN"
    cluster = doc["spec"]["rayClusterConfig"]
    workers = sum(int(group["replicas"]) * float(container["resources"]["requests"]["cpu"])
                  for group in cluster["workerGroupSpecs"] for container in group["template"]["spec"]["containers"])
    assert (args.encoder_replicas + args.search_replicas) * args.replica_cpus <= workers  # the pools fit the workers
    assert _token_auth(cluster)
    for container in _containers(cluster):
        env = {e["name"]: e for e in container["env"]}
        assert "secretKeyRef" in env["ORCHESTRATOR_SERVE_TOKEN"]["valueFrom"], container["name"]


# ---------------------------------------------------------------- every file

ALL_FILES = sorted(p for p in CLUSTERS.rglob("*") if p.is_file())

SECRET_PATTERNS = [
    (r"\bA(KIA|SIA)[0-9A-Z]{16}\b", "AWS access key id"),
    (r"(?i)aws_secret_access_key\s*[:=]", "AWS secret key setting"),
    (r"(?i)aws_access_key_id\s*[:=]", "AWS key id setting"),
    (r"(?<![A-Za-z0-9/+])[A-Za-z0-9/+]{40}(?![A-Za-z0-9/+])", "40-char secret-like string"),
    (r"\b[0-9a-fA-F]{32,}\b", "long hex string (token?)"),
    (r"(?i)RAY_AUTH_TOKEN\s*[=:]\s*['\"]?[A-Za-z0-9_\-]{8,}", "literal Ray token"),
    (r"(?i)auth_token\s*[=:]\s*['\"]?[A-Za-z0-9_\-]{8,}", "literal Ray token"),
    (r"-----BEGIN [A-Z ]*PRIVATE KEY-----", "private key"),
    (r"(?i)\bpassword\s*[=:]\s*['\"]?[^\s'\"$]{4,}", "literal password"),
]


def test_cluster_files_exist():
    names = {p.relative_to(CLUSTERS).as_posix() for p in ALL_FILES}
    assert {"aws.yaml", "kuberay/raycluster.yaml", "kuberay/rayjob.yaml", "kuberay/rayservice.yaml",
            "kuberay/README.md", "local_multinode.sh"} <= names


@pytest.mark.parametrize("path", ALL_FILES, ids=lambda p: p.relative_to(CLUSTERS).as_posix())
def test_no_secret_material(path):
    text = path.read_text()
    for pattern, what in SECRET_PATTERNS:
        hit = re.search(pattern, text)
        assert hit is None, f"{path.name}: {what}: {hit.group(0)!r}"
    # a Kubernetes Secret with data is key material: it must be created with kubectl, not committed
    if path.suffix in (".yaml", ".yml"):
        for doc in yaml.safe_load_all(text):
            if isinstance(doc, dict) and doc.get("kind") == "Secret":
                assert not doc.get("data") and not doc.get("stringData"), path.name


# ---------------------------------------------------------------- local multi-node script

def test_local_multinode_script():
    text = LOCAL.read_text()
    assert text.startswith("#!/usr/bin/env bash")
    assert LOCAL.stat().st_mode & 0o111, "not executable"
    bash = shutil.which("bash")
    assert bash
    subprocess.run([bash, "-n", str(LOCAL)], check=True, timeout=10)
    assert "RAY_AUTH_MODE=token" in text and "RAY_AUTH_TOKEN_PATH" in text
    for sub in ("up)", "status)", "down)"):
        assert sub in text, sub
    # distinct per-node ports and temp dirs, all on 127.0.0.1
    for flag in ("--node-manager-port", "--object-manager-port", "--min-worker-port",
                 "--max-worker-port", "--dashboard-agent-listen-port", "--dashboard-agent-grpc-port",
                 "--runtime-env-agent-port", "--metrics-export-port", "--temp-dir",
                 "--node-ip-address=127.0.0.1", "--dashboard-host=127.0.0.1"):
        assert flag in text, flag
    assert "0.0.0.0" not in text


def test_local_multinode_usage_without_arguments():
    result = subprocess.run(["bash", str(LOCAL)], capture_output=True, text=True, timeout=10)
    assert result.returncode == 2
    assert "up" in result.stderr and "down" in result.stderr


def state_dir_shell(tmp_path: Path, command: str, **env: str) -> subprocess.CompletedProcess:
    """``command`` in bash after sourcing the script (its functions, no subcommand run), with HOME
    in ``tmp_path`` so the recorded state-dir path lands there."""
    environment = {k: v for k, v in os.environ.items() if k not in ("LOCAL_RAY_DIR", "XDG_STATE_HOME")}
    environment.update(HOME=str(tmp_path), **env)
    return subprocess.run(["bash", "-c", f'source "{LOCAL}"; {command}'], env=environment, capture_output=True,
                          text=True, timeout=30)


def test_local_multinode_state_dir_is_private_and_unpredictable(tmp_path):
    pointer = tmp_path / ".local" / "state" / "orchestrator" / "local_multinode.dir"
    made = []
    try:
        for _ in range(2):
            result = state_dir_shell(tmp_path, 'STATE_DIR=""; new_state_dir; echo "$STATE_DIR"')
            assert result.returncode == 0, result.stderr
            state = Path(result.stdout.strip())
            made.append(state)
            assert state.parent == Path("/tmp") and re.fullmatch(r"orc-ray-[A-Za-z0-9]{10}", state.name)
            assert state.stat().st_mode & 0o777 == 0o700 and state.stat().st_uid == os.getuid()
            assert pointer.read_text().strip() == str(state) and pointer.stat().st_mode & 0o777 == 0o600
        assert made[0] != made[1]
        # `down` finds the recorded dir (no processes of it run here), removes it and forgets it
        down = subprocess.run(["bash", str(LOCAL), "down"], env={**os.environ, "HOME": str(tmp_path)},
                              capture_output=True, text=True, timeout=60)
        assert down.returncode == 0, down.stderr
        assert not made[1].exists() and not pointer.exists()
    finally:
        for state in made:
            shutil.rmtree(state, ignore_errors=True)


def test_local_multinode_given_state_dir_is_private_and_never_someone_elses(tmp_path):
    given = tmp_path / "cl"
    result = state_dir_shell(tmp_path, "new_state_dir", LOCAL_RAY_DIR=str(given))
    assert result.returncode == 0, result.stderr
    assert given.stat().st_mode & 0o777 == 0o700 and (given / ".local_multinode").is_file()
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "data").write_text("kept")
    result = state_dir_shell(tmp_path, "new_state_dir", LOCAL_RAY_DIR=str(foreign))
    assert result.returncode == 1 and "is not this script's state dir" in result.stderr
    assert (foreign / "data").read_text() == "kept"
    link = tmp_path / "link"
    link.symlink_to(given)
    result = state_dir_shell(tmp_path, "new_state_dir", LOCAL_RAY_DIR=str(link))
    assert result.returncode == 1 and (given / ".local_multinode").is_file()


RAY_STUB = """#!/usr/bin/env bash
# records its arguments; `ray status` reports three alive nodes
echo "$*" >>"$RAY_STUB_LOG"
if [[ "$1" == status ]]; then printf 'Active:\\n 1 node_a\\n 1 node_b\\n 1 node_c\\nPending:\\n'; fi
"""



def ray_stubs(tmp_path: Path) -> Path:
    """A folder of stand-ins for `ray` (records its calls, ``RAY_STUB``) and `pgrep` (no Ray runs),
    to put first on PATH: the cluster script's flow runs without starting a cluster."""
    stubs = tmp_path / "bin"
    stubs.mkdir()
    (stubs / "ray").write_text(RAY_STUB)
    (stubs / "pgrep").write_text("#!/usr/bin/env bash\nexit 1\n")
    for stub in stubs.iterdir():
        stub.chmod(0o755)
    return stubs

def test_local_multinode_up_status_down_keep_the_state_private(tmp_path):
    """The whole `up` → `status` → `down` flow with stand-ins for `ray` (records its calls) and
    `pgrep` (no Ray runs), so no cluster starts: where the token and state go, and that `down`
    finds them again without LOCAL_RAY_DIR."""
    stubs = ray_stubs(tmp_path)
    log = tmp_path / "ray.log"
    env = {k: v for k, v in os.environ.items() if k not in ("LOCAL_RAY_DIR", "XDG_STATE_HOME", "RAY_AUTH_TOKEN_PATH")}
    env.update(HOME=str(tmp_path), PATH=f"{stubs}:{env['PATH']}", RAY_STUB_LOG=str(log))
    up = subprocess.run(["bash", str(LOCAL), "up", "2"], env=env, capture_output=True, text=True, timeout=60)
    assert up.returncode == 0, up.stderr
    state = Path(re.search(r"its state \(token, logs\) is in (\S+) \(private\)", up.stdout).group(1))
    try:
        assert state.parent == Path("/tmp") and state.stat().st_mode & 0o777 == 0o700
        token = state / "auth_token"
        assert re.fullmatch(r"[0-9a-f]{64}\n", token.read_text()) and token.stat().st_mode & 0o777 == 0o600
        assert f"RAY_AUTH_TOKEN_PATH={token}" in (state / "cluster.env").read_text()
        starts = [line for line in log.read_text().splitlines() if line.startswith("start")]
        assert len(starts) == 3 and all(f"--temp-dir={state}/t{i}" in s for i, s in enumerate(starts))
        status = subprocess.run(["bash", str(LOCAL), "status"], env=env, capture_output=True, text=True, timeout=60)
        assert status.returncode == 0 and f"token file: {token}" in status.stdout, status.stderr
        down = subprocess.run(["bash", str(LOCAL), "down"], env=env, capture_output=True, text=True, timeout=60)
        assert down.returncode == 0, down.stderr
        assert not state.exists()
        again = subprocess.run(["bash", str(LOCAL), "down"], env=env, capture_output=True, text=True, timeout=60)
        assert again.returncode == 1 and "no local cluster from this script" in again.stderr
    finally:
        shutil.rmtree(state, ignore_errors=True)


def test_local_multinode_up_makes_an_existing_token_file_private(tmp_path):
    """A token file that existed before `up` (given as RAY_AUTH_TOKEN_PATH, mode 644) is used and
    left private (600), like the one `up` writes (issue 27, finding 7)."""
    stubs = ray_stubs(tmp_path)
    token = tmp_path / "my_token"
    token.write_text("0" * 64 + "\n")
    token.chmod(0o644)
    env = {k: v for k, v in os.environ.items() if k not in ("LOCAL_RAY_DIR", "XDG_STATE_HOME")}
    env.update(HOME=str(tmp_path), PATH=f"{stubs}:{env['PATH']}", RAY_STUB_LOG=str(tmp_path / "ray.log"),
               RAY_AUTH_TOKEN_PATH=str(token))
    up = subprocess.run(["bash", str(LOCAL), "up", "1"], env=env, capture_output=True, text=True, timeout=60)
    assert up.returncode == 0, up.stderr
    state = Path(re.search(r"its state \(token, logs\) is in (\S+) \(private\)", up.stdout).group(1))
    try:
        assert token.stat().st_mode & 0o777 == 0o600
        assert token.read_text() == "0" * 64 + "\n"  # used as it was, not replaced
    finally:
        subprocess.run(["bash", str(LOCAL), "down"], env=env, capture_output=True, text=True, timeout=60)
        shutil.rmtree(state, ignore_errors=True)
