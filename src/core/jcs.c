/*-------------------------------------------------------------------------
 *
 * jcs.c
 *	  RFC 8785 JSON Canonicalization Scheme (JCS) over jsonb: the text
 *	  that request fingerprints (fingerprint.c) are computed from.
 *
 * A fingerprint must not change with field order, whitespace or number
 * spelling, so the raw JSON text is never hashed.  JCS fixes one text per
 * value: object members sorted by the UTF-16 code units of their names,
 * numbers as IEEE doubles printed the way ECMAScript prints them, strings
 * with the minimal JSON escaping, no whitespace.
 *
 * jsonb has already dropped whitespace and duplicate object keys (the last
 * one wins), but it sorts keys by length first and keeps numbers as numeric,
 * so both are redone here.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>

#include "common/shortest_dec.h"
#include "fmgr.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"
#include "utils/numeric.h"

#include "jcs.h"

/* One object member; its name is kept in UTF-8 too, for sorting. */
typedef struct JcsMember
{
	JsonbValue	key;
	const char *name;			/* key in UTF-8 */
	int			namelen;
	JsonbValue	value;
} JcsMember;

static void jcs_append_container(StringInfo out, JsonbContainer *container);

/*
 * Return a string of the server encoding in UTF-8: JCS and the digest are
 * defined over UTF-8 whatever the database encoding is.
 */
static const char *
jcs_utf8(const char *s, int len, int *outlen)
{
	char	   *conv;

	if (GetDatabaseEncoding() == PG_UTF8 || len == 0)
	{
		*outlen = len;
		return s;
	}
	conv = pg_server_to_any(s, len, PG_UTF8);
	*outlen = (conv == s) ? len : (int) strlen(conv);
	return conv;
}

/*
 * qsort comparator: member names in UTF-16 code unit order (RFC 8785
 * 3.2.3), on their UTF-8 bytes.  UTF-8 byte order is code point order, and
 * UTF-16 code unit order is code point order except that U+E000..U+FFFF
 * (one unit each) sort after the supplementary planes (whose surrogate
 * pairs start at 0xD800).  So the first differing byte decides, unless it
 * is a character's first byte with one side in U+E000..U+FFFF (lead byte
 * 0xEE or 0xEF) and the other supplementary (lead byte 0xF0 to 0xF4): then
 * the order is the reverse.  (Where the first difference is inside a
 * character, both characters have the same first byte, hence the same
 * range.)
 */
static int
jcs_member_cmp(const JcsMember *ma, const JcsMember *mb)
{
	const unsigned char *pa = (const unsigned char *) ma->name;
	const unsigned char *pb = (const unsigned char *) mb->name;
	int			n = Min(ma->namelen, mb->namelen);
	int			i = 0;
	unsigned char ca;
	unsigned char cb;

	while (i < n && pa[i] == pb[i])
		i++;
	if (i == n)
		return (ma->namelen > mb->namelen) - (ma->namelen < mb->namelen);
	ca = pa[i];
	cb = pb[i];
	if ((ca == 0xEE || ca == 0xEF) && cb >= 0xF0)
		return 1;
	if ((cb == 0xEE || cb == 0xEF) && ca >= 0xF0)
		return -1;
	return ca < cb ? -1 : 1;
}

/* qsort comparator of pointers to members */
static int
jcs_member_ptr_cmp(const void *a, const void *b)
{
	return jcs_member_cmp(*(JcsMember *const *) a, *(JcsMember *const *) b);
}

/*
 * Sort the pointers to n members: insertion sort for the few members most
 * objects have (pg_qsort swapped whole members, 100-odd bytes, byte by
 * byte: 1,200 instructions for 3 members), qsort of the pointers beyond.
 */
static void
jcs_sort_members(JcsMember **order, int n)
{
	if (n > 16)
	{
		qsort(order, n, sizeof(JcsMember *), jcs_member_ptr_cmp);
		return;
	}
	for (int i = 1; i < n; i++)
	{
		JcsMember  *m = order[i];
		int			j = i;

		while (j > 0 && jcs_member_cmp(order[j - 1], m) > 0)
		{
			order[j] = order[j - 1];
			j--;
		}
		order[j] = m;
	}
}

