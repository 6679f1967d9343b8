#!/usr/bin/env bash
# Starts, stops and inspects a multi-node Shardline cluster (docs/deploy.md).
#
#   deploy/cluster.sh [options] start [-- NODE-START-FLAGS...]
#   deploy/cluster.sh [options] status
#   deploy/cluster.sh [options] stop
#   deploy/cluster.sh [options] kill NAME      (kill -9 one node, to test recovery)
#
# Options:
#   --hosts FILE     one node per line: NAME HOST[:PORT] [node start flags...]
#                    ('#' starts a comment). The first node runs the
#                    orchestrator and listens on HOST:PORT (7411 by default);
#                    the others join it. Nodes are reached with ssh HOST
#                    (keys, users and ports from ~/.ssh/config).
#   --local N        N nodes on this machine instead (node0 .. node{N-1};
#                    node0 listens on a free loopback port), no ssh.
#   --model DIR      the model folder (the same path on every host). Needed by start.
#   --dir DIR        where each host keeps the cluster key, NAME.log, NAME.pid
#                    and NAME.data/ (default ./shardline-cluster; the same
#                    path on every host).
#   --bin PATH       the shardline binary on the hosts (default: shardline on
#                    PATH; with --local, this checkout's build/cli/shardline
#                    when it exists).
#   --timeout S      seconds start waits for the nodes (default 120).
# Flags after `--` go to every node's `shardline node start`, after the
# host line's own.
#
# start creates the cluster key (DIR/cluster.key, `shardline cluster init`)
# unless it exists, copies it to every host (scp), starts the first node,
# waits until it listens, then starts the others with --join and waits
# until each one's workers are registered. It prints the cluster address
# and writes it to DIR/cluster.addr. status prints each node's process state
# and the cluster's `job status` (jobs and actors); it exits 1 when a node is
# down. stop sends SIGTERM (the
# joined nodes first), waits, then SIGKILL.
set -euo pipefail

usage() { sed -n '2,36p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-2}"; }
die() { echo "cluster.sh: $*" >&2; exit 1; }

hosts_file="" local_n="" model="" dir="shardline-cluster" bin="" timeout_s=120
cmd="" target="" extra=()
while [[ $# -gt 0 ]]; do
  case $1 in
    --hosts) hosts_file=$2; shift 2 ;;
    --local) local_n=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    --bin) bin=$2; shift 2 ;;
    --timeout) timeout_s=$2; shift 2 ;;
    -h|--help) usage 0 ;;
    --) shift; extra=("$@"); break ;;
    start|stop|status) cmd=$1; shift ;;
    kill) cmd="kill"; target=${2:-}; [[ -n $target ]] || die "kill needs a node NAME"; shift 2 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
[[ -n $cmd ]] || usage
[[ -n $hosts_file || -n $local_n ]] || die "give --hosts FILE or --local N"
[[ -z $hosts_file || -z $local_n ]] || die "--hosts and --local exclude each other"
if [[ -n $local_n ]]; then
  [[ $local_n =~ ^[1-9][0-9]*$ ]] || die "--local needs a number of nodes, got '$local_n'"
fi
dir=$(realpath -m "$dir")
[[ -z $model ]] || model=$(realpath -m "$model")
if [[ -z $bin ]]; then
  here=$(cd "$(dirname "$0")/.." && pwd)
  if [[ -n $local_n && -x $here/build/cli/shardline ]]; then bin=$here/build/cli/shardline; else bin=shardline; fi
fi

# ---- the nodes: names[i], hosts[i] (ssh target), addrs[i], flags[i] ------------
names=() hosts=() addrs=() flags=()
if [[ -n $local_n ]]; then
  for ((i = 0; i < local_n; i++)); do
    names+=("node$i"); hosts+=(""); addrs+=("127.0.0.1:0"); flags+=("")
  done
