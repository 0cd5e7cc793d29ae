#!/usr/bin/env bash
# A multi-node Ray cluster on ONE machine: a head plus N worker nodes, each its own raylet with its own
# ports and temp dir, token authentication on. For trying multi-node behaviour (scheduling across
# nodes, shared storage, node failures) without a real cluster.
#
#   clusters/local_multinode.sh up 2      # head + 2 worker nodes (3 nodes), 1 CPU each; prints the addresses
#   clusters/local_multinode.sh status    # `ray status` of that cluster
#   clusters/local_multinode.sh down      # stops it and removes its token
#
# Then, in another shell (the script prints these lines with the real values):
#   export RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH=<state dir>/auth_token
#   orchestrator run pipelines/lifelong.yaml --ray-address 127.0.0.1:<gcs port> --storage /tmp/runs/lifelong
#   ray job submit --address http://127.0.0.1:<dashboard port> --working-dir . -- orchestrator run ...
# All nodes share this machine's disk, so a local --storage path is "shared storage" here.
#
# Settings (environment variables):
#   NUM_CPUS          logical CPUs each node offers (default 1)
#   OBJECT_STORE_MB   object store per node, MiB (default 300; all nodes share /dev/shm)
#   LOCAL_RAY_DIR     state dir: token, ports, per-node temp dirs. Default: a fresh private (0700),
#                     unpredictable dir made by `mktemp -d /tmp/orc-ray-XXXXXXXXXX`, whose path `up`
#                     records (mode 600) in $XDG_STATE_HOME/orchestrator/local_multinode.dir for
#                     `status` and `down`. If given, it is created mode 0700 and must not exist
#                     (or be this script's own). Keep it short: Ray's unix socket paths under it
#                     must stay below ~107 characters (hence /tmp, not $TMPDIR)
#   RAY_AUTH_TOKEN_PATH  an existing token file to use (made mode 600); by default `up` generates one (mode 600)
#
# `down` stops only this cluster's processes (found by their temp dirs under the state dir), never
# with `ray stop`, which would stop every Ray on the machine; so `up` does not wait for other Rays
# here either: this cluster's processes, ports, temp dirs and object stores (OBJECT_STORE_MB per
# node) are its own. Every port is picked free by the script and bound to 127.0.0.1.
set -euo pipefail
# shellcheck source=clusters/stop_processes.sh
source "$(dirname "${BASH_SOURCE[0]}")/stop_processes.sh"

POINTER_FILE="${XDG_STATE_HOME:-${HOME:?}/.local/state}/orchestrator/local_multinode.dir"
STATE_DIR="${LOCAL_RAY_DIR:-$(cat "$POINTER_FILE" 2>/dev/null || true)}"   # empty: no cluster recorded
NUM_CPUS="${NUM_CPUS:-1}"
OBJECT_STORE_MB="${OBJECT_STORE_MB:-300}"
WORKER_PORTS=64            # ports in each node's worker-port range (one per worker process)

usage() {
    sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
}

auth_env() {
    export RAY_AUTH_MODE=token
    export RAY_AUTH_TOKEN_PATH="${RAY_AUTH_TOKEN_PATH:-$STATE_DIR/auth_token}"
    unset RAY_AUTH_TOKEN RAY_ADDRESS        # this script talks to its own cluster, with the file's token
}

load_state() {
    if [[ -z "$STATE_DIR" || ! -f "$STATE_DIR/cluster.env" ]]; then
        echo "no local cluster recorded in $STATE_DIR (start one with: $0 up N)" >&2
        exit 1
    fi
    # shellcheck disable=SC1091
    source "$STATE_DIR/cluster.env"
}

new_state_dir() {  # sets STATE_DIR to a new private (0700) dir holding the marker file; see LOCAL_RAY_DIR
    if [[ -n "${LOCAL_RAY_DIR:-}" ]]; then
        STATE_DIR="$LOCAL_RAY_DIR"
        if [[ -e "$STATE_DIR" || -L "$STATE_DIR" ]]; then
            if [[ -L "$STATE_DIR" || ! -O "$STATE_DIR" || ! -f "$STATE_DIR/.local_multinode" ]]; then
                echo "$STATE_DIR exists and is not this script's state dir; set LOCAL_RAY_DIR to a new path" >&2
                exit 1
            fi
            rm -rf "$STATE_DIR"
        fi
        (umask 077 && mkdir -p "$STATE_DIR")
    else
        if [[ -n "$STATE_DIR" && -f "$STATE_DIR/.local_multinode" && -O "$STATE_DIR" && ! -L "$STATE_DIR" ]]; then
            rm -rf "$STATE_DIR"   # the state of an earlier cluster that is not up any more
        fi
        # not $TMPDIR: a long one would make Ray's socket paths too long
        STATE_DIR="$(mktemp -d /tmp/orc-ray-XXXXXXXXXX)"   # mode 0700, a name nobody can predict
        (umask 077 && mkdir -p "$(dirname "$POINTER_FILE")" && printf '%s\n' "$STATE_DIR" >"$POINTER_FILE")
    fi
    chmod 700 "$STATE_DIR"
    touch "$STATE_DIR/.local_multinode"
}