/* Append a JSON string with the escaping of RFC 8785 3.2.2.2 (ECMAScript's). */
static void
jcs_append_string(StringInfo out, const char *s, int len)
{
	const char *p;
	const char *end;
	int			ulen;

	s = jcs_utf8(s, len, &ulen);
	end = s + ulen;

	appendStringInfoCharMacro(out, '"');
	for (p = s; p < end; p++)
	{
		unsigned char c = (unsigned char) *p;

		switch (c)
		{
			case '"':
				appendStringInfoString(out, "\\\"");
				break;
			case '\\':
				appendStringInfoString(out, "\\\\");
				break;
			case '\b':
				appendStringInfoString(out, "\\b");
				break;
			case '\f':
				appendStringInfoString(out, "\\f");
				break;
			case '\n':
				appendStringInfoString(out, "\\n");
				break;
			case '\r':
				appendStringInfoString(out, "\\r");
				break;
			case '\t':
				appendStringInfoString(out, "\\t");
				break;
			default:
				if (c < 0x20)
					appendStringInfo(out, "\\u%04x", c);
				else
					appendStringInfoCharMacro(out, (char) c);
				break;
		}
	}
	appendStringInfoCharMacro(out, '"');
}

/*
 * Read a positive decimal such as "123.45", "0.001" or "1.20e+05" into its
 * significant digits (trailing zeros kept) and n, with value
 * 0.digits * 10^n.  Returns the number of digits.
 */
static int
parse_decimal(const char *s, char *digits, int *n)
{
	const char *p;
	int			k = 0;
	int			point = 0;		/* digits before the decimal point */
	bool		seen_point = false;

	for (p = s; *p && *p != 'e'; p++)
	{
		if (*p == '.')
		{
			seen_point = true;
			continue;
		}
		if (!seen_point)
			point++;
		if (k == 0 && *p == '0')
		{
			point--;			/* leading zero: shifts the point only */
			continue;
		}
		digits[k++] = *p;
	}
	*n = point + (*p == 'e' ? atoi(p + 1) : 0);
	return k;
}

/* Read back 0.digits * 10^n as a double, with strtod's correct rounding. */
static double
digits_value(const char *digits, int k, int n)
{
	char		buf[64];

	snprintf(buf, sizeof(buf), "0.%.*se%d", k, digits, n);
	return strtod(buf, NULL);
}

/* Drop trailing zeros (digits keeps at least one). */
static int
strip_zeros(const char *digits, int k)
{
	while (k > 1 && digits[k - 1] == '0')
		k--;
	return k;
}

/* Step a p-digit decimal one unit in its last place up (+1) or down (-1). */
static void
step_digits(char *digits, int p, int *n, int dir)
{
	int			i = p - 1;

	if (dir > 0)
	{
		while (i >= 0 && digits[i] == '9')
			digits[i--] = '0';
		if (i >= 0)
			digits[i]++;
		else
		{
			/* 999 + 1 = 1000: one more integer digit */
			digits[0] = '1';
			(*n)++;
		}
	}
	else
	{
		while (i >= 0 && digits[i] == '0')
			digits[i--] = '9';
		digits[i]--;
		if (digits[0] == '0')
		{
			/* 1000 - 1 at this precision: 9999 in the decade below */
			memset(digits, '9', p);
			(*n)--;
		}
	}
}

/*
 * Shortest decimal digits of a positive finite double, as ECMAScript's
 * Number::toString picks them: the fewest digits k whose value
 * 0.digits * 10^n reads back as d, the closest to d among those.
 */