else
  [[ -r $hosts_file ]] || die "cannot read the hosts file $hosts_file"
  while read -r name addr rest; do
    [[ -z $name || $name == \#* ]] && continue
    [[ -n $addr ]] || die "$hosts_file: node $name has no HOST"
    [[ $name =~ ^[A-Za-z0-9_.-]+$ ]] || die "$hosts_file: bad node name '$name'"
    names+=("$name"); hosts+=("${addr%%:*}")
    [[ $addr == *:* ]] && addrs+=("$addr") || addrs+=("$addr:7411")
    flags+=("${rest%%#*}")
  done < "$hosts_file"
  [[ ${#names[@]} -gt 0 ]] || die "$hosts_file lists no nodes"
fi

# Runs a shell command on node i's host (here with --local).
on() {
  local i=$1; shift
  if [[ -z ${hosts[$i]} ]]; then bash -c "$*"; else ssh -o BatchMode=yes "${hosts[$i]}" "$*"; fi
}
q() { printf '%q' "$1"; }
index_of() {
  local i
  for i in "${!names[@]}"; do [[ ${names[$i]} == "$1" ]] && { echo "$i"; return 0; }; done
  die "no node named '$1'"
}
key=$dir/cluster.key
pid_of() { on "$1" "cat $(q "$dir/${names[$1]}.pid") 2>/dev/null" || true; }
# A zombie (a killed node nobody reaped yet) is not alive.
alive() {
  local pid; pid=$(pid_of "$1")
  [[ $pid =~ ^[0-9]+$ ]] || return 1
  on "$1" "s=\$(awk '/^State:/ {print \$2}' /proc/$pid/status 2>/dev/null); [ -n \"\$s\" ] && [ \"\$s\" != Z ]"
}
cluster_addr() {
  [[ -r $dir/cluster.addr ]] || die "no $dir/cluster.addr: is the cluster started?"
  cat "$dir/cluster.addr"
}

start_node() {  # i, join address ("" for the first node)
  local i=$1 join=$2 name=${names[$1]} role
  if alive "$i"; then die "node $name is already running (pid $(pid_of "$i"))"; fi
  if [[ -z $join ]]; then role="--listen $(q "${addrs[$i]}")"; else role="--join $(q "$join")"; fi
  local extra_q="" f
  for f in "${extra[@]+"${extra[@]}"}"; do extra_q+=" $(q "$f")"; done
  on "$i" "mkdir -p $(q "$dir") && cd $(q "$dir") && : > $(q "$name.log") &&
    { nohup $(q "$bin") node start --name $(q "$name") $role --model $(q "$model") \
        --data-dir $(q "$dir/$name.data") --key-file $(q "$key") ${flags[$i]}$extra_q \
        >> $(q "$name.log") 2>&1 < /dev/null & echo \$! > $(q "$name.pid"); }"
}

# Waits until node i's log has a line matching the regex $2; prints it.
wait_log() {
  local i=$1 pattern=$2 deadline=$((SECONDS + timeout_s)) line
  while ((SECONDS < deadline)); do
    line=$(on "$i" "grep -m1 -E $(q "$pattern") $(q "$dir/${names[$i]}.log")" 2>/dev/null || true)
    [[ -n $line ]] && { echo "$line"; return 0; }
    alive "$i" || { on "$i" "tail -n 20 $(q "$dir/${names[$i]}.log")" >&2 || true; die "node ${names[$i]} exited"; }
    sleep 0.2
  done
  die "node ${names[$i]}: no '$pattern' in its log after ${timeout_s}s"
}

do_start() {
  [[ -n $model ]] || die "start needs --model DIR"
  mkdir -p "$dir"
  [[ -r $key ]] || "$bin" cluster init --key-file "$key" >/dev/null
  local i
  for i in "${!names[@]}"; do
    [[ -n ${hosts[$i]} ]] || continue
    on "$i" "mkdir -p $(q "$dir")"
    scp -q -o BatchMode=yes "$key" "${hosts[$i]}:$key"
  done
  start_node 0 ""
  local line addr
  line=$(wait_log 0 'listening on [^ ]+:[0-9]+')
  addr=$(sed -E 's/.*listening on ([^ ]+:[0-9]+).*/\1/' <<< "$line")
  # A wildcard listen address: the others reach the first node by its host.
  if [[ ${addr%:*} == 0.0.0.0 && -n ${hosts[0]} ]]; then addr=${hosts[0]}:${addr##*:}; fi
  echo "$addr" > "$dir/cluster.addr"
  echo "node ${names[0]}: orchestrator on $addr (pid $(pid_of 0))"
  for ((i = 1; i < ${#names[@]}; i++)); do start_node "$i" "$addr"; done
  # Each joined node counts once a worker named NAME/... is registered.
  local deadline=$((SECONDS + timeout_s)) actors missing
  while true; do
    actors=$("$bin" actor list --node "$addr" --key-file "$key" 2>/dev/null || true)
    missing=""
    for i in "${!names[@]}"; do
      grep -q "^${names[$i]}/" <<< "$actors" || missing+=" ${names[$i]}"
      ((i == 0)) || alive "$i" || die "node ${names[$i]} exited (see $dir/${names[$i]}.log on its host)"
    done
    [[ -z $missing ]] && break
    ((SECONDS < deadline)) || die "no workers of$missing registered after ${timeout_s}s"
    sleep 0.3
  done
  for ((i = 1; i < ${#names[@]}; i++)); do echo "node ${names[$i]}: joined (pid $(pid_of "$i"))"; done
  echo "cluster: ${#names[@]} nodes; clients: --node $addr --key-file $key"
}

do_status() {
  local i rc=0
  for i in "${!names[@]}"; do
    if alive "$i"; then echo "node ${names[$i]}: running (pid $(pid_of "$i"))"
    else echo "node ${names[$i]}: down"; rc=1; fi
  done
  local addr
  addr=$(cluster_addr)
  echo
  # The jobs, then every actor with its state.
  "$bin" job status --node "$addr" --key-file "$key" || rc=1
  return $rc
}

stop_node() {  # i, signal
  local pid; pid=$(pid_of "$1")
  if [[ -n $pid ]]; then on "$1" "kill -$2 $pid 2>/dev/null" || true; fi
}

do_stop() {
  local i n=${#names[@]} deadline
  for ((i = n - 1; i >= 0; i--)); do stop_node "$i" TERM; done
  deadline=$((SECONDS + 30))
  for ((i = n - 1; i >= 0; i--)); do
    while alive "$i" && ((SECONDS < deadline)); do sleep 0.2; done
    if alive "$i"; then stop_node "$i" KILL; echo "node ${names[$i]}: killed (no exit 30 s after SIGTERM)"
    else echo "node ${names[$i]}: stopped"; fi
    on "$i" "rm -f $(q "$dir/${names[$i]}.pid")"
  done
}

case $cmd in
  start) do_start ;;
  status) do_status ;;
  stop) do_stop ;;
  kill)
    i=$(index_of "$target")
    alive "$i" || die "node $target is not running"
    stop_node "$i" KILL
    for _ in $(seq 50); do alive "$i" || break; sleep 0.1; done
    alive "$i" && die "node $target is still running after SIGKILL"
    echo "node $target: killed (SIGKILL)" ;;
esac