forget_state_dir() {  # the recorded path goes when its dir does
    if [[ "$(cat "$POINTER_FILE" 2>/dev/null || true)" == "$STATE_DIR" ]]; then
        rm -f "$POINTER_FILE"
    fi
}

# Free ports, chosen together so that none repeats: 3 for the head (GCS, dashboard, Ray client), then
# per node 6 single ports (node manager, object manager, dashboard agent http + grpc, runtime-env agent,
# metrics export) and a contiguous worker-port range below the kernel's ephemeral range.
pick_ports() {  # nodes -> one line per node: NM OM AGENT_HTTP AGENT_GRPC RTENV METRICS MIN_WORKER MAX_WORKER; first line: GCS DASH CLIENT
    python3 - "$1" "$WORKER_PORTS" <<'PY'
import random, socket, sys
nodes, width = int(sys.argv[1]), int(sys.argv[2])
held, used = [], set()

def single():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    held.append(s)                      # keep it bound until all are chosen: no repeats
    used.add(s.getsockname()[1])
    return s.getsockname()[1]

def free(port):
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False

def port_range():
    for _ in range(1000):
        lo = random.randrange(20000, 32000 - width)
        ports = range(lo, lo + width)
        if not used.intersection(ports) and all(free(p) for p in ports):
            used.update(ports)
            return lo, lo + width - 1
    sys.exit("no free range of %d ports found" % width)

print(single(), single(), single())
for _ in range(nodes):
    print(*[single() for _ in range(6)], *port_range())
for s in held:
    s.close()
PY
}

cmd_up() {
    local n="${1:-}"
    [[ "$n" =~ ^[0-9]+$ ]] || usage
    if [[ -n "$STATE_DIR" && -f "$STATE_DIR/cluster.env" && -n "$(own_pids)" ]]; then
        echo "a local cluster from this script is already up ($STATE_DIR); '$0 down' first" >&2
        exit 1
    fi

    new_state_dir
    auth_env
    if [[ ! -s "$RAY_AUTH_TOKEN_PATH" ]]; then
        (umask 077 && python3 -c 'import secrets; print(secrets.token_hex(32))' > "$RAY_AUTH_TOKEN_PATH")
    fi
    chmod 600 "$RAY_AUTH_TOKEN_PATH"      # private whatever existed before (a given or an older file)

    local nodes=$((n + 1)) lines head
    mapfile -t lines < <(pick_ports "$nodes")
    read -r GCS_PORT DASHBOARD_PORT CLIENT_PORT <<<"${lines[0]}"
    local store=$((OBJECT_STORE_MB * 1024 * 1024))

    # On failure part-way, stop what was started.
    trap 'echo "--- start failed; stopping the nodes started" >&2; kill -KILL $(own_pids) 2>/dev/null || true; rm -rf "$STATE_DIR"; forget_state_dir' ERR

    local i nm om ahttp agrpc rtenv metrics wmin wmax common
    for ((i = 0; i < nodes; i++)); do
        read -r nm om ahttp agrpc rtenv metrics wmin wmax <<<"${lines[i + 1]}"
        common=(
            --node-ip-address=127.0.0.1
            --num-cpus="$NUM_CPUS" --num-gpus=0
            --object-store-memory="$store"
            --node-manager-port="$nm" --object-manager-port="$om"
            --min-worker-port="$wmin" --max-worker-port="$wmax"
            --dashboard-agent-listen-port="$ahttp" --dashboard-agent-grpc-port="$agrpc"
            --runtime-env-agent-port="$rtenv" --metrics-export-port="$metrics"
            --temp-dir="$STATE_DIR/t$i"
            --disable-usage-stats
        )
        if (( i == 0 )); then
            echo "--- head: GCS 127.0.0.1:${GCS_PORT}, dashboard http://127.0.0.1:${DASHBOARD_PORT}"
            ray start --head --port="$GCS_PORT" \
                --include-dashboard=true --dashboard-host=127.0.0.1 --dashboard-port="$DASHBOARD_PORT" \
                --ray-client-server-port="$CLIENT_PORT" "${common[@]}" >"$STATE_DIR/start_t$i.log" 2>&1 \
                || { cat "$STATE_DIR/start_t$i.log" >&2; false; }
        else
            echo "--- worker node $i (node manager port ${nm}, worker ports ${wmin}-${wmax})"
            ray start --address="127.0.0.1:${GCS_PORT}" "${common[@]}" >"$STATE_DIR/start_t$i.log" 2>&1 \
                || { cat "$STATE_DIR/start_t$i.log" >&2; false; }
        fi
    done
    trap - ERR

    cat >"$STATE_DIR/cluster.env" <<EOF
GCS_ADDRESS=127.0.0.1:${GCS_PORT}
DASHBOARD=http://127.0.0.1:${DASHBOARD_PORT}
NODES=${nodes}
RAY_AUTH_TOKEN_PATH=${RAY_AUTH_TOKEN_PATH}
EOF
    wait_nodes "127.0.0.1:${GCS_PORT}" "$nodes"
    print_addresses "127.0.0.1:${GCS_PORT}" "http://127.0.0.1:${DASHBOARD_PORT}" "$nodes"
}

