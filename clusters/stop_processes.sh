# Sourced by clusters/local_multinode.sh and examples/cluster_walkthrough.sh: stop the Ray
# processes a script started itself, never with `ray stop` (that stops every Ray on the machine).
# Each of them names the script's own temp dir on its command line (GCS, raylets, dashboard,
# agents, monitors); worker processes and the node agents exit with their raylet.
#
# In order, each group given up to 10 s after SIGTERM before SIGKILL: the raylets, then the
# head's other daemons (dashboard, monitors, client server), the GCS last. Measured with a head of
# Ray 2.60: all of them sent SIGTERM at once, the GCS, the autoscaler monitor and the raylet were
# still running 60 s later (each waiting on the others) while the dashboard agent spun a core; in
# this order every one exits within a second.

_stop_and_wait() {  # pids...: SIGTERM, wait up to 10 s, then SIGKILL whatever is left
    [[ $# -eq 0 ]] && return 0
    kill -TERM "$@" 2>/dev/null || true
    local k
    for ((k = 0; k < 50; k++)); do
        [[ -n "$(_running "$@")" ]] || return 0
        sleep 0.2
    done
    kill -KILL "$@" 2>/dev/null || true
}

_running() {  # the pids among those given that still run (an exited one is gone or a zombie)
    [[ $# -eq 0 ]] && return 0
    ps -o pid=,stat= -p "$(IFS=,; echo "$*")" 2>/dev/null | awk '$2 !~ /^Z/ {print $1}'
}

stop_processes_matching() {  # pgrep -f pattern
    local pattern="$1" raylets gcs rest="" pid
    raylets="$(pgrep -f -- "/raylet .*$pattern" || true)"
    gcs="$(pgrep -f -- "/gcs_server .*$pattern" || true)"
    # shellcheck disable=SC2086
    _stop_and_wait $raylets
    for pid in $(pgrep -f -- "$pattern" || true); do
        [[ " $gcs " == *" $pid "* ]] || rest="$rest $pid"
    done
    # shellcheck disable=SC2086
    _stop_and_wait $(_running $rest)
    # shellcheck disable=SC2086
    _stop_and_wait $(_running $gcs $(pgrep -f -- "$pattern" || true))
}
