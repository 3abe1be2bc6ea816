// bench/seed/seed.js: the design ratelimit grew from, as bench/connections' baseline for
// what a decision costs Redis: a Node service on ioredis deciding with the same script
// (token_bucket/take_one.lua, loaded by its SHA1) and the same arguments as rl_consume,
// 16 decisions in flight on one connection, over 100k subjects. Prints the decisions it
// made and the seconds it took, "decisions seconds"; every reply must be an allowed decision.
//
// node seed.js WHERE SHA KEY SECONDS INFLIGHT SUBJECTS ARG...
//   WHERE: a unix socket path, or host:port; KEY: the key with __rand_int__ where the
//   subject's number goes (as redis-benchmark -r takes it).
'use strict';
const Redis = require('ioredis');

const [where, sha, key, seconds, inflight, subjects, ...args] = process.argv.slice(2);
const redis = where.startsWith('/')
  ? new Redis({ path: where })
  : new Redis({ host: where.split(':')[0], port: Number(where.split(':')[1]) });
const end = Date.now() + Number(seconds) * 1000;
let decisions = 0;

async function loop() {
  while (Date.now() < end) {
    const subject = 1 + Math.floor(Math.random() * Number(subjects));
    const reply = await redis.evalsha(sha, 1, key.replace('__rand_int__', String(subject)), ...args);
    if (reply[0] !== 1) throw new Error(`not an allowed decision: ${JSON.stringify(reply)}`);
    decisions++;
  }
}

(async () => {
  const start = process.hrtime.bigint();
  await Promise.all(Array.from({ length: Number(inflight) }, loop));
  const elapsed = Number(process.hrtime.bigint() - start) / 1e9;
  console.log(`${decisions} ${elapsed.toFixed(3)}`);
  redis.disconnect();
})().catch((error) => {
  console.error(`bench/seed: ${error.message}`);
  process.exit(1);
});
