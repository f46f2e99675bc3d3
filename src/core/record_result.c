/*-------------------------------------------------------------------------
 *
 * record_result.c
 *	  The answer a record stores.  Its HTTP status, body and headers
 *	  (IdemResult), checked and built from a call's arguments, and handed
 *	  back as the columns of idem_result.
 *
 * Headers come as a JSON object or, to keep repeated names and their
 * order, as a list of [name, value] pairs; both are stored as given and
 * checked alike: names and values are strings.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <limits.h>

#include "access/genam.h"
#include "access/nbtree.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/transam.h"
#include "access/xact.h"
#include "commands/sequence.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/datum.h"
#include "utils/fmgroids.h"
#include "utils/json.h"
#include "utils/jsonb.h"
#include "utils/guc.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "idem.h"
#include "compat.h"
#include "sequence.h"
#include "policy.h"
#include "record.h"

/* The record status of an HTTP status (2xx/3xx done, 4xx a final failure), else 22023. */
static IdemStatus
status_of_http(int32 http_status)
{
	if (http_status >= 200 && http_status <= 399)
		return IDEM_STATUS_SUCCEEDED;
	if (http_status >= 400 && http_status <= 499)
		return IDEM_STATUS_FAILED_FINAL;
	ereport(ERROR,
			(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
			 errmsg("http_status must be between 200 and 499"),
			 errdetail("The result has http_status %d.", http_status),
			 errhint("A 5xx failure is transient: roll back, and the key stays retryable.")));
	return IDEM_STATUS_UNKNOWN; /* keep compiler quiet */
}

/* An RFC 9110 tchar, what a field name is made of. */
static bool
header_tchar(unsigned char c)
{
	return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
		(c != '\0' && strchr("!#$%&'*+-.^_`|~", c) != NULL);
}

/*
 * Refuse (22023) a header a server could not send.  A name is an RFC 9110
 * token: "Set-Cookie: a=1; x" as a name would be replayed as a Set-Cookie.
 * A value holds no CR or LF, which would split the response.  (The client
 * libraries join Set-Cookie lines with a unit separator, 0x1f.)
 */
static void
check_header_text(const JsonbValue *v, const char *what, bool name)
{
	const unsigned char *p = (const unsigned char *) v->val.string.val;
	int			len = v->val.string.len;

	if (name && len == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must not hold an empty header name", what)));
	for (int i = 0; i < len; i++)
	{
		if (p[i] == '\r' || p[i] == '\n')
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("%s must not hold a carriage return or a line feed in a header %s", what,
							name ? "name" : "value"),
					 errdetail("A replay would split the response (HTTP response splitting)."),
					 errhint("Send one header per name and value; a repeated header is a repeated [name, value] pair of header_list.")));
		if (name && !header_tchar(p[i]))
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("%s must hold header names made of letters, digits and !#$%%&'*+-.^_`|~ only", what),
					 errdetail("Byte %d of a header name is not allowed (RFC 9110 token).", i + 1)));
	}
}

/* Refuse (22023) headers that are not a JSON object of string values. */
static void
check_headers(Jsonb *headers, const char *what)
{
	JsonbIterator *it;
	JsonbValue	v;
	JsonbIteratorToken tok;

	if (!JB_ROOT_IS_OBJECT(headers))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must be a JSON object", what)));
	it = JsonbIteratorInit(&headers->root);
	while ((tok = JsonbIteratorNext(&it, &v, true)) != WJB_DONE)
	{
		if (tok == WJB_VALUE && v.type != jbvString)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("%s must be a JSON object of string values", what)));
		if (tok == WJB_KEY || tok == WJB_VALUE)
			check_header_text(&v, what, tok == WJB_KEY);
	}
}

/*
 * Fill res from an HTTP status, body, headers and resource id given by a
 * caller, checking them; returns the status of the record that stores it.
 */
IdemStatus
idem_result_make(IdemResult *res, bool http_isnull, int32 http_status,
			bool body_isnull, Datum body, bool headers_isnull, Datum headers,
			bool resource_isnull, int64 resource_id)
{
	IdemStatus	status;

	if (http_isnull)
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("http_status must not be null")));
	status = status_of_http(http_status);
	memset(res, 0, sizeof(IdemResult));
	res->http_status = http_status;
	res->body_isnull = body_isnull;
	if (!body_isnull)
		res->body = PointerGetDatum(PG_DETOAST_DATUM(body));
	res->headers_isnull = headers_isnull;
	if (!headers_isnull)
	{
		Jsonb	   *jb = DatumGetJsonbP(headers);

		check_headers(jb, "headers");
		res->headers = JsonbPGetDatum(jb);
	}
	res->resource_isnull = resource_isnull;
	res->resource_id = resource_id;
	res->snapshot_isnull = true;
	return status;
}

/* The jsonb of a json text. */
static Jsonb *
jsonb_of_json(Datum json_text)
{
	return DatumGetJsonbP(DirectFunctionCall1(jsonb_in, CStringGetDatum(TextDatumGetCString(json_text))));
}

/*
 * Refuse (22023) headers in json form that are neither an object of string
 * values nor an array of [name, value] pairs of strings.
 */
