// One graphile-worker process of leaseq's benchmark (bench/peers/graphile.py).
//   node run.js migrate          create graphile-worker's schema (GRAPHILE_SCHEMA)
//   node run.js drain            drain every job with runOnce, no-op task "noop"
// Settings come from the environment, never argv (the DSN holds a password):
//   LEASEQ_DSN, GRAPHILE_SCHEMA, GRAPHILE_CONCURRENCY, GRAPHILE_BATCHED=1 for the batched
//   mode (a local queue of GRAPHILE_LOCAL_QUEUE jobs per process, completions and
//   failures batched with a delay of 0 ms), else the default mode.
// The drain prints one JSON line: {"processed": N, "first_start": ms, "end": ms}, epoch
// milliseconds of the first handler call and of runOnce's return (after the batched
// completions were written), so the start-up is left out as for every other system.
"use strict";
const { runMigrations, runOnce } = require("graphile-worker");

const env = process.env;
const concurrency = Number(env.GRAPHILE_CONCURRENCY || "100");
const batched = env.GRAPHILE_BATCHED === "1";
const localQueue = Number(env.GRAPHILE_LOCAL_QUEUE || "500");

function preset() {
  const worker = {
    connectionString: env.LEASEQ_DSN,
    schema: env.GRAPHILE_SCHEMA,
    concurrentJobs: concurrency,
    // The batched mode fetches and completes through a few connections; the default mode
    // holds one per running job.
    maxPoolSize: batched ? 10 : concurrency + 2,
    pollInterval: 1000,
  };
  if (batched) {
    worker.localQueue = { size: localQueue };
    worker.completeJobBatchDelay = 0;
    worker.failJobBatchDelay = 0;
  }
  return { worker };
}

async function main() {
  const mode = process.argv[2];
  const options = { preset: preset(), noHandleSignals: true, logger: undefined };
  if (mode === "migrate") {
    await runMigrations(options);
    return;
  }
  let processed = 0;
  let firstStart = null;
  const taskList = {
    noop: async () => {
      if (firstStart === null) firstStart = Date.now();
      processed += 1;
    },
  };
  await runOnce({ ...options, taskList });
  const end = Date.now();
  process.stdout.write(JSON.stringify({ processed, first_start: firstStart, end }) + "\n");
}

main().catch((e) => {
  process.stderr.write(String(e && e.stack ? e.stack : e) + "\n");
  process.exit(1);
});