static void
shortest_digits(double d, char *digits, int *k_out, int *n_out)
{
	char		buf[DOUBLE_SHORTEST_DECIMAL_LEN + 8];
	int			k;
	int			n;

	/*
	 * Ryu gives the shortest round-trip digits, but PostgreSQL's copy never
	 * accepts a candidate lying exactly on the rounding boundary, which
	 * ECMAScript does (1e23 is "1e+23", not "9.999999999999999e+22").
	 */
	double_to_shortest_decimal_buf(d, buf);
	k = strip_zeros(digits, parse_decimal(buf, digits, &n));

	/*
	 * So try one digit fewer, until nothing shorter reads back as d: the
	 * correctly rounded candidate first, then its neighbour on the other
	 * side of d (the interval below d is narrower at a power of two).
	 */
	while (k > 1)
	{
		char		cdigits[DOUBLE_SHORTEST_DECIMAL_LEN];
		int			cp = k - 1;
		int			cn;
		double		back;

		snprintf(buf, sizeof(buf), "%.*e", cp - 1, d);
		(void) parse_decimal(buf, cdigits, &cn);

		back = digits_value(cdigits, cp, cn);
		if (back != d)
		{
			step_digits(cdigits, cp, &cn, back < d ? 1 : -1);
			if (digits_value(cdigits, cp, cn) != d)
				break;
		}
		memcpy(digits, cdigits, cp);
		k = strip_zeros(digits, cp);
		n = cn;
	}
	*k_out = k;
	*n_out = n;
}

/*
 * Append a finite double the way ECMAScript's Number::toString does
 * (RFC 8785 3.2.2.3): the shortest digits that round-trip, in plain
 * notation for 1e-7 < |d| < 1e21 and in exponent notation otherwise.
 */
void
idem_jcs_append_number(StringInfo out, double d)
{
	char		digits[DOUBLE_SHORTEST_DECIMAL_LEN];
	int			k;				/* number of significant digits */
	int			n;				/* value = 0.digits * 10^n */

	Assert(isfinite(d));
	if (d == 0)
	{
		/* both 0 and -0 */
		appendStringInfoChar(out, '0');
		return;
	}
	if (d < 0)
	{
		appendStringInfoChar(out, '-');
		d = -d;
	}
	if (d < 9007199254740992.0 && d == floor(d))
	{
		/* an exact integer: its decimal digits are the answer */
		appendStringInfo(out, INT64_FORMAT, (int64) d);
		return;
	}

	shortest_digits(d, digits, &k, &n);
	if (k <= n && n <= 21)
	{
		/* integer: digits then zeros */
		appendBinaryStringInfo(out, digits, k);
		for (int i = 0; i < n - k; i++)
			appendStringInfoChar(out, '0');
	}
	else if (0 < n && n <= 21)
	{
		/* point inside the digits */
		appendBinaryStringInfo(out, digits, n);
		appendStringInfoChar(out, '.');
		appendBinaryStringInfo(out, digits + n, k - n);
	}
	else if (-6 < n && n <= 0)
	{
		/* small fraction: 0.000ddd */
		appendStringInfoString(out, "0.");
		for (int i = 0; i < -n; i++)
			appendStringInfoChar(out, '0');
		appendBinaryStringInfo(out, digits, k);
	}
	else
	{
		/* exponent notation: d[.ddd]e+x or e-x */
		appendStringInfoChar(out, digits[0]);
		if (k > 1)
		{
			appendStringInfoChar(out, '.');
			appendBinaryStringInfo(out, digits + 1, k - 1);
		}
		appendStringInfo(out, "e%c%d", n - 1 >= 0 ? '+' : '-', abs(n - 1));
	}
}

/*
 * Append a jsonb number: first read as an IEEE double, as a JSON parser
 * conforming to RFC 8785 does (so 1, 1.0 and 1e0 are one number, and digits
 * past double precision are rounded away), then printed canonically.
 */
