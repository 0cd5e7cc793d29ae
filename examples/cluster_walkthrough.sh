#!/usr/bin/env bash
# Cluster walkthrough: the lifelong pipeline submitted as a Ray job to a Ray head on this machine,
# with token authentication on, then its lineage. Copy the steps you need onto a real cluster.
#
#   examples/cluster_walkthrough.sh                      # 3 epochs per generation, ./runs/walkthrough
#   EPOCHS=1 RUN_DIR=/tmp/wt examples/cluster_walkthrough.sh
#   EPOCHS= examples/cluster_walkthrough.sh              # empty: the file's own epochs (20; ~10 min on 2 cores)
#
# Settings (environment variables):
#   EPOCHS     epochs of every generation (default 3; empty = keep the pipeline file's)
#   RUN_DIR    where checkpoints, reports and the SQLite lineage go (default ./runs/walkthrough);
#              made absolute, because the job runs in a copy of this folder elsewhere on disk
#   PIPELINE   pipeline file, relative to the repository root (default pipelines/lifelong.yaml)
#   NUM_CPUS   CPUs the head offers (default 2: one for the training worker, one for the rest)
#   RAY_AUTH_TOKEN_PATH  an existing token file to use; by default a fresh one is generated
#
# Everything binds to 127.0.0.1 on ports picked free by the script, so it never collides with
# another service. Needs: `pip install -e .` (the `orchestrator` and `ray` commands on PATH).
set -euo pipefail

cd "$(dirname "$0")/.."                       # the repository root: what --working-dir uploads
EPOCHS="${EPOCHS-3}"
PIPELINE="${PIPELINE:-pipelines/lifelong.yaml}"
NUM_CPUS="${NUM_CPUS:-2}"
RUN_DIR="$(python3 -c 'import os, sys; print(os.path.abspath(sys.argv[1]))' "${RUN_DIR:-runs/walkthrough}")"
mkdir -p "$RUN_DIR"

# --- 1. Token authentication. Ray 2.60 checks a shared token on every request when
#        RAY_AUTH_MODE=token. Every process that talks to the cluster (ray start, ray job submit,
#        the dashboard, the job itself) reads the token from RAY_AUTH_TOKEN_PATH (or RAY_AUTH_TOKEN).
#        Alternative: `ray get-auth-token --generate` creates ~/.ray/auth_token once per user and
#        prints it; on a real cluster copy that file (mode 600) to every node and to your laptop.
export RAY_AUTH_MODE=token
TOKEN_DIR="$(mktemp -d)"
if [[ -z "${RAY_AUTH_TOKEN_PATH:-}" ]]; then
    export RAY_AUTH_TOKEN_PATH="$TOKEN_DIR/ray_token"
    (umask 077 && python3 -c 'import secrets; print(secrets.token_hex(32))' > "$RAY_AUTH_TOKEN_PATH")
fi
export RAY_AUTH_TOKEN_PATH
unset RAY_ADDRESS                             # this script talks to its own head only

# --- 2. Free ports, chosen by binding port 0 (all sockets open together, so the four differ).
read -r GCS_PORT DASHBOARD_PORT CLIENT_PORT AGENT_PORT < <(python3 -c '
import socket
socks = [socket.socket() for _ in range(4)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in socks))
for s in socks:
    s.close()')
DASHBOARD="http://127.0.0.1:${DASHBOARD_PORT}"   # job submission goes through the dashboard

# --- 3. Stop the head however the script ends (success, error, Ctrl-C), and remove the token.
#        Not with `ray stop`: that stops EVERY Ray on this machine (Ray has no per-head stop). This
#        head keeps its logs and sockets in its own temp dir, which every one of its processes
#        names on its command line, so those are the processes stopped. On a real cluster, run
#        `ray stop` on each node instead.
RAY_TEMP="$(mktemp -d /tmp/orc-wt-XXXXXXXX)"   # short: Ray's socket paths under it stay < 107 bytes
# shellcheck source=clusters/stop_processes.sh
source clusters/stop_processes.sh
cleanup() {
    local status=$?
    echo "--- stopping Ray"
    stop_processes_matching "$RAY_TEMP"
    rm -rf "$TOKEN_DIR" "$RAY_TEMP"
    exit "$status"
}
trap cleanup EXIT INT TERM

# --- 4. A one-node cluster: this machine is the head. Add workers on other machines with
#        `ray start --address <head-ip>:$GCS_PORT` (same RAY_AUTH_MODE and token there).
echo "--- starting a Ray head (GCS 127.0.0.1:${GCS_PORT}, dashboard ${DASHBOARD})"
ray start --head \
    --node-ip-address=127.0.0.1 \
    --port="$GCS_PORT" \
    --include-dashboard=true \
    --dashboard-host=127.0.0.1 \
    --dashboard-port="$DASHBOARD_PORT" \
    --dashboard-agent-listen-port="$AGENT_PORT" \
    --ray-client-server-port="$CLIENT_PORT" \
    --num-cpus="$NUM_CPUS" \
    --temp-dir="$RAY_TEMP" \
    --disable-usage-stats

# --- 5. Authentication is on: a request with a wrong token is refused before anything runs.
echo "--- a submission with a wrong token (must be refused)"
if refusal="$(RAY_AUTH_TOKEN="not-the-token" ray job submit --address "$DASHBOARD" -- \
        python3 -c 'print("this must not run")' 2>&1)"; then
    echo "the head accepted a wrong token: token authentication is off" >&2
    exit 1
fi
if ! grep -iE "authentication failed|invalid authentication token|unauthori[sz]ed" <<<"$refusal" | tail -1; then
    echo "the submission failed, but not for its token:" >&2
    tail -5 <<<"$refusal" >&2
    exit 1
fi

# --- 6. Submit the pipeline as a job. --working-dir . ships this repository (minus .gitignore'd
#        files such as runs/) to the cluster; the job's `orchestrator run` joins the cluster through
#        the RAY_ADDRESS the job manager sets. `--set` overrides any field of the file;
#        here the epochs of every generation and, because a few epochs may not train a compatible
#        update, the deployment gate's action: a generation that fails its gate re-embeds the whole
#        gallery (full_backfill) instead of being held. The command follows the job's log and
#        exits non-zero when the job fails.
SETS=()
if [[ -n "$EPOCHS" ]]; then
    COUNT="$(python3 -c 'import sys, yaml; print(len(yaml.safe_load(open(sys.argv[1]))["generations"]))' "$PIPELINE")"
    for ((i = 0; i < COUNT; i++)); do
        SETS+=(--set "generations.${i}.training.epochs=${EPOCHS}")
        SETS+=(--set "generations.${i}.gate.action=full_backfill")
    done
fi
echo "--- submitting: orchestrator run ${PIPELINE} --storage ${RUN_DIR} ${SETS[*]}"
ray job submit --address "$DASHBOARD" --working-dir . -- \
    orchestrator run "$PIPELINE" --storage "$RUN_DIR" "${SETS[@]}"

# --- 7. The lineage: which generation was trained from which, their key metrics, the serving
#        generation, the gallery shards. It reads the SQLite file under RUN_DIR (no Ray needed);
#        add --json for a machine-readable document.
echo "--- lineage"
orchestrator lineage "$PIPELINE" --storage "$RUN_DIR"
echo "--- done: results and reports under ${RUN_DIR}"
