#!/usr/bin/env bash
# Issue 16 item 2: N empty topics under a limit of open files. Starts `spool serve` under
# `prlimit --nofile=LIMIT`, creates N topics (spool topic create), prints the server's open file
# descriptors and the data directory's disk use, publishes one message to every topic over one
# text-mode connection, restarts the server under the same limit (Open opens every log) and
# checks that a topic still answers, then removes everything it made.
#
#   go build -o /tmp/spool ./cmd/spool
#   scripts/fdtopics.sh /tmp/spool 10000 4096        # binary, topics, ulimit -n
#
# Ports: SPOOL_FD_TCP and SPOOL_FD_HTTP (default: free ones picked at random). Needs prlimit and
# bash's /dev/tcp. Exits 1 if a step failed (a topic not created, a publish refused, a server that
# did not start).
set -euo pipefail

bin=${1:?usage: fdtopics.sh SPOOL_BINARY [TOPICS] [NOFILE]}
topics=${2:-10000}
nofile=${3:-4096}
# free reports whether nothing listens on 127.0.0.1:$1.
free() { ! (exec 9<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
pick() {
	local p
	while :; do
		p=$((20000 + RANDOM % 12000)) # below the ephemeral ports
		if free "$p"; then
			echo "$p"
			return
		fi
	done
}
tcp=${SPOOL_FD_TCP:-$(pick)}
http=${SPOOL_FD_HTTP:-$(pick)}
if ! free "$tcp" || ! free "$http"; then
	echo "port $tcp or $http is in use" >&2
	exit 1
fi
work=$(mktemp -d /tmp/spool-fdtopics.XXXXXX)
data=$work/data
pid=
status=0

cleanup() {
	if [[ -n $pid ]]; then
		kill "$pid" 2>/dev/null || true
		wait "$pid" 2>/dev/null || true
	fi
	rm -rf "$work"
}
trap cleanup EXIT

start() {
	prlimit --nofile="$nofile:$nofile" -- "$bin" serve --data-dir "$data" --listen "127.0.0.1:$tcp" \
		--http "127.0.0.1:$http" --log-level warn 2>>"$work/serve.log" &
	pid=$!
	for _ in $(seq 600); do
		if ! kill -0 "$pid" 2>/dev/null; then
			break
		fi
		if curl -fsS "http://127.0.0.1:$http/readyz" >/dev/null 2>&1 && kill -0 "$pid" 2>/dev/null; then
			return 0
		fi
		sleep 0.1 # polling the server's start, not a test assertion
	done
	echo "server did not start; its log:" >&2
	cat "$work/serve.log" >&2
	exit 1
}

stop() {
	kill -TERM "$pid"
	wait "$pid" || true
	pid=
}

report() {
	local fds alloc apparent
	fds=$(ls "/proc/$pid/fd" | wc -l)
	# du complains about files the server removes while it walks (trash/): ignore that.
	alloc=$( (du -s --block-size=1 "$data" 2>/dev/null || true) | cut -f1)
	apparent=$( (du -s --apparent-size --block-size=1 "$data" 2>/dev/null || true) | cut -f1)
	printf '%s: open fds %d (limit %d), disk %d MiB allocated (%d MiB apparent)\n' \
		"$1" "$fds" "$nofile" $((alloc >> 20)) $((apparent >> 20))
}

echo "binary $bin, $topics topics, ulimit -n $nofile, data in $data"
start
report "started"

t0=$(date +%s)
seq 0 $((topics - 1)) | xargs -P 2 -I{} sh -c \
	'"$0" topic create --http "http://127.0.0.1:$1" "fd.t{}" >/dev/null 2>>"$2/create.err" || echo fail' \
	"$bin" "$http" "$work" >"$work/create.out"
failed=$(grep -c fail "$work/create.out" || true)
echo "created $((topics - failed)) of $topics topics in $(($(date +%s) - t0)) s"
if ((failed > 0)); then
	echo "first errors:" && head -3 "$work/create.err"
	status=1
fi
report "after creating"

# One message to every topic over one text-mode connection (OK <offset> per line).
t0=$(date +%s)
exec 3<>"/dev/tcp/127.0.0.1/$tcp"
ok=0
for ((i = 0; i < topics; i += 500)); do # 500 commands, then their 500 answers
	for ((j = i; j < i + 500 && j < topics; j++)); do
		printf 'PUBLISH fd.t%d x\n' "$j" >&3
	done
	for ((j = i; j < i + 500 && j < topics; j++)); do
		IFS= read -r -t 60 line <&3 || break 2
		[[ $line == OK* ]] && ok=$((ok + 1))
	done
done
exec 3>&-
echo "published to $ok of $topics topics in $(($(date +%s) - t0)) s"
((ok == topics)) || status=1
report "after publishing"

stop
start
report "restarted"
if ! "$bin" topic describe --http "http://127.0.0.1:$http" "fd.t$((topics - 1))" >/dev/null; then
	echo "topic fd.t$((topics - 1)) does not answer after the restart"
	status=1
fi
if grep -q "too many open files" "$work/serve.log"; then
	echo "the server ran out of file descriptors:"
	grep -m3 "too many open files" "$work/serve.log"
	status=1
fi
stop
exit $status
