// Drives a Shardline node's Batch API with the official `openai` SDK, as a
// user's program would: upload, create, poll until done (request_counts must
// never go back), download the output and error files. With CANCEL_AFTER
// (a number), it cancels the batch with `batches.cancel` once that many
// lines are done, and expects it to end `cancelled`.
// Usage: node openai_batch.mjs BASE_URL API_KEY INPUT.jsonl ENDPOINT OUTPUT.jsonl ERRORS.jsonl [CANCEL_AFTER]
import fs from 'node:fs';
import OpenAI from 'openai';

const [, , baseURL, apiKey, input, endpoint, outputPath, errorsPath, cancelAfter] = process.argv;
const expected = cancelAfter === undefined ? 'completed' : 'cancelled';
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 60_000 });

const file = await client.files.create({ file: fs.createReadStream(input), purpose: 'batch' });
let batch = await client.batches.create({ input_file_id: file.id, endpoint, completion_window: '24h',
                                          metadata: { test: 'openai-sdk' } });
const seen = [];
let last = -1;
while (!['completed', 'failed', 'cancelled', 'expired'].includes(batch.status)) {
  await new Promise((resolve) => setTimeout(resolve, 50));
  batch = await client.batches.retrieve(batch.id);
  const done = batch.request_counts.completed + batch.request_counts.failed;
  if (done < last) throw new Error(`request_counts went back from ${last} to ${done}`);
  last = done;
  seen.push(done);
  if (cancelAfter !== undefined && batch.status === 'in_progress' && done >= Number(cancelAfter)) {
    batch = await client.batches.cancel(batch.id);
    if (!['cancelling', 'cancelled'].includes(batch.status)) throw new Error(`cancel gave ${batch.status}`);
  }
}
if (batch.status !== expected) throw new Error(`batch ${batch.status}: ${JSON.stringify(batch.errors)}`);
const text = async (id) => (id ? await (await client.files.content(id)).text() : '');
fs.writeFileSync(outputPath, await text(batch.output_file_id));
fs.writeFileSync(errorsPath, await text(batch.error_file_id));
const listed = await client.batches.list({ limit: 10 });
console.log(JSON.stringify({
  id: batch.id, file: file.id, status: batch.status, counts: batch.request_counts, polls: seen.length,
  distinct_counts: new Set(seen).size, metadata: batch.metadata, cancelled_at: batch.cancelled_at, listed: listed.data.map((b) => b.id),
}));