alive_nodes() {  # address -> number of alive nodes in `ray status`
    ray status --address "$1" 2>/dev/null | awk '/^Active:/{a=1; next} /^(Pending|Recent failures):/{a=0} a && /node_/{c++} END{print c+0}'
}

wait_nodes() {  # address, expected count: wait up to 60 s for all nodes to register
    local k have=0
    for ((k = 0; k < 30; k++)); do
        have="$(alive_nodes "$1")"
        (( have >= $2 )) && return 0
        sleep 2
    done
    echo "warning: only ${have} of $2 nodes alive after 60 s; see '$0 status' and $STATE_DIR/t*/session_latest/logs" >&2
}

print_addresses() {
    cat <<EOF
--- local Ray cluster up: $3 nodes
    GCS address (--ray-address, RAY_ADDRESS):  $1
    dashboard / job submission (--address):    $2
  use it from another shell with:
    export RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH=${RAY_AUTH_TOKEN_PATH}
    orchestrator run pipelines/lifelong.yaml --ray-address $1 --storage /tmp/runs/lifelong
    ray job submit --address $2 --working-dir . -- orchestrator run pipelines/lifelong.yaml --storage /tmp/runs/lifelong
  its state (token, logs) is in ${STATE_DIR} (private)
  stop it with: $0 down
EOF
}

cmd_status() {
    load_state
    auth_env
    echo "GCS address: ${GCS_ADDRESS}   dashboard: ${DASHBOARD}   nodes started: ${NODES}"
    echo "token file: ${RAY_AUTH_TOKEN_PATH}"
    ray status --address "$GCS_ADDRESS"
}

own_pids() {  # ids of this cluster's Ray processes: every one names its temp dir $STATE_DIR/tK
    # (GCS, raylets, dashboard, agents, monitors); worker processes exit with their raylet.
    pgrep -f -- "$STATE_DIR/t[0-9]" || true
}

cmd_down() {
    if [[ -z "$STATE_DIR" || ! -f "$STATE_DIR/.local_multinode" || ! -O "$STATE_DIR" ]]; then
        echo "no local cluster from this script${STATE_DIR:+ in $STATE_DIR}" >&2
        exit 1
    fi
    # Not `ray stop`: that would stop every Ray on this machine, other users' and other runs' too.
    if [[ -n "$(own_pids)" ]]; then
        echo "--- stopping this cluster's Ray processes (the raylets, the head's daemons, the GCS; SIGKILL after 10 s each)"
        stop_processes_matching "$STATE_DIR/t[0-9]"
    fi
    rm -rf "$STATE_DIR"      # token, port records and the nodes' temp dirs (logs)
    forget_state_dir
    echo "--- stopped; removed $STATE_DIR"
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then   # run, not sourced (tests source it to call its functions)
    case "${1:-}" in
        up) shift; cmd_up "$@" ;;
        status) cmd_status ;;
        down) cmd_down ;;
        *) usage ;;
    esac
fi
