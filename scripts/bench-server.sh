# Sourced by the benchmark scripts that time NBD servers (bench-nbd.sh, bench-rbd.sh): start a
# server, wait until it answers, stop it and read the CPU time it used.
#
# The caller sets: bench (its name, for messages), sock and uri (where the server listens), out
# (a directory for logs), server="" (the running wrapper's pid), and optionally the array
# pin_client (a command prefix such as `taskset -c 0`) to run the server under.

# Runs a command as a child, passes SIGTERM on to it, and when it exits writes its rusage (user +
# system seconds of every thread it ever had; microseconds, where /proc's clock ticks are too
# coarse) to $usage.
usage="$out/usage"
rusage_py='
import os, signal, sys
out, argv = sys.argv[1], sys.argv[2:]
pid = os.fork()
if pid == 0:
    os.execvp(argv[0], argv)
for sig in (signal.SIGTERM, signal.SIGINT):
    signal.signal(sig, lambda s, f: os.kill(pid, signal.SIGTERM))
while True:
    try:
        _, status, ru = os.wait4(pid, 0)
        break
    except InterruptedError:
        continue
open(out, "w").write(f"{ru.ru_utime + ru.ru_stime:.6f}\n")
'

start() { # command...: starts it and waits (up to 30 s) until it serves
  rm -f "$sock" "$usage"
  "${pin_client[@]}" /usr/bin/python3 -c "$rusage_py" "$usage" "$@" >/dev/null 2>"$out/server.log" &
  server=$!
  for _ in $(seq 600); do
    if [ -S "$sock" ] && nbdinfo --size "$uri" >/dev/null 2>&1; then return; fi
    sleep 0.05
  done
  echo "$bench: server did not start: $*" >&2
  cat "$out/server.log" >&2
  exit 1
}

stop() { # sets $cpu to the server's CPU seconds (not in a subshell: wait needs the parent)
  kill "$server"
  wait "$server" 2>/dev/null || true
  server=""
  cpu=$(cat "$usage")
}

idle() { # command...: starts and stops it with no client, setting $cpu to what serving nothing cost
  start "$@"
  stop
}
