// Differential fuzzing of idem's RFC 8785 canonical JSON and request hash
// against an independent implementation (npm's canonicalize) and node's
// SHA-256.  Writes COUNT random documents, each as JSON text spelled the
// non-canonical ways a client may spell it, with the expected canonical
// text and hash, as CSV for COPY:
//
//   node jcs_fuzz.mjs generate COUNT SEED > docs.csv
//   node jcs_fuzz.mjs compare docs.csv results.csv   (results: i, canonical, hash)
//   node jcs_fuzz.mjs pairs COUNT SEED > pairs.csv
//   node jcs_fuzz.mjs compare-pairs pairs.csv results.csv   (results: i, fingerprint, fast)
//
// The generator covers deep nesting, object keys whose UTF-16 and code-point
// orders differ (BMP characters above U+E000 against astral ones), every
// escape class, numbers at the double boundaries and random bit patterns,
// and number spellings with exponents, trailing and leading zeros.
import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import canonicalize from 'canonicalize';

// mulberry32: a small seeded PRNG, so a failing seed reproduces.
function prng(seed) {
	let a = seed >>> 0;
	return () => {
		a = (a + 0x6d2b79f5) >>> 0;
		let t = a;
		t = Math.imul(t ^ (t >>> 15), t | 1);
		t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
		return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
	};
}

