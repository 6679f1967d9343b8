"""Drives a Shardline node's Batch API with the official `openai` Python SDK,
as a user's program would: upload, create, poll until done (request_counts
must never go back), download the output and error files, list. With
CANCEL_AFTER (a number), it cancels the batch with `batches.cancel` once that
many lines are done, and expects it to end `cancelled`.

Usage: python openai_batch.py BASE_URL API_KEY INPUT.jsonl ENDPOINT OUTPUT.jsonl ERRORS.jsonl [CANCEL_AFTER]
Prints one JSON summary line; exits non-zero on any failed expectation.
"""
import json
import sys
import time

import openai


def main() -> None:
    base_url, api_key, input_path, endpoint, output_path, errors_path = sys.argv[1:7]
    cancel_after = int(sys.argv[7]) if len(sys.argv) > 7 else None
    expected = "completed" if cancel_after is None else "cancelled"
    client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=60)

    with open(input_path, "rb") as f:
        file = client.files.create(file=f, purpose="batch")
    batch = client.batches.create(input_file_id=file.id, endpoint=endpoint, completion_window="24h",
                                  metadata={"test": "openai-sdk"})
    seen = []
    last = -1
    while batch.status not in ("completed", "failed", "cancelled", "expired"):
        time.sleep(0.05)
        batch = client.batches.retrieve(batch.id)
        done = batch.request_counts.completed + batch.request_counts.failed
        if done < last:
            raise SystemExit(f"request_counts went back from {last} to {done}")
        last = done
        seen.append(done)
        if cancel_after is not None and batch.status == "in_progress" and done >= cancel_after:
            batch = client.batches.cancel(batch.id)
            if batch.status not in ("cancelling", "cancelled"):
                raise SystemExit(f"cancel gave {batch.status}")
    if batch.status != expected:
        raise SystemExit(f"batch {batch.status}: {batch.errors}")

    def text(file_id):
        return client.files.content(file_id).text if file_id else ""

    with open(output_path, "w", encoding="utf-8", newline="") as f:
        f.write(text(batch.output_file_id))
    with open(errors_path, "w", encoding="utf-8", newline="") as f:
        f.write(text(batch.error_file_id))
    listed = client.batches.list(limit=10)
    counts = batch.request_counts
    print(json.dumps({
        "id": batch.id, "file": file.id, "status": batch.status,
        "counts": {"total": counts.total, "completed": counts.completed, "failed": counts.failed},
        "polls": len(seen), "distinct_counts": len(set(seen)), "metadata": batch.metadata,
        "cancelled_at": batch.cancelled_at, "listed": [b.id for b in listed.data],
    }))


if __name__ == "__main__":
    main()