static void
jcs_append_numeric(StringInfo out, Numeric num)
{
	char	   *text = DatumGetCString(DirectFunctionCall1(numeric_out,
														   NumericGetDatum(num)));
	double		d;
	int			ndigits = 0;
	const char *p = text;

	/*
	 * An integer of at most 15 digits (below 2^53) is exact as a double and
	 * ECMAScript prints it as its digits: numeric_out's text already is the
	 * canonical form (it writes no leading zeros and no "-0").
	 */
	if (*p == '-')
		p++;
	while (*p >= '0' && *p <= '9')
	{
		p++;
		ndigits++;
	}
	if (*p == '\0' && ndigits > 0 && ndigits <= 15)
	{
		appendStringInfoString(out, text);
		pfree(text);
		return;
	}

	errno = 0;
	d = strtod(text, NULL);
	if (isinf(d) || isnan(d))
		ereport(ERROR,
				(errcode(ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE),
				 errmsg("JSON number is out of range for canonical JSON"),
				 errdetail("RFC 8785 numbers must fit an IEEE 754 double; the number has %zu characters.",
						   strlen(text)),
				 errhint("Send numbers outside the double range as JSON strings.")));
	pfree(text);
	idem_jcs_append_number(out, d);
}

/* Append any jsonb value (a scalar, or a nested container). */
static void
jcs_append_value(StringInfo out, JsonbValue *v)
{
	switch (v->type)
	{
		case jbvNull:
			appendStringInfoString(out, "null");
			break;
		case jbvBool:
			appendStringInfoString(out, v->val.boolean ? "true" : "false");
			break;
		case jbvString:
			jcs_append_string(out, v->val.string.val, v->val.string.len);
			break;
		case jbvNumeric:
			jcs_append_numeric(out, v->val.numeric);
			break;
		case jbvBinary:
			jcs_append_container(out, v->val.binary.data);
			break;
		default:
			elog(ERROR, "unexpected jsonb value type: %d", (int) v->type);
	}
}

/*
 * Append an object, an array or a raw scalar.  Nested containers come back
 * from the iterator as jbvBinary (skipNested), so each level sorts only its
 * own members.
 */
static void
jcs_append_container(StringInfo out, JsonbContainer *container)
{
	JsonbIterator *it = JsonbIteratorInit(container);
	JsonbValue	v;
	JsonbIteratorToken tok;

	check_stack_depth();

	tok = JsonbIteratorNext(&it, &v, true);
	if (tok == WJB_BEGIN_ARRAY)
	{
		bool		raw_scalar = v.val.array.rawScalar;
		bool		first = true;

		if (!raw_scalar)
			appendStringInfoChar(out, '[');
		while ((tok = JsonbIteratorNext(&it, &v, true)) == WJB_ELEM)
		{
			if (!first)
				appendStringInfoChar(out, ',');
			first = false;
			jcs_append_value(out, &v);
		}
		if (!raw_scalar)
			appendStringInfoChar(out, ']');
	}
	else if (tok == WJB_BEGIN_OBJECT)
	{
		int			nmembers = v.val.object.nPairs;
		JcsMember  *members = palloc(sizeof(JcsMember) * Max(nmembers, 1));
		JcsMember **order = palloc(sizeof(JcsMember *) * Max(nmembers, 1));
		int			i = 0;

		while ((tok = JsonbIteratorNext(&it, &v, true)) == WJB_KEY)
		{
			Assert(i < nmembers);
			members[i].key = v;
			members[i].name = jcs_utf8(v.val.string.val, v.val.string.len,
									   &members[i].namelen);
			tok = JsonbIteratorNext(&it, &members[i].value, true);
			Assert(tok == WJB_VALUE);
			order[i] = &members[i];
			i++;
		}
		nmembers = i;
		jcs_sort_members(order, nmembers);

		appendStringInfoChar(out, '{');
		for (i = 0; i < nmembers; i++)
		{
			if (i > 0)
				appendStringInfoChar(out, ',');
			jcs_append_value(out, &order[i]->key);
			appendStringInfoChar(out, ':');
			jcs_append_value(out, &order[i]->value);
		}
		appendStringInfoChar(out, '}');
		pfree(order);
		pfree(members);
	}
	else
		elog(ERROR, "unexpected jsonb iterator token: %d", (int) tok);
}

/* Append the RFC 8785 canonical text of a jsonb value. */
void
idem_jcs_append_jsonb(StringInfo out, Jsonb *jb)
{
	jcs_append_container(out, &jb->root);
}
