#!/usr/bin/env bash
# `make demo`: local Kinesis + DynamoDB, a 2-shard stream, the word producer and the Spark word
# count (counts printed every 1 s batch). Stops cleanly on Ctrl-C or after DEMO_SECONDS (30).
#   DEMO_SECONDS=60 DEMO_RATE=200 DEMO_AGGREGATE=1 make demo
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
python="${PYTHON:-$root/.venv/bin/python}"
seconds="${DEMO_SECONDS:-30}"
rate="${DEMO_RATE:-100}"
work="$(mktemp -d "${TMPDIR:-/tmp}/kinesis-dstream-demo.XXXXXX")"
stream="demo-words-$$"
app="demo-wordcount-$$"
local_pid=""; count_pid=""; producer_pid=""

stop_all() {
  trap - INT TERM EXIT
  [ -n "$producer_pid" ] && kill -TERM "$producer_pid" 2>/dev/null && wait "$producer_pid" 2>/dev/null
  if [ -n "$count_pid" ] && kill -0 "$count_pid" 2>/dev/null; then
    echo "demo: stopping the word count gracefully..." >&2
    kill -TERM "$count_pid" 2>/dev/null; wait "$count_pid" 2>/dev/null
  fi
  [ -n "$local_pid" ] && kill -TERM "$local_pid" 2>/dev/null && wait "$local_pid" 2>/dev/null
  rm -rf "$work"
}
trap 'stop_all; exit 130' INT TERM
trap stop_all EXIT

echo "demo: starting local Kinesis and DynamoDB (kinesis-dstream local)..." >&2
"$python" -m kinesis_dstream local > "$work/env.sh" 2> "$work/local.log" &
local_pid=$!
for _ in $(seq 1 600); do
  grep -q AWS_ENDPOINT_URL_DYNAMODB "$work/env.sh" 2>/dev/null && break
  kill -0 "$local_pid" 2>/dev/null || { cat "$work/local.log" >&2; echo "demo: emulators failed" >&2; exit 1; }
  sleep 0.1
done
# shellcheck disable=SC1091
. "$work/env.sh"
cat "$work/env.sh" >&2

"$python" - "$stream" <<'PY' || exit 1
import sys, time, boto3
kinesis = boto3.client("kinesis")
kinesis.create_stream(StreamName=sys.argv[1], ShardCount=2)
while kinesis.describe_stream_summary(StreamName=sys.argv[1])["StreamDescriptionSummary"]["StreamStatus"] != "ACTIVE":
    time.sleep(0.1)
print(f"demo: stream {sys.argv[1]} is ACTIVE (2 shards)", file=sys.stderr)
PY

echo "demo: word count (Spark, 1 s batches) for ${seconds} s; Ctrl-C stops it cleanly" >&2
KINESIS_INITIAL_POSITION=TRIM_HORIZON WORDCOUNT_SECONDS="$seconds" \
  "$here/run-example" streaming.KinesisWordCountASL "$app" "$stream" "$AWS_ENDPOINT_URL_KINESIS" "$AWS_DEFAULT_REGION" &
count_pid=$!
producer_args=()
[ -n "${DEMO_AGGREGATE:-}" ] && producer_args+=(--aggregate)
"$here/run-example" streaming.KinesisWordProducerASL "$stream" "$AWS_ENDPOINT_URL_KINESIS" "$rate" 5 \
  --seconds "$(( seconds > 10 ? seconds - 8 : seconds / 2 ))" "${producer_args[@]}" > "$work/producer.log" 2>&1 &
producer_pid=$!
wait "$producer_pid"; producer_pid=""
tail -1 "$work/producer.log" | sed 's/^/demo: producer /' >&2
wait "$count_pid"; count_pid=""
echo "demo: done" >&2
