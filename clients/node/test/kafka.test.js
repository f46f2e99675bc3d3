// The Kafka partition of a key: the Java client's murmur2 (its own test
// vectors, Kafka's UtilsTest), no broker needed.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { murmur2, partitionFor } from 'idem-pg/kafka';

const JAVA = {
  21: -973932308,
  foobar: -790332482,
  'a-little-bit-long-string': -985981536,
  'a-little-bit-longer-string': -1486304829,
  lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8: -58897971,
  abc: 479470107,
};

test('murmur2 is the Java client\'s', () => {
  for (const [key, hash] of Object.entries(JAVA)) assert.equal(murmur2(key), hash, key);
});

test('a key\'s partition is its positive hash modulo the partitions', () => {
  assert.equal(partitionFor('foobar', 12), (-790332482 & 0x7fffffff) % 12);
  assert.equal(partitionFor(Buffer.from('foobar'), 12), partitionFor('foobar', 12));
});
