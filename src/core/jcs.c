/*-------------------------------------------------------------------------
 *
 * jcs.c
 *	  RFC 8785 JSON Canonicalization Scheme (JCS) over jsonb.  The text
 *	  that request fingerprints (fingerprint.c) are computed from.
 *
 * A fingerprint must not change with field order, whitespace or number
 * spelling, so the raw JSON text is never hashed.  JCS fixes one text per
 * value.  Object members sorted by the UTF-16 code units of their names,
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

#include "fmgr.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"
#include "utils/numeric.h"

#include "jcs.h"

/*
 * One object member.  Its name in UTF-8 (for sorting and printing) and where
 * its value lies in the container.
 */
typedef struct JcsMember
{
	const char *name;			/* key in UTF-8 */
	int			namelen;
	JEntry		entry;			/* the value's JEntry */
	uint32		offset;			/* the value's data offset */
	uint32		len;			/* the value's data length */
} JcsMember;

/* Objects with at most this many members sort on the stack. */
#define JCS_STACK_MEMBERS	16

static void jcs_append_container(StringInfo out, const JsonbContainer *jc);

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
 * qsort comparator.  Member names in UTF-16 code unit order (RFC 8785
 * 3.2.3), on their UTF-8 bytes.  UTF-8 byte order is code point order, and
 * UTF-16 code unit order is code point order except that U+E000..U+FFFF
 * (one unit each) sort after the supplementary planes (whose surrogate
 * pairs start at 0xD800).  So the first differing byte decides, unless it
 * is a character's first byte with one side in U+E000..U+FFFF (lead byte
 * 0xEE or 0xEF) and the other supplementary (lead byte 0xF0 to 0xF4).  Then
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

/*
 * The escape each byte needs in a JSON string (RFC 8785 3.2.2.2, as
 * ECMAScript's JSON.stringify writes it): 0 for none, 'u' for \u00XX, else
 * the letter after the backslash.
 */
static const char jcs_escape[256] = {
	'u', 'u', 'u', 'u', 'u', 'u', 'u', 'u', 'b', 't', 'n', 'u', 'f', 'r', 'u', 'u',
	'u', 'u', 'u', 'u', 'u', 'u', 'u', 'u', 'u', 'u', 'u', 'u', 'u', 'u', 'u', 'u',
	0, 0, '"', 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
	0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
	0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
	0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, '\\', 0, 0, 0,
};

/*
 * Append a UTF-8 JSON string with that escaping: when no byte needs one
 * (most strings), one copy; else the runs between escapes copied whole.
 */
static void
jcs_append_utf8_string(StringInfo out, const char *s, int len)
{
	const char *run;
	const char *p;
	const char *end = s + len;

	for (p = s; p < end; p++)
		if (jcs_escape[(unsigned char) *p] != 0)
			break;
	enlargeStringInfo(out, len + 2);
	out->data[out->len++] = '"';
	if (p == end)
	{
		memcpy(out->data + out->len, s, len);
		out->len += len;
		out->data[out->len++] = '"';
		out->data[out->len] = '\0';
		return;
	}
	for (run = s; p < end; p++)
	{
		char		e = jcs_escape[(unsigned char) *p];

		if (e == 0)
			continue;
		appendBinaryStringInfo(out, run, p - run);
		if (e == 'u')
			appendStringInfo(out, "\\u%04x", (unsigned char) *p);
		else
		{
			appendStringInfoCharMacro(out, '\\');
			appendStringInfoCharMacro(out, e);
		}
		run = p + 1;
	}
	appendBinaryStringInfo(out, run, end - run);
	appendStringInfoCharMacro(out, '"');
}

/* Append a JSON string of the server encoding (converted to UTF-8 first). */
static void
jcs_append_string(StringInfo out, const char *s, int len)
{
	int			ulen;

	s = jcs_utf8(s, len, &ulen);
	jcs_append_utf8_string(out, s, ulen);
}

/*
 * Append a jsonb number.  First read as an IEEE double, as a JSON parser
 * conforming to RFC 8785 does (so 1, 1.0 and 1e0 are one number, and digits
 * past double precision are rounded away), then printed canonically.  An
 * integer below 2^53 is printed from its digits.
 */
static void
jcs_append_numeric(StringInfo out, Numeric num)
{
	int64		value;
	bool		plain;
	char		buf[MAXINT8LEN + 1];

	if (idem_jcs_small_integer(num, &value, &plain))
		appendBinaryStringInfo(out, buf, pg_lltoa(value, buf));
	else
		idem_jcs_append_number(out, idem_jcs_numeric_double(num));
}

