// leaseq for Node.js: enqueue, read and cancel leaseq jobs over leaseq's SQL API
// (docs/sql-api.md), through the `pg` driver. Every check and every insert is the
// database's: the functions run the Python client's own statements and checks, so this
// client holds no rule of its own (it only renames camelCase options to leaseq's names).

/** What runs a query: a pg Pool, a Client, or a PoolClient inside your transaction. */
export interface Queryable {
  query(text: string, values?: unknown[]): Promise<{ rows: any[] }>;
}

/** enqueue's options (leaseq/jobspec.py), camelCase or leaseq's own snake_case names. */
export interface EnqueueOptions {
  queue?: string;
  priority?: number;
  /** When the job becomes claimable: a Date or an ISO 8601 text with its offset. */
  runAt?: Date | string;
  /** Seconds from now, on the database clock. */
  delay?: number;
  maxAttempts?: number;
  payloadVersion?: number;
  idempotencyKey?: string;
  orderingKey?: string;
  keyPolicy?: "block" | "skip";
  uniqueKey?: string;
  uniqueFor?: number;
  uniqueStates?: string[];
  onConflict?: "skip" | "replace" | "raise";
  debounce?: number;
  debounceMax?: number;
  limitKey?: string;
  /** Ids of jobs this one waits for. */
  dependsOn?: number[];
  onDead?: "cancel" | "run" | "ignore";
  /** The start deadline: seconds from now, or a Date / ISO 8601 text. */
  expires?: number | Date | string;
  /** The units (slots) it takes of every concurrency limit that applies (1 to 1000). */
  cost?: number;
  batchId?: number;
  [name: string]: unknown;
}

/** One job of enqueueMany. */
export interface JobSpec extends EnqueueOptions {
  task: string;
  payload?: unknown;
}

/** A job's outcome as leaseq's job_result reads it. */
export interface JobResult {
  status: string;
  stored: boolean;
  value: unknown;
  errorCode: string | null;
  errorClass: string | null;
  errorDetail: string | null;
  storedAt: Date | null;
}

/** A refusal of the SQL API: ``code`` is its SQLSTATE (LQ000-LQ003), the message one line. */
export class LeaseqError extends Error {
  readonly code: string;
  constructor(message: string, code: string) {
    super(message);
    this.name = "LeaseqError";
    this.code = code;
  }
}
/** A bad option (SQLSTATE LQ001), as Python's ConfigError. */
export class ConfigError extends LeaseqError {
  constructor(message: string) {
    super(message, "LQ001");
    this.name = "ConfigError";
  }
}
/** A payload over the limit or nested too deep (LQ002), as Python's PayloadError. */
export class PayloadError extends LeaseqError {
  constructor(message: string) {
    super(message, "LQ002");
    this.name = "PayloadError";
  }
}
/** onConflict "raise" found the unique key held (LQ003), as Python's UniqueConflict. */
export class UniqueConflict extends LeaseqError {
  constructor(message: string) {
    super(message, "LQ003");
    this.name = "UniqueConflict";
  }
}

const SCHEMA_RE = /^[a-z_][a-z0-9_]{0,62}$/;

function snake(name: string): string {
  return name.replace(/[A-Z]/g, (c) => "_" + c.toLowerCase());
}

/** A job as the SQL API's enqueue_many takes it: leaseq's option names, dates as ISO text. */
export function jobJson(job: JobSpec): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const [name, value] of Object.entries(job)) {
    if (value === undefined) continue;
    out[snake(name)] = value instanceof Date ? value.toISOString() : value;
  }
  return out;
}

function translate(err: unknown): unknown {
  const e = err as { code?: string; message?: string };
  if (typeof e?.code === "string" && e.code.startsWith("LQ")) {
    const message = String(e.message ?? "").split("\n")[0];
    if (e.code === "LQ001") return new ConfigError(message);
    if (e.code === "LQ002") return new PayloadError(message);
    if (e.code === "LQ003") return new UniqueConflict(message);
    return new LeaseqError(message, e.code);
  }
  return err;
}

export interface LeaseqOptions {
  /** The schema leaseq was migrated into (default "leaseq"). */
  schema?: string;
}

/**
 * leaseq over one pg Pool (or Client). Each method takes an optional ``db``: a PoolClient
 * inside your own transaction, so the job exists (and workers are woken) only if it
 * commits.
 */
export class Leaseq {
  readonly schema: string;
  private readonly db: Queryable;

  constructor(db: Queryable, options: LeaseqOptions = {}) {
    const schema = options.schema ?? "leaseq";
    if (!SCHEMA_RE.test(schema)) {
      throw new ConfigError(
        `invalid schema name ${JSON.stringify(schema)}: use lower-case letters, digits and _`,
      );
    }
    this.schema = schema;
    this.db = db;
  }

  private async run(db: Queryable | undefined, text: string, values: unknown[]): Promise<any[]> {
    try {
      return (await (db ?? this.db).query(text, values)).rows;
    } catch (err) {
      throw translate(err);
    }
  }

  /** Store one job; its id (the holder's when its unique key is held and onConflict skips). */
  async enqueue(
    task: string,
    payload: unknown = null,
    options: EnqueueOptions = {},
    db?: Queryable,
  ): Promise<number> {
    const [id] = await this.enqueueMany([{ ...options, task, payload }], db);
    return id;
  }

  /** Store many jobs, all checked before any is stored; their ids in input order. */
  async enqueueMany(jobs: JobSpec[], db?: Queryable): Promise<number[]> {
    const rows = await this.run(db, `SELECT "${this.schema}".enqueue_many($1::jsonb) AS ids`, [
      JSON.stringify(jobs.map(jobJson)),
    ]);
    return (rows[0].ids as Array<string | number>).map(Number);
  }

  /** pending, running, succeeded, dead, cancelled; null when there is no such job. */
  async state(jobId: number, db?: Queryable): Promise<string | null> {
    const rows = await this.run(db, `SELECT "${this.schema}".job_state($1) AS state`, [jobId]);
    return rows[0].state ?? null;
  }

  /** The job's outcome and stored result; null when neither the job nor its result exists. */
  async result(jobId: number, db?: Queryable): Promise<JobResult | null> {
    const rows = await this.run(db, `SELECT * FROM "${this.schema}".job_result($1)`, [jobId]);
    if (rows.length === 0) return null;
    const r = rows[0];
    return {
      status: r.status,
      stored: r.has_value,
      value: r.value,
      errorCode: r.error_code,
      errorClass: r.error_class,
      errorDetail: r.error_detail,
      storedAt: r.stored_at,
    };
  }

  /** Cancel a pending job, or ask a running one to stop; false when it already ended. */
  async cancel(
    jobId: number,
    options: { actor?: string; reason?: string } = {},
    db?: Queryable,
  ): Promise<boolean> {
    const rows = await this.run(db, `SELECT "${this.schema}".cancel($1, $2, $3) AS changed`, [
      jobId,
      options.actor ?? null,
      options.reason ?? null,
    ]);
    return rows[0].changed === true;
  }
}
