/*-------------------------------------------------------------------------
 *
 * jcs_normal.c
 *	  A request with each number in one spelling per RFC 8785 value, the
 *	  bytes a request digest is of.  Part of the module jcs.
 *
 * jsonb already drops whitespace, sorts object members and keeps the last
 * of duplicate names, so two requests with the same canonical text differ
 * in their jsonb bytes only by their numbers' spellings (1, 1.0, 1e0 are
 * three numerics).  Here each number becomes the numeric of its canonical
 * text (the shortest digits of its IEEE double): two numbers get one
 * spelling exactly when RFC 8785 reads them as one double.  So two requests
 * have the same normal bytes exactly when they have the same canonical
 * text.  A request whose numbers are all integers below 2^53 written
 * without a fraction (most) is normal already and returned as it is.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/fmgrprotos.h"

#include "jcs.h"

/* Is num already in its normal spelling (checked without converting it)? */
static bool
normal_as_stored(Numeric num)
{
	int64		value;
	bool		plain;

	return idem_jcs_small_integer(num, &value, &plain) && plain;
}

/* Are all the numbers of container jc in their normal spelling? */
static bool
container_normal(const JsonbContainer *jc)
{
	uint32		count = JsonContainerSize(jc);
	uint32		n = JsonContainerIsObject(jc) ? count * 2 : count;
	const char *data = (const char *) &jc->children[n];
	uint32		offset = 0;

	check_stack_depth();
	for (uint32 i = 0; i < n; i++)
	{
		JEntry		entry = jc->children[i];

		if (JBE_ISNUMERIC(entry) && !normal_as_stored((Numeric) (data + INTALIGN(offset))))
			return false;
		if (JBE_ISCONTAINER(entry) &&
			!container_normal((const JsonbContainer *) (data + INTALIGN(offset))))
			return false;
		JBE_ADVANCE_OFFSET(offset, entry);
	}
	return true;
}

/* The normal spelling of num: the numeric of its canonical text. */
static Numeric
normal_numeric(Numeric num)
{
	int64		value;
	bool		plain;
	StringInfoData text;
	Numeric		result;

	if (idem_jcs_small_integer(num, &value, &plain))
		return plain ? num : int64_to_numeric(value);
	initStringInfo(&text);
	idem_jcs_append_number(&text, idem_jcs_numeric_double(num));
	result = DatumGetNumeric(DirectFunctionCall3(numeric_in, CStringGetDatum(text.data),
												 ObjectIdGetDatum(InvalidOid),
												 Int32GetDatum(-1)));
	pfree(text.data);
	return result;
}

/*
 * jb with every number in its normal spelling: jb itself when they all are
 * already, else a new jsonb.  22003 for a number outside the double range,
 * as for the canonical text.
 */
Jsonb *
idem_jcs_normal_numbers(Jsonb *jb)
{
	JsonbIterator *it;
	JsonbParseState *state = NULL;
	JsonbValue	v;
	JsonbValue *result = NULL;
	JsonbIteratorToken token;

	if (container_normal(&jb->root))
		return jb;
	it = JsonbIteratorInit(&jb->root);
	while ((token = JsonbIteratorNext(&it, &v, false)) != WJB_DONE)
	{
		if ((token == WJB_VALUE || token == WJB_ELEM) && v.type == jbvNumeric)
			v.val.numeric = normal_numeric(v.val.numeric);
		/* a raw scalar's array keeps its flag */
		result = pushJsonbValue(&state, token,
								token == WJB_KEY || token == WJB_VALUE || token == WJB_ELEM ||
								(token == WJB_BEGIN_ARRAY && v.val.array.rawScalar) ? &v : NULL);
	}
	return JsonbValueToJsonb(result);
}
