# Sourced by clusters/local_multinode.sh and examples/cluster_walkthrough.sh: stop the Ray
# processes a script started itself, never with `ray stop` (that stops every Ray on the machine).
# Each of them names the script's own temp dir on its command line (GCS, raylets, dashboard,
# agents, monitors); worker processes exit with their raylet.

stop_processes_matching() {  # pgrep -f pattern: SIGTERM, then SIGKILL after 30 s
    local pattern="$1" pids k
    pids="$(pgrep -f -- "$pattern" || true)"
    [[ -z "$pids" ]] && return 0
    # shellcheck disable=SC2086
    kill -TERM $pids 2>/dev/null || true
    for ((k = 0; k < 30; k++)); do
        [[ -z "$(pgrep -f -- "$pattern" || true)" ]] && return 0
        sleep 1
    done
    pids="$(pgrep -f -- "$pattern" || true)"
    # shellcheck disable=SC2086
    [[ -n "$pids" ]] && kill -KILL $pids 2>/dev/null || true
}
