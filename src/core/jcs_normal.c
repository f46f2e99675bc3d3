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
 * without a fraction (most) is normal already and returned as it is; one
 * where such integers are written with a fraction (1.0) is copied with
 * their scales cleared, the layout unchanged; any other is rebuilt.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/fmgrprotos.h"

#include "jcs.h"

/* How far a request's numbers are from their normal spelling. */
typedef enum NumbersKind
{
	NUMBERS_NORMAL,				/* all normal */
	NUMBERS_SCALED,				/* else integers below 2^53 written with a
								 * fraction (1.0), normal with their scale
								 * cleared */
	NUMBERS_OTHER				/* else */
} NumbersKind;

static NumbersKind
numeric_kind(Numeric num)
{
	int64		value;
	bool		plain;

	if (!idem_jcs_small_integer(num, &value, &plain))
		return NUMBERS_OTHER;
	return plain ? NUMBERS_NORMAL : NUMBERS_SCALED;
}

/*
 * The kind of the numbers of container jc (the farthest of them), or, with
 * clear set, their scales cleared where that makes them normal (jc being
 * a copy of NUMBERS_SCALED kind).
 */
static NumbersKind
container_numbers(JsonbContainer *jc, bool clear)
{
	uint32		count = JsonContainerSize(jc);
	uint32		n = JsonContainerIsObject(jc) ? count * 2 : count;
	char	   *data = (char *) &jc->children[n];
	uint32		offset = 0;
	NumbersKind kind = NUMBERS_NORMAL;

	check_stack_depth();
	for (uint32 i = 0; i < n && kind != NUMBERS_OTHER; i++)
	{
		JEntry		entry = jc->children[i];
		NumbersKind k = NUMBERS_NORMAL;

		if (JBE_ISNUMERIC(entry))
		{
			k = numeric_kind((Numeric) (data + INTALIGN(offset)));
			if (clear && k == NUMBERS_SCALED)
				idem_jcs_clear_scale((Numeric) (data + INTALIGN(offset)));
		}
		else if (JBE_ISCONTAINER(entry))
			k = container_numbers((JsonbContainer *) (data + INTALIGN(offset)), clear);
		kind = Max(kind, k);
		JBE_ADVANCE_OFFSET(offset, entry);
	}
	return kind;
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

	switch (container_numbers(&jb->root, false))
	{
		case NUMBERS_NORMAL:
			return jb;
		case NUMBERS_SCALED:
			{
				/* the same layout, each 1.0 made 1 in a copy */
				Jsonb	   *copy = palloc(VARSIZE(jb));

				memcpy(copy, jb, VARSIZE(jb));
				(void) container_numbers(&copy->root, true);
				return copy;
			}
		case NUMBERS_OTHER:
			break;
	}
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