function generator(seed) {
	const rnd = prng(seed);
	const int = (n) => Math.floor(rnd() * n);
	const pick = (xs) => xs[int(xs.length)];

	// Characters of every class that matters for escaping and sorting.
	const charClasses = [
		() => String.fromCharCode(0x61 + int(26)),			// a-z
		() => String.fromCharCode(0x41 + int(26)),			// A-Z
		() => String.fromCharCode(0x30 + int(10)),			// digits
		() => pick(['"', '\\', '/', '\b', '\f', '\n', '\r', '\t']),
		() => String.fromCharCode(1 + int(31)),				// other controls (not NUL: jsonb refuses \u0000)
		() => String.fromCharCode(0x7f + int(0x80)),		// DEL, C1, Latin-1
		() => String.fromCharCode(0x100 + int(0xd700)),		// BMP below the surrogates
		() => String.fromCharCode(0xe000 + int(0x2000)),	// BMP above them: sorts after astral in UTF-16
		() => String.fromCharCode(0xfb00 + int(0x4ff)),		// more of the high BMP, to U+FFFE
		() => String.fromCodePoint(0x10000 + int(0x100000)),	// astral (a surrogate pair)
		() => pick(['\u20ac', '\u00e9', '\ud83d\ude00', '\ufb33', '\ufffd', '\u2028', '\u2029']),
	];
	const randString = (max) => {
		let s = '';
		const n = int(max + 1);
		for (let i = 0; i < n; i++) s += pick(charClasses)();
		return s;
	};

	// Doubles: boundaries, integers near 2^53, powers of ten, random bit patterns.
	const specials = [0, -0, 1, -1, 0.1, 5e-324, -5e-324, 2.2250738585072014e-308,
		2.225073858507201e-308, 1.7976931348623157e308, -1.7976931348623157e308,
		9007199254740991, -9007199254740991, 9007199254740992, 9007199254740993,
		1e21, 1e20, 1e-6, 1e-7, 123456789012345680000, 0.000001, 4.35, 0.1 + 0.2,
		333333333.3333332, 1e23, 295147905179352830000, 1.5e300, 9.999999999999999e22];
	const view = new DataView(new ArrayBuffer(8));
	const randDouble = () => {
		switch (int(5)) {
			case 0: return pick(specials);
			case 1: return int(1e6) - 5e5;
			case 2: return (rnd() - 0.5) * Math.pow(10, int(40) - 20);
			case 3: return Number.MAX_SAFE_INTEGER - int(1000);
			default:
				for (;;) {
					view.setUint32(0, Math.floor(rnd() * 4294967296));
					view.setUint32(4, Math.floor(rnd() * 4294967296));
					const d = view.getFloat64(0);
					if (Number.isFinite(d)) return d;
				}
		}
	};

	// The same double, spelled another way: the exact decimal value of its
	// shortest form, with the point moved, zeros added, E or e, +/-.
	const spellNumber = (d) => {
		if (Object.is(d, -0)) return pick(['-0', '-0.0', '-0e5', '0']);
		const shortest = JSON.stringify(d);
		if (int(4) === 0) return shortest;
		const [mant, expPart] = Math.abs(d).toExponential().split('e');
		const digits = mant.replace('.', '');
		let exp = parseInt(expPart, 10) - (digits.length - 1);	// value = digits * 10^exp
		let body = digits + '0'.repeat(int(3));
		exp -= body.length - digits.length;
		// put the point p digits from the right
		const p = int(body.length + 3);
		let intPart, frac;
		if (p >= body.length) {
			intPart = '0';
			frac = '0'.repeat(p - body.length) + body;
		} else {
			intPart = body.slice(0, body.length - p);
			frac = body.slice(body.length - p);
		}
		exp += p;
		let s = (d < 0 ? '-' : '') + intPart.replace(/^0+(?=\d)/, '') + (frac ? '.' + frac : '');
		if (exp !== 0 || int(3) === 0) {
			const e = pick(['e', 'E']);
			const sign = exp < 0 ? '-' : pick(['', '+']);
			s += e + sign + '0'.repeat(int(2)) + Math.abs(exp);
		}
		return s;
	};

	// A string as JSON text: escapes where needed, \u escapes by choice.
	const spellString = (s) => {
		let out = '"';
		for (const ch of s) {
			const cp = ch.codePointAt(0);
			if (ch === '"' || ch === '\\') out += '\\' + ch;
			else if (cp < 0x20 || int(10) === 0) {
				const units = cp > 0xffff ? [ch.charCodeAt(0), ch.charCodeAt(1)] : [cp];
				for (const u of units)
					out += '\\u' + (int(2) ? u.toString(16) : u.toString(16).toUpperCase()).padStart(4, '0');
			} else out += ch;
		}
		return out + '"';
	};

	const ws = () => pick(['', '', '', ' ', '\n', '\t', '  ', '\r\n']);

	const randValue = (depth) => {
		const kinds = depth > 0 ? 7 : 4;
		switch (int(kinds)) {
			case 0: return { t: spellNumber(randDouble()) };
			case 1: return { t: spellString(randString(12)) };
			case 2: return { t: pick(['true', 'false', 'null']) };
			case 3: return { t: spellNumber(randDouble()) };
			case 4: case 5: {
				const n = int(6);
				const members = [];
				for (let i = 0; i < n; i++)
					members.push(ws() + spellString(randString(6)) + ws() + ':' + ws() + randValue(depth - 1).t + ws());
				return { t: '{' + members.join(',') + '}' };
			}
			default: {
				const n = int(6);
				const elems = [];
				for (let i = 0; i < n; i++) elems.push(ws() + randValue(depth - 1).t + ws());
				return { t: '[' + elems.join(',') + ']' };
			}
		}
	};

	// Mostly shallow documents, some nested 20 deep.
	const next = () => {
		const depth = int(10) === 0 ? 20 : 1 + int(5);
		let v = randValue(depth);
		if (depth === 20) for (let i = 0; i < 15; i++) v = { t: '{"n' + i + '":' + v.t + '}' };
		return ws() + v.t + ws();
	};

	// The double next to d, up (dir 1) or down (-1), by its bit pattern.
	const neighbour = (d, dir) => {
		if (d === 0) return dir * 5e-324;
		view.setFloat64(0, d);
		const hi = view.getUint32(0), lo = view.getUint32(4);
		const away = (d > 0) === (dir > 0);
		let l = away ? lo + 1 : lo - 1, h = hi;
		if (l > 0xffffffff) { l = 0; h++; }
		if (l < 0) { l = 0xffffffff; h--; }
		view.setUint32(0, h);
		view.setUint32(4, l);
		return view.getFloat64(0);
	};
	const digitsOf = (n) => {
		let s = String(1 + int(9));
		for (let i = 1; i < n; i++) s += String(int(10));
		return s;
	};
	// One pair of number spellings: [a, b], read by a conforming parser as
	// the same double or not (a spelling outside the double range: no double).
	const numberPair = () => {
		const kind = int(32);
		switch (kind < 12 ? 0 : kind < 18 ? 3 : kind < 23 ? 4 : kind < 26 ? 5 : kind < 31 ? 6 : 7) {
			case 0: {					// one double, two spellings
				const d = randDouble();
				return [spellNumber(d), spellNumber(d)];
			}
			case 3: {					// neighbours: one ulp apart
				const d = randDouble();
				const e = neighbour(d, int(2) ? 1 : -1);
				return Number.isFinite(e) ? [spellNumber(d), spellNumber(e)] : [spellNumber(d), spellNumber(d)];
			}
			case 4: {					// integers beyond 2^53, rounded or not
				const a = (int(2) ? '-' : '') + digitsOf(16 + int(6));
				const exact = BigInt(Number(a)).toString();
				const b = pick([exact, a, (BigInt(a) + 1n).toString(), (BigInt(exact) + 1n).toString(),
					exact + '.0', a.replace(/(\d)(\d*)$/, '$1.$2e' + (a.length - (a[0] === '-' ? 2 : 1)))]);
				return int(2) ? [a, b] : [b, a];
			}
			case 5: {					// the zeros
				const zeros = ['0', '-0', '0.0', '-0.0', '0e5', '-0E-3', '0.000', '-0e0'];
				return [pick(zeros), pick(zeros)];
			}
			case 6: {					// subnormals and their neighbours
				view.setUint32(0, int(0x100000) | (int(2) ? 0x80000000 : 0));
				view.setUint32(4, Math.floor(rnd() * 4294967296));
				const d = view.getFloat64(0);
				return [spellNumber(d), spellNumber(int(2) ? d : neighbour(d, int(2) ? 1 : -1))];
			}
			default: {					// outside the double range
				const out = pick(['1e400', '-1e309', '1.8e308', '2e308', '1' + '0'.repeat(400)]);
				return int(2) ? [out, spellNumber(randDouble())] : [out, out];
			}
		}
	};
	// A pair of documents, the same but for their numbers: both an array or
	// both an object of one to four number pairs.
	const pair = () => {
		const n = 1 + int(4);
		const as = [], bs = [];
		for (let i = 0; i < n; i++) {
			const [a, b] = numberPair();
			as.push(a);
			bs.push(b);
		}
		if (int(2)) return ['[' + as.join(',') + ']', '[' + bs.join(', ') + ']', as, bs];
		const obj = (xs) => '{' + xs.map((x, i) => '"n' + i + '":' + x).join(',') + '}';
		return [obj(as), obj(bs), as, bs];
	};
	return { next, pair };
}

