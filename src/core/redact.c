/*-------------------------------------------------------------------------
 *
 * redact.c
 *	  The members an operation's policy redacts (its JSON Pointers,
 *	  RFC 6901), taken out of every stored copy of an answer.  The body, the
 *	  order's response, the headers in both forms, a task's final failure
 *	  and its last error.
 *
 * Never an error.  A pointer that does not apply to a value (a member that
 * is not there, a pointer through a scalar, an array index that is not a
 * canonical index of the array) is skipped, whatever shape a client's
 * echoed field gives the body.  Header names are matched without
 * regard to case, as HTTP compares them: "/Authorization" removes
 * "authorization".
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "nodes/pg_list.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/fmgrprotos.h"
#include "utils/json.h"
#include "utils/jsonb.h"

#include "idem.h"
#include "policy.h"
#include "redact.h"

/* The segments of a path (text[]); *n their number. */
static Datum *
path_segments(Datum path, int *n)
{
	Datum	   *segs;
	bool	   *nulls;

	deconstruct_array(DatumGetArrayTypeP(path), TEXTOID, -1, false, TYPALIGN_INT,
					  &segs, &nulls, n);
	return segs;
}

/* A JSON Pointer's array index: digits, no leading zero; -1 if not one. */
static int
array_index(text *seg)
{
	const char *p = VARDATA_ANY(seg);
	int			len = VARSIZE_ANY_EXHDR(seg);
	int			i = 0;

	if (len == 0 || len > 9 || (len > 1 && p[0] == '0'))
		return -1;
	for (int k = 0; k < len; k++)
	{
		if (p[k] < '0' || p[k] > '9')
			return -1;
		i = i * 10 + (p[k] - '0');
	}
	return i;
}

/* Does the path name a value of jb (so that jsonb_delete_path removes it)? */
static bool
path_applies(Jsonb *jb, Datum path)
{
	JsonbContainer *c = &jb->root;
	int			n;
	Datum	   *segs = path_segments(path, &n);

	if (n == 0 || JB_ROOT_IS_SCALAR(jb))
		return false;
	for (int i = 0; i < n; i++)
	{
		text	   *seg = DatumGetTextPP(segs[i]);
		JsonbValue *v;

		if (JsonContainerIsObject(c))
		{
			JsonbValue	k;

			k.type = jbvString;
			k.val.string.val = VARDATA_ANY(seg);
			k.val.string.len = VARSIZE_ANY_EXHDR(seg);
			v = findJsonbValueFromContainer(c, JB_FOBJECT, &k);
		}
		else if (JsonContainerIsArray(c) && array_index(seg) >= 0)
			v = getIthJsonbValueFromContainer(c, (uint32) array_index(seg));
		else
			return false;
		if (v == NULL)
			return false;
		if (i < n - 1)
		{
			if (v->type != jbvBinary)
				return false;
			c = v->val.binary.data;
		}
	}
	return true;
}

/*
 * A jsonb value without the members the policy redacts; the same Datum
 * when there is nothing to remove (*removed false).
 */
static Datum
redact(const IdemPolicy *policy, Datum jsonb, bool *removed)
{
	Datum		out = jsonb;

	*removed = false;
	for (int i = 0; i < policy->nredact; i++)
		if (path_applies(DatumGetJsonbP(out), policy->redact_paths[i]))
		{
			out = DirectFunctionCall2(jsonb_delete_path, out, policy->redact_paths[i]);
			*removed = true;
		}
	return out;
}

/* A stored json body (text) without the redacted members, the same text byte for byte if none is there. */
Datum
idem_redact_json(const char *operation, Datum json_text)
{
	const IdemPolicy *policy = idem_policy_of(operation);
	Datum		jb;
	bool		removed;

	if (policy == NULL || policy->nredact == 0)
		return json_text;
	jb = DirectFunctionCall1(jsonb_in, CStringGetDatum(TextDatumGetCString(json_text)));
	jb = redact(policy, jb, &removed);
	if (!removed)
		return json_text;
	return CStringGetTextDatum(DatumGetCString(DirectFunctionCall1(jsonb_out, jb)));
}

/* A stored jsonb (the order's response, a task's error) without the redacted members. */
Datum
idem_redact_jsonb(const char *operation, Datum jsonb)
{
	const IdemPolicy *policy = idem_policy_of(operation);
	bool		removed;

	if (policy == NULL || policy->nredact == 0)
		return jsonb;
	return redact(policy, jsonb, &removed);
}

