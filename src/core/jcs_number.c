/*-------------------------------------------------------------------------
 *
 * jcs_number.c
 *	  A double in RFC 8785's text (ECMAScript's Number::toString).  The
 *	  shortest digits that round-trip, in plain or exponent notation.  Part
 *	  of the module jcs (jcs.c prints the rest of the canonical text).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <math.h>
#include <stdlib.h>

#include "common/shortest_dec.h"
#include "lib/stringinfo.h"
#include "utils/builtins.h"
#include "utils/fmgrprotos.h"

#include "jcs.h"

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
			point--;			/* a leading zero shifts the point only */
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
 * Number::toString picks them.  The fewest digits k whose value
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
	 * So try one digit fewer, until nothing shorter reads back as d.  The
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
 * (RFC 8785 3.2.2.3).  The shortest digits that round-trip, in plain
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
		/* an exact integer, whose decimal digits are the answer */
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
 * A numeric's stored form, as src/backend/utils/adt/numeric.c lays it out
 * (an on-disk format: pg_upgrade carries it between majors unchanged).  An
 * integer of up to 16 decimal digits is a "short" numeric.  A 16-bit header
 * (sign, display scale, weight in base-10000 digits) and its base-10000
 * digits, trailing zero digits dropped.
 */
#define JCS_NUMERIC_SHORT			0x8000
#define JCS_NUMERIC_FORM_MASK		0xC000
#define JCS_SHORT_SIGN				0x2000
#define JCS_SHORT_DSCALE_MASK		0x1F80
#define JCS_SHORT_WEIGHT_SIGN		0x0040
#define JCS_SHORT_WEIGHT_MASK		0x003F
#define JCS_MAX_EXACT				INT64CONST(9007199254740992)	/* 2^53 */

/*
 * Is num an integer below 2^53 in magnitude, in numeric's short form (so
 * exact as a double, which ECMAScript prints as its digits)?  Then *value
 * is it, and *plain whether it is written without a fraction (display
 * scale 0: 1 rather than 1.0).  False for any other numeric.
 */
bool
idem_jcs_small_integer(Numeric num, int64 *value, bool *plain)
{
	const char *data = VARDATA_ANY(num);	/* read with memcpy, since it may be unaligned */
	int			ndigits = (VARSIZE_ANY_EXHDR(num) - sizeof(uint16)) / sizeof(int16);
	uint16		header;
	int16		digit;
	int			weight;
	int64		v = 0;

	memcpy(&header, data, sizeof(header));
	if ((header & JCS_NUMERIC_FORM_MASK) != JCS_NUMERIC_SHORT ||
		(header & JCS_SHORT_WEIGHT_SIGN) != 0)
		return false;
	weight = header & JCS_SHORT_WEIGHT_MASK;
	if (weight > 3 || ndigits > weight + 1)
		return false;
	for (int i = 0; i <= weight; i++)
	{
		digit = 0;
		if (i < ndigits)
			memcpy(&digit, data + sizeof(uint16) + i * sizeof(int16), sizeof(digit));
		v = v * 10000 + digit;
	}
	if (v >= JCS_MAX_EXACT)
		return false;
	*value = (header & JCS_SHORT_SIGN) != 0 ? -v : v;
	*plain = (header & JCS_SHORT_DSCALE_MASK) == 0;
	return true;
}

/*
 * Write num, a small integer (idem_jcs_small_integer), without its
 * fraction: its display scale cleared in place.  The numeric's length is
 * unchanged, and its bytes are then those of the plainly written integer.
 */
void
idem_jcs_clear_scale(Numeric num)
{
	char	   *data = VARDATA_ANY(num);
	uint16		header;

	memcpy(&header, data, sizeof(header));
	header &= ~JCS_SHORT_DSCALE_MASK;
	memcpy(data, &header, sizeof(header));
}

/*
 * num as an IEEE double, correctly rounded (strtod of its text); outside
 * the double range 22003, as RFC 8785 has no text for it.
 */
double
idem_jcs_numeric_double(Numeric num)
{
	char	   *text = DatumGetCString(DirectFunctionCall1(numeric_out, NumericGetDatum(num)));
	double		d = strtod(text, NULL);

	if (isinf(d) || isnan(d))
		ereport(ERROR,
				(errcode(ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE),
				 errmsg("JSON number is out of range for canonical JSON"),
				 errdetail("RFC 8785 numbers must fit an IEEE 754 double; the number has %zu characters.",
						   strlen(text)),
				 errhint("Send numbers outside the double range as JSON strings.")));
	pfree(text);
	return d;
}