/*
 * Append one value of a container.  Its JEntry, and its data at offset
 * (length len) from the container's data.  The layout is jsonb.h's (as
 * fillJsonbValue reads it).  Numbers and nested containers start at the next
 * 4-byte boundary.  Walking the containers directly, rather than through
 * JsonbIteratorNext, saves most of the canonical text's cost.
 */
static void
jcs_append_value(StringInfo out, JEntry entry, const char *data, uint32 offset, uint32 len)
{
	if (JBE_ISSTRING(entry))
		jcs_append_string(out, data + offset, len);
	else if (JBE_ISNUMERIC(entry))
		jcs_append_numeric(out, (Numeric) (data + INTALIGN(offset)));
	else if (JBE_ISBOOL_TRUE(entry))
		appendBinaryStringInfo(out, "true", 4);
	else if (JBE_ISBOOL_FALSE(entry))
		appendBinaryStringInfo(out, "false", 5);
	else if (JBE_ISNULL(entry))
		appendBinaryStringInfo(out, "null", 4);
	else if (JBE_ISCONTAINER(entry))
		jcs_append_container(out, (const JsonbContainer *) (data + INTALIGN(offset)));
	else
		elog(ERROR, "unexpected jsonb entry type: %u", entry & JENTRY_TYPEMASK);
}

/* Append an array's elements, or a raw scalar (an array of one, unbracketed). */
static void
jcs_append_array(StringInfo out, const JsonbContainer *jc)
{
	uint32		count = JsonContainerSize(jc);
	const char *data = (const char *) &jc->children[count];
	bool		raw_scalar = JsonContainerIsScalar(jc);
	uint32		offset = 0;

	if (!raw_scalar)
		appendStringInfoCharMacro(out, '[');
	for (uint32 i = 0; i < count; i++)
	{
		uint32		start = offset;

		JBE_ADVANCE_OFFSET(offset, jc->children[i]);
		if (i > 0)
			appendStringInfoCharMacro(out, ',');
		jcs_append_value(out, jc->children[i], data, start, offset - start);
	}
	if (!raw_scalar)
		appendStringInfoCharMacro(out, ']');
}

/*
 * Append an object.  Its members in JCS order.  jsonb keeps the keys (the
 * first count entries, sorted by length, then bytes) before the values (the
 * next count, in the keys' order); each level sorts only its own members.
 */
static void
jcs_append_object(StringInfo out, const JsonbContainer *jc)
{
	uint32		count = JsonContainerSize(jc);
	const char *data = (const char *) &jc->children[count * 2];
	JcsMember	stack_members[JCS_STACK_MEMBERS];
	JcsMember  *stack_order[JCS_STACK_MEMBERS];
	JcsMember  *members = stack_members;
	JcsMember **order = stack_order;
	uint32		offset = 0;

	if (count > JCS_STACK_MEMBERS)
	{
		members = palloc(sizeof(JcsMember) * count);
		order = palloc(sizeof(JcsMember *) * count);
	}
	for (uint32 i = 0; i < count; i++)
	{
		uint32		start = offset;

		JBE_ADVANCE_OFFSET(offset, jc->children[i]);
		members[i].name = jcs_utf8(data + start, offset - start, &members[i].namelen);
		order[i] = &members[i];
	}
	for (uint32 i = 0; i < count; i++)
	{
		members[i].offset = offset;
		members[i].entry = jc->children[count + i];
		JBE_ADVANCE_OFFSET(offset, members[i].entry);
		members[i].len = offset - members[i].offset;
	}
	jcs_sort_members(order, count);

	appendStringInfoCharMacro(out, '{');
	for (uint32 i = 0; i < count; i++)
	{
		if (i > 0)
			appendStringInfoCharMacro(out, ',');
		jcs_append_utf8_string(out, order[i]->name, order[i]->namelen);
		appendStringInfoCharMacro(out, ':');
		jcs_append_value(out, order[i]->entry, data, order[i]->offset, order[i]->len);
	}
	appendStringInfoCharMacro(out, '}');
	if (members != stack_members)
	{
		pfree(order);
		pfree(members);
	}
}

/* Append an object, an array or a raw scalar. */
static void
jcs_append_container(StringInfo out, const JsonbContainer *jc)
{
	check_stack_depth();
	if (JsonContainerIsObject(jc))
		jcs_append_object(out, jc);
	else if (JsonContainerIsArray(jc))
		jcs_append_array(out, jc);
	else
		elog(ERROR, "unexpected jsonb container header: %08x", jc->header);
}

/* Append the RFC 8785 canonical text of a jsonb value. */
void
idem_jcs_append_jsonb(StringInfo out, Jsonb *jb)
{
	jcs_append_container(out, &jb->root);
}
