// A job across languages (tests/integration/test_node_client.py): `node roundtrip.js
// enqueue` enqueues task "add" from Node and prints its id; a Python worker runs it;
// `node roundtrip.js result ID` prints its outcome as JSON.
import { Pool } from "pg";

import { Leaseq } from "../src/index";

async function main(): Promise<void> {
  const pool = new Pool({ connectionString: process.env.LEASEQ_TEST_DSN });
  const leaseq = new Leaseq(pool, { schema: process.env.LEASEQ_TEST_SCHEMA ?? "leaseq" });
  try {
    if (process.argv[2] === "enqueue") {
      console.log(await leaseq.enqueue("add", { a: 2, b: 3 }, { queue: "node" }));
    } else {
      console.log(JSON.stringify(await leaseq.result(Number(process.argv[3]))));
    }
  } finally {
    await pool.end();
  }
}

main().catch((err) => {
  console.error(String(err));
  process.exit(1);
});
