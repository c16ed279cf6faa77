#!/usr/bin/env bash
# Runs one of seed 000's pre-GA scenarios (spool bench scenario, docs/benchmarks.md) against a
# broker it builds, starts with the settings the scenario needs, and stops afterwards:
#
#   scripts/scenario.sh kill-resurrect [flags]   embedded engine in a temporary directory
#   scripts/scenario.sh isolation      [flags]   embedded engine in a temporary directory
#   scripts/scenario.sh fanout         [flags]   PostgreSQL at $PG, in a fresh schema
#   scripts/scenario.sh backfill-oltp  [flags]   PostgreSQL at $PG, in a fresh schema
#
# Flags after the name go to `spool bench scenario <name>` and override the defaults below (the
# figures of docs/benchmarks.md were taken with them). The PostgreSQL scenarios need PG set to a
# connection URL, e.g. postgres://spool@127.0.0.1:5432/postgres?sslmode=disable; the schema is
# dropped at the end (with psql when it is on PATH). Ports: SCENARIO_ADDR (127.0.0.1:19392) and
# SCENARIO_ADMIN (127.0.0.1:18380).
set -euo pipefail
cd "$(dirname "$0")/.."

name=${1:-}
if [ -z "$name" ]; then
	sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//' >&2
	exit 2
fi
shift
addr=${SCENARIO_ADDR:-127.0.0.1:19392}
admin=${SCENARIO_ADMIN:-127.0.0.1:18380}

tmp=$(mktemp -d)
broker_pid=""
schema=""
cleanup() {
	if [ -n "$broker_pid" ]; then
		kill "$broker_pid" 2>/dev/null || true
		wait "$broker_pid" 2>/dev/null || true
	fi
	if [ -n "$schema" ] && command -v psql >/dev/null; then
		psql -q "$PG" -c "DROP SCHEMA IF EXISTS $schema CASCADE" >/dev/null 2>&1 || true
	fi
	rm -rf "$tmp"
}
trap cleanup EXIT

go build -o "$tmp/spool" ./cmd/spool

need_pg() {
	if [ -z "${PG:-}" ]; then
		echo "scenario $name runs on PostgreSQL: set PG to a connection URL" >&2
		exit 2
	fi
	schema="spool_scen_$$"
}

env=()
store=(--data-dir "$tmp/data")
defaults=()
case "$name" in
kill-resurrect)
	# Retention and DEAD detection short enough to see within the run.
	env=(SPOOL_BROKER_RETENTION_INTERVAL=5s SPOOL_WAL_SEGMENT_BYTES=4194304)
	defaults=(--rate 1000 --heartbeat-timeout 10s --live 2m --dead-for 2m --after 1m
		--message-retention 30s --backfill-bound 10000)
	;;
isolation)
	defaults=(--duration 2m)
	;;
fanout)
	need_pg
	# Buckets of 1 minute, retention every 10 s: retention drops buckets within the run.
	env=(SPOOL_POSTGRES_SCHEMA="$schema" SPOOL_POSTGRES_BUCKET_WIDTH=1m SPOOL_BROKER_RETENTION_INTERVAL=10s)
	store=(--store "$PG")
	defaults=(--pg "$PG" --pg-schema "$schema" --groups 4,16,64 --rate 2000 --message-retention 1m)
	;;
backfill-oltp)
	need_pg
	env=(SPOOL_POSTGRES_SCHEMA="$schema")
	store=(--store "$PG")
	defaults=(--pg "$PG")
	;;
*)
	echo "unknown scenario $name (kill-resurrect, isolation, fanout, backfill-oltp)" >&2
	exit 2
	;;
esac

env "${env[@]}" "$tmp/spool" serve "${store[@]}" --listen "$addr" --http "$admin" --log-level warn \
	>"$tmp/serve.log" 2>&1 &
broker_pid=$!
for _ in $(seq 100); do
	if curl -sf "http://$admin/healthz" >/dev/null 2>&1; then
		break
	fi
	if ! kill -0 "$broker_pid" 2>/dev/null; then
		cat "$tmp/serve.log" >&2
		exit 1
	fi
	sleep 0.1
done

rc=0
"$tmp/spool" bench scenario "$name" --addr "$addr" --admin "$admin" "${defaults[@]}" "$@" || rc=$?
if [ "$rc" -ne 0 ] && [ -s "$tmp/serve.log" ]; then
	echo "--- broker log" >&2
	tail -20 "$tmp/serve.log" >&2
fi
exit "$rc"
