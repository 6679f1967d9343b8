# Sourced by bench/prefix_job_path.sh and bench/prefix_store_restart.sh:
# issue 42's workload (a), the binary and model shape both scripts run, and
# the metrics reader.

bin=./build/cli/shardline
shape=${SHAPE:-../shared/models/shapes/stories110m}

# write_workload_a FILE: one 1,000-token head + 64-token questions, 256
# lines, 64 out (token ids, seeded, so every run writes the same job).
write_workload_a() {
  python3 - "$1" <<'PY'
import json, random, sys
rng = random.Random(42)
head = [rng.randrange(3, 32000) for _ in range(1000)]
with open(sys.argv[1], "w") as f:
    for i in range(256):
        prompt = head + [rng.randrange(3, 32000) for _ in range(64)]
        body = {"prompt": prompt, "max_tokens": 64, "temperature": 0, "ignore_eos": True}
        f.write(json.dumps({"custom_id": f"a{i}", "body": body}) + "\n")
PY
}

# metric FILE NAME: the sum over NAME's series in a Prometheus text file.
metric() {
  awk -v n="$2" '$1 ~ "^"n"({|$)" {s += $2} END {printf "%.0f", s}' "$1"
}