const csv = (s) => '"' + s.replace(/"/g, '""') + '"';

// COUNT CSV lines, row(i) each, written to stdout 10,000 at a time.
function writeRows(count, row) {
	const out = [];
	for (let i = 0; i < count; i++) {
		out.push(row(i).join(','));
		if (out.length === 10000) {
			process.stdout.write(out.join('\n') + '\n');
			out.length = 0;
		}
	}
	if (out.length) process.stdout.write(out.join('\n') + '\n');
}

function generate(count, seed) {
	const { next } = generator(seed);
	writeRows(count, (i) => {
		const text = next();
		const canonical = canonicalize(JSON.parse(text));
		const hash = createHash('sha256').update(canonical, 'utf8').digest('hex');
		return [i, csv(text), csv(canonical), hash];
	});
}

// Minimal CSV reader for the files written above and by COPY ... CSV.
function readCsv(path) {
	const src = readFileSync(path, 'utf8');
	const rows = [];
	let row = [], field = '', quoted = false;
	for (let i = 0; i < src.length; i++) {
		const c = src[i];
		if (quoted) {
			if (c === '"') {
				if (src[i + 1] === '"') { field += '"'; i++; } else quoted = false;
			} else field += c;
		} else if (c === '"') quoted = true;
		else if (c === ',') { row.push(field); field = ''; }
		else if (c === '\r' && src[i + 1] === '\n') continue;
		else if (c === '\n') { row.push(field); rows.push(row); row = []; field = ''; }
		else field += c;
	}
	if (field !== '' || row.length) { row.push(field); rows.push(row); }
	return rows;
}

function compare(docsPath, resultsPath, seed) {
	const docs = readCsv(docsPath);
	const results = new Map(readCsv(resultsPath).map((r) => [r[0], r]));
	let mismatches = 0, errors = 0;
	for (const [i, text, canonical, hash] of docs) {
		const r = results.get(i);
		if (!r || r[1].startsWith('ERROR')) {
			errors++;
			if (errors <= 5) console.error(`# doc ${i} (seed ${seed}): ${r ? r[1] : 'no result'}\n#   ${JSON.stringify(text).slice(0, 300)}`);
		} else if (r[1] !== canonical || r[2] !== hash) {
			mismatches++;
			if (mismatches <= 5)
				console.error(`# doc ${i} (seed ${seed}) differs\n#   input ${JSON.stringify(text).slice(0, 300)}\n#   idem  ${JSON.stringify(r[1]).slice(0, 300)}\n#   ref   ${JSON.stringify(canonical).slice(0, 300)}`);
		}
	}
	console.log(`${docs.length} ${mismatches} ${errors}`);
}

// Pairs of requests that differ only in how their numbers are spelled,
// with what a conforming parser makes of them: "equal" (every number the
// same double; -0 is 0), "differ", or "error" (a number outside the
// double range, which RFC 8785 cannot write).
function generatePairs(count, seed) {
	const { pair } = generator(seed);
	writeRows(count, (i) => {
		const [a, b, as, bs] = pair();
		const x = as.map(Number), y = bs.map(Number);
		const expected = [...x, ...y].some((d) => !Number.isFinite(d)) ? 'error'
			: x.every((d, k) => d === y[k]) ? 'equal' : 'differ';
		return [i, csv(a), csv(b), expected];
	});
}

// The property of request digests: two requests have the same digest
// input exactly when they have the same fingerprint, and that is what a
// conforming parser says.  results: i, fingerprint, fast (each "equal",
// "differ" or "error").  Prints: pairs, equal pairs, violations.
function comparePairs(pairsPath, resultsPath, seed) {
	const pairs = readCsv(pairsPath);
	const results = new Map(readCsv(resultsPath).map((r) => [r[0], r]));
	let equal = 0, bad = 0;
	for (const [i, a, b, expected] of pairs) {
		const r = results.get(i);
		const fp = r ? r[1] : 'missing', fast = r ? r[2] : 'missing';
		const ok = fp === expected && (fp === 'error' ? fast !== 'equal' : fast === fp);
		if (expected === 'equal') equal++;
		if (!ok) {
			bad++;
			if (bad <= 5) console.error(`# pair ${i} (seed ${seed}): expected ${expected}, fingerprint ${fp}, digest input ${fast}\n#   ${a}\n#   ${b}`);
		}
	}
	console.log(`${pairs.length} ${equal} ${bad}`);
}

const [cmd, a, b, c] = process.argv.slice(2);
if (cmd === 'generate') generate(parseInt(a, 10), parseInt(b, 10));
else if (cmd === 'compare') compare(a, b, c);
else if (cmd === 'pairs') generatePairs(parseInt(a, 10), parseInt(b, 10));
else if (cmd === 'compare-pairs') comparePairs(a, b, c);
else {
	console.error('usage: jcs_fuzz.mjs generate COUNT SEED | compare DOCS RESULTS [SEED] | pairs COUNT SEED | compare-pairs PAIRS RESULTS [SEED]');
	process.exit(2);
}