static void
check_header_list(Datum json_text)
{
	Jsonb	   *jb = jsonb_of_json(json_text);
	JsonbIterator *it;
	JsonbValue	v;
	JsonbIteratorToken tok;
	int			depth = 0;
	int			members = 0;
	bool		ok = true;

	if (JB_ROOT_IS_OBJECT(jb))
	{
		check_headers(jb, "header_list");
		return;
	}
	if (JB_ROOT_IS_SCALAR(jb))
		ok = false;
	it = JsonbIteratorInit(&jb->root);
	while (ok && (tok = JsonbIteratorNext(&it, &v, false)) != WJB_DONE)
	{
		if (tok == WJB_BEGIN_ARRAY)
		{
			ok = ++depth <= 2;
			members = 0;
		}
		else if (tok == WJB_END_ARRAY)
			ok = --depth == 0 || members == 2;
		else if (tok == WJB_ELEM)
		{
			ok = depth == 2 && v.type == jbvString && ++members <= 2;
			if (ok)
				check_header_text(&v, "header_list", members == 1);
		}
		else
			ok = false;			/* an object inside */
	}
	if (!ok)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("header_list must be a JSON object of string values or an array of [name, value] pairs of strings"),
				 errhint("A repeated header (two Set-Cookie) is two pairs: [[\"Set-Cookie\", \"a=1\"], [\"Set-Cookie\", \"b=2\"]].")));
}

/*
 * Set res's headers from their json form, kept as given (checked); 22023
 * if res has them in jsonb form too.
 */
void
idem_result_set_header_list(IdemResult *res, Datum header_list)
{
	if (!res->headers_isnull)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("headers and header_list must not both be given"),
				 errhint("header_list (json) keeps the headers as given; headers (jsonb) is the older form.")));
	header_list = PointerGetDatum(PG_DETOAST_DATUM(header_list));
	check_header_list(header_list);
	res->header_list = header_list;
	res->has_header_list = true;
}

/*
 * The jsonb object of headers in json form.  An object as it is (a repeated
 * name keeps its last value), pairs with the values of a repeated name
 * joined by ", " (RFC 9110, 5.3), under its first spelling.
 */
Datum
idem_result_headers_of_list(Datum json_text)
{
	Jsonb	   *jb = jsonb_of_json(json_text);
	JsonbIterator *it;
	JsonbValue	v;
	JsonbIteratorToken tok;
	List	   *names = NIL;
	List	   *values = NIL;
	char	   *name = NULL;
	StringInfoData out;
	ListCell   *ln;
	ListCell   *lv;

	if (JB_ROOT_IS_OBJECT(jb))
		return JsonbPGetDatum(jb);
	it = JsonbIteratorInit(&jb->root);
	while ((tok = JsonbIteratorNext(&it, &v, false)) != WJB_DONE)
	{
		char	   *s;

		if (tok != WJB_ELEM)
			continue;
		s = pnstrdup(v.val.string.val, v.val.string.len);
		if (name == NULL)
		{
			name = s;
			continue;
		}
		forboth(ln, names, lv, values)
			if (pg_strcasecmp(lfirst(ln), name) == 0)
				break;
		if (ln != NULL)
			lfirst(lv) = psprintf("%s, %s", (char *) lfirst(lv), s);
		else
		{
			names = lappend(names, name);
			values = lappend(values, s);
		}
		name = NULL;
	}
	initStringInfo(&out);
	appendStringInfoChar(&out, '{');
	forboth(ln, names, lv, values)
	{
		if (out.len > 1)
			appendStringInfoString(&out, ", ");
		escape_json(&out, lfirst(ln));
		appendStringInfoString(&out, ": ");
		escape_json(&out, lfirst(lv));
	}
	appendStringInfoChar(&out, '}');
	return DirectFunctionCall1(jsonb_in, CStringGetDatum(out.data));
}

/*
 * The headers of res in json form: as given or stored in that form, else
 * the text of the jsonb object; *isnull if res has none.
 */
Datum
idem_result_header_list(const IdemResult *res, bool *isnull)
{
	*isnull = false;
	if (res->has_header_list)
		return res->header_list;
	if (!res->headers_isnull)
		return CStringGetTextDatum(DatumGetCString(DirectFunctionCall1(jsonb_out, res->headers)));
	*isnull = true;
	return (Datum) 0;
}

/*
 * res as the four columns a call returns, in this order: http_status, body,
 * headers, resource_id.  A record of the order demo has no body.  Its jsonb
 * response is the body.
 */
void
idem_result_values(const IdemResult *res, Datum *values, bool *nulls)
{
	values[0] = Int32GetDatum(res->http_status);
	nulls[0] = res->http_isnull;
	values[1] = res->body;
	nulls[1] = res->body_isnull;
	if (res->body_isnull && !res->snapshot_isnull)
	{
		Jsonb	   *snapshot = DatumGetJsonbP(res->snapshot);

		values[1] = CStringGetTextDatum(JsonbToCString(NULL, &snapshot->root,
													   VARSIZE(snapshot)));
		nulls[1] = false;
	}
	values[2] = res->headers;
	nulls[2] = res->headers_isnull;
	if (res->headers_isnull && res->has_header_list)
	{
		values[2] = idem_result_headers_of_list(res->header_list);
		nulls[2] = false;
	}
	values[3] = Int64GetDatum(res->resource_id);
	nulls[3] = res->resource_isnull;
}
