// The Node.js client against a real PostgreSQL: LEASEQ_TEST_DSN names it and
// LEASEQ_TEST_SCHEMA a schema leaseq migrated (default "leaseq"; `leaseq migrate` makes
// it). tests/integration/test_node_client.py runs this suite in a fresh schema, with the
// parity cases Python's client decided (LEASEQ_PARITY_CASES), and a job enqueued here
// that a Python worker runs (roundtrip.ts).
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { after, before, test } from "node:test";
import { Pool } from "pg";

import { ConfigError, Leaseq, PayloadError, UniqueConflict } from "../src/index";

const dsn = process.env.LEASEQ_TEST_DSN;
if (!dsn) {
  throw new Error("set LEASEQ_TEST_DSN to a PostgreSQL whose schema leaseq migrated");
}
const schema = process.env.LEASEQ_TEST_SCHEMA ?? "leaseq";
const pool = new Pool({ connectionString: dsn, max: 4 });
const leaseq = new Leaseq(pool, { schema });

async function row(id: number): Promise<any> {
  const found = await pool.query(`SELECT * FROM "${schema}".jobs WHERE id = $1`, [id]);
  return found.rows[0];
}

before(async () => {
  await pool.query("SELECT 1");
});

after(async () => {
  await pool.end();
});

test("enqueue stores a job with its options", async () => {
  const id = await leaseq.enqueue("emails.send", { to: "a@example.com" }, {
    queue: "emails",
    priority: 5,
    maxAttempts: 3,
    idempotencyKey: "node-1",
  });
  const job = await row(id);
  assert.equal(job.task, "emails.send");
  assert.equal(job.queue_name, "emails");
  assert.deepEqual(job.payload, { to: "a@example.com" });
  assert.equal(job.priority, 5);
  assert.equal(job.max_attempts, 3);
  assert.equal(job.idempotency_key, "node-1");
  assert.equal(await leaseq.state(id), "pending");
  assert.equal(await leaseq.state(id + 1_000_000), null);
});

test("enqueue joins the caller's transaction", async () => {
  const client = await pool.connect();
  try {
    await client.query("BEGIN");
    const gone = await leaseq.enqueue("t", 1, {}, client);
    await client.query("ROLLBACK");
    assert.equal(await leaseq.state(gone), null);
    await client.query("BEGIN");
    const kept = await leaseq.enqueue("t", 2, { delay: 60 }, client);
    assert.equal(await leaseq.state(kept), null); // not visible before the commit
    await client.query("COMMIT");
    assert.equal(await leaseq.state(kept), "pending");
  } finally {
    client.release();
  }
});

test("enqueueMany keeps input order and stores nothing when one job is refused", async () => {
  const ids = await leaseq.enqueueMany([
    { task: "a", orderingKey: "node-k" },
    { task: "b", orderingKey: "node-k", runAt: new Date(Date.now() + 3600_000) },
  ]);
  assert.equal(ids.length, 2);
  assert.ok(ids[0] < ids[1]);
  assert.equal((await row(ids[1])).blocked, true);
  const before = await pool.query(`SELECT count(*)::int AS n FROM "${schema}".jobs`);
  await assert.rejects(
    leaseq.enqueueMany([{ task: "c" }, { task: "d", priority: 1.5 }]),
    (err: unknown) =>
      err instanceof ConfigError && err.code === "LQ001" && /priority must be an integer/.test(err.message),
  );
  const afterwards = await pool.query(`SELECT count(*)::int AS n FROM "${schema}".jobs`);
  assert.equal(afterwards.rows[0].n, before.rows[0].n);
});

test("refusals carry leaseq's errors", async () => {
  await assert.rejects(leaseq.enqueue("bad name!"), ConfigError);
  await assert.rejects(leaseq.enqueue("t", "x".repeat(1024 * 1024)), PayloadError);
  await assert.rejects(leaseq.enqueue("t", null, { dealy: 5 }), /unknown job option/);
  await leaseq.enqueue("t", null, { uniqueKey: "node-u" });
  await assert.rejects(
    leaseq.enqueue("t", null, { uniqueKey: "node-u", onConflict: "raise" }),
    UniqueConflict,
  );
  const holder = await leaseq.enqueue("t", null, { uniqueKey: "node-u" });
  assert.equal(await leaseq.state(holder), "pending");
});

test("cancel, then read the outcome", async () => {
  const id = await leaseq.enqueue("t");
  assert.equal(await leaseq.cancel(id, { actor: "node", reason: "not needed" }), true);
  assert.equal(await leaseq.cancel(id), false);
  const outcome = await leaseq.result(id);
  assert.equal(outcome?.status, "cancelled");
  assert.equal(outcome?.stored, false);
  const events = await pool.query(
    `SELECT actor FROM "${schema}".job_events WHERE job_id = $1 AND event = 'cancelled'`,
    [id],
  );
  assert.deepEqual(events.rows, [{ actor: "node" }]);
});

test("the same jobs are accepted and refused as by Python's client", async (t) => {
  const file = process.env.LEASEQ_PARITY_CASES;
  if (!file) {
    t.skip("LEASEQ_PARITY_CASES not given (tests/integration/test_node_client.py gives it)");
    return;
  }
  const cases: Array<{ label: string; job: Record<string, unknown>; expect: string | null }> =
    JSON.parse(readFileSync(file, "utf-8"));
  assert.ok(cases.length > 50);
  const disagree: string[] = [];
  for (const c of cases) {
    let got: string | null = null;
    try {
      // leaseq's own option names, as Python takes them.
      await leaseq.enqueueMany([c.job as any]);
    } catch (err) {
      got = err instanceof Error ? err.name : String(err);
    }
    if (got !== c.expect) disagree.push(`${c.label}: python ${c.expect}, node ${got}`);
  }
  assert.deepEqual(disagree, []);
});