/* Does one of the policy's one-segment pointers name the header name (any case)? */
static bool
redacts_name(const IdemPolicy *policy, const char *name, int len)
{
	for (int i = 0; i < policy->nredact; i++)
	{
		int			n;
		Datum	   *segs = path_segments(policy->redact_paths[i], &n);
		text	   *seg = DatumGetTextPP(segs[0]);

		if (n == 1 && (int) VARSIZE_ANY_EXHDR(seg) == len &&
			pg_strncasecmp(VARDATA_ANY(seg), name, len) == 0)
			return true;
	}
	return false;
}

/*
 * Headers as a jsonb object without the members the policy's one-segment
 * pointers name, in any case; the same Datum if none is there.
 */
static Datum
redact_header_object(const IdemPolicy *policy, Datum jsonb, bool *removed)
{
	Jsonb	   *jb = DatumGetJsonbP(jsonb);
	JsonbIterator *it;
	JsonbValue	v;
	JsonbIteratorToken tok;
	List	   *names = NIL;
	ListCell   *lc;
	Datum		out = jsonb;

	*removed = false;
	if (!JB_ROOT_IS_OBJECT(jb))
		return redact(policy, jsonb, removed);
	it = JsonbIteratorInit(&jb->root);
	while ((tok = JsonbIteratorNext(&it, &v, true)) != WJB_DONE)
		if (tok == WJB_KEY && redacts_name(policy, v.val.string.val, v.val.string.len))
			names = lappend(names, cstring_to_text_with_len(v.val.string.val, v.val.string.len));
	foreach(lc, names)
		out = DirectFunctionCall2(jsonb_delete, out, PointerGetDatum(lfirst(lc)));
	*removed = names != NIL;
	return out;
}

/* Headers as a jsonb object (response_headers) without the redacted names. */
Datum
idem_redact_headers(const char *operation, Datum jsonb)
{
	const IdemPolicy *policy = idem_policy_of(operation);
	bool		removed;

	if (policy == NULL || policy->nredact == 0)
		return jsonb;
	return redact_header_object(policy, jsonb, &removed);
}

/*
 * Headers in json form without the redacted names.  An object's
 * members, or the [name, value] pairs, whose name a one-segment pointer
 * names in any case ("/Authorization").  The same text, byte for byte, if
 * none is there.
 */
Datum
idem_redact_header_list(const char *operation, Datum json_text)
{
	const IdemPolicy *policy = idem_policy_of(operation);
	Jsonb	   *jb;
	JsonbIterator *it;
	JsonbValue	v;
	JsonbIteratorToken tok;
	StringInfoData out;
	JsonbValue	pair[2];
	int			n = 0;
	bool		removed = false;

	if (policy == NULL || policy->nredact == 0)
		return json_text;
	jb = DatumGetJsonbP(DirectFunctionCall1(jsonb_in, CStringGetDatum(TextDatumGetCString(json_text))));
	if (!JB_ROOT_IS_ARRAY(jb) || JB_ROOT_IS_SCALAR(jb))
	{
		Datum		o = redact_header_object(policy, JsonbPGetDatum(jb), &removed);

		return removed ? CStringGetTextDatum(DatumGetCString(DirectFunctionCall1(jsonb_out, o))) : json_text;
	}
	initStringInfo(&out);
	appendStringInfoChar(&out, '[');
	it = JsonbIteratorInit(&jb->root);
	while ((tok = JsonbIteratorNext(&it, &v, false)) != WJB_DONE)
	{
		if (tok != WJB_ELEM || v.type != jbvString)
			continue;
		pair[n++] = v;
		if (n < 2)
			continue;
		n = 0;
		if (redacts_name(policy, pair[0].val.string.val, pair[0].val.string.len))
		{
			removed = true;
			continue;
		}
		if (out.len > 1)
			appendStringInfoString(&out, ", ");
		appendStringInfoChar(&out, '[');
		escape_json(&out, pnstrdup(pair[0].val.string.val, pair[0].val.string.len));
		appendStringInfoString(&out, ", ");
		escape_json(&out, pnstrdup(pair[1].val.string.val, pair[1].val.string.len));
		appendStringInfoChar(&out, ']');
	}
	appendStringInfoChar(&out, ']');
	return removed ? CStringGetTextDatum(out.data) : json_text;
}
