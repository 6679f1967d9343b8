// Parses PromQL expressions with Prometheus' own parser (the one its web UI
// uses, @prometheus-io/lezer-promql) and reports those that do not parse.
// Usage: node check_promql.mjs EXPRS.json   (a JSON array of strings)
// Prints one line per expression: "ok" or "error at OFFSET: EXPR".
import fs from 'node:fs';
import { parser } from '@prometheus-io/lezer-promql';

const exprs = JSON.parse(fs.readFileSync(process.argv[2], 'utf8'));
for (const e of exprs) {
  let bad = -1;
  parser.parse(e).iterate({ enter: (n) => { if (n.type.isError && bad < 0) bad = n.from; } });
  console.log(bad < 0 ? 'ok' : `error at ${bad}: ${e}`);
}
