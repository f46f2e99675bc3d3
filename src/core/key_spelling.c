/*-------------------------------------------------------------------------
 *
 * key_spelling.c
 *	  A call's scope (owner, operation, key) from its arguments, the key's
 *	  spellings and the key checks of its operation's policy.  A key shaped
 *	  like a UUID or a ULID is one key in either case; key_format and
 *	  reject_weak_keys refuse only keys about to be executed.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <ctype.h>

#include "fmgr.h"
#include "utils/builtins.h"

#include "idem.h"
#include "util.h"
#include "binding.h"
#include "key.h"
#include "policy.h"

/* 22023 for a key its operation's key_format or reject_weak_keys refuses. */
static void
refuse_key(const IdemScope *scope, const char *why, const char *hint)
{
	ereport(ERROR,
			(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
			 errmsg("idempotency key %s", why),
			 errdetail("Operation %s requires it (idem_set_policy).", scope->operation),
			 errhint("%s", hint)));
}

/* The shapes of key a key_format names. */
typedef enum KeyShape
{
	KEY_SHAPE_TOKEN,
	KEY_SHAPE_UUID,
	KEY_SHAPE_ULID
} KeyShape;

/*
 * The shape of a checked key.  For a UUID or a ULID, *norm is its one
 * spelling.  A copy, or NULL if the key is that already.  A UUID (8-4-4-4-12
 * hex digits, any version) is spelled in lower case.  A ULID (26 Crockford
 * base32 characters, the first at most 7) is spelled in upper case.
 */
static KeyShape
key_shape(const char *key, int len, char **norm)
{
	bool		uuid = len == 36;
	bool		ulid = len == 26;
	bool		lower = false;
	bool		upper = false;

	for (int i = 0; i < len && (uuid || ulid); i++)
	{
		char		c = key[i];
		char		u = c >= 'a' && c <= 'z' ? c - ('a' - 'A') : c;

		if (uuid)
			uuid = (i == 8 || i == 13 || i == 18 || i == 23) ? c == '-' : isxdigit((unsigned char) c);
		if (ulid)
			ulid = ((u >= '0' && u <= '9') || (u >= 'A' && u <= 'Z')) &&
				u != 'I' && u != 'L' && u != 'O' && u != 'U' && (i > 0 || u <= '7');
		lower |= c >= 'a' && c <= 'z';
		upper |= c >= 'A' && c <= 'Z';
	}
	*norm = NULL;
	if (uuid || ulid)
	{
		if (uuid ? upper : lower)
		{
			*norm = pnstrdup(key, len);
			for (int i = 0; i < len; i++)
				(*norm)[i] = uuid ? pg_ascii_tolower((*norm)[i]) : pg_ascii_toupper((*norm)[i]);
		}
		return uuid ? KEY_SHAPE_UUID : KEY_SHAPE_ULID;
	}
	return KEY_SHAPE_TOKEN;
}

/*
 * Set scope's key from key_text, checked (idem_check_key).  A key shaped
 * like a UUID or a ULID has one spelling (a UUID in lower case, a ULID in
 * upper case), whatever the operation's key_format.  That spelling is
 * scope->key.  A new record is stored under it, the key lock is taken on
 * it and a transaction's claims are kept by it, so two spellings of one
 * identifier are one key.  A lookup tries it first, then the key as sent
 * (sent_key), under which an older record stored without a key_format is.
 */
void
idem_scope_set_key(IdemScope *scope, Datum key_text)
{
	text	   *key = DatumGetTextPP(key_text);
	int			len = VARSIZE_ANY_EXHDR(key);
	char	   *norm;

	scope->key = text_to_cstring(key);
	idem_check_key(scope->key, len);
	scope->key_text = PointerGetDatum(key);
	scope->sent_key = NULL;
	scope->sent_text = (Datum) 0;
	if (key_shape(scope->key, len, &norm) == KEY_SHAPE_TOKEN || norm == NULL)
		return;
	scope->sent_key = scope->key;
	scope->sent_text = scope->key_text;
	scope->key = norm;
	scope->key_text = PointerGetDatum(cstring_to_text(norm));
}

/*
 * Fill scope from text arguments, checking the key and the operation.  The
 * strings are allocated in the current memory context.
 */
void
idem_scope_init(IdemScope *scope, int64 owner, Datum operation_text, Datum key_text)
{
	text	   *op = DatumGetTextPP(operation_text);

	idem_check_owner(owner);
	scope->owner = owner;
	scope->operation = text_to_cstring(op);
	idem_check_operation(scope->operation, VARSIZE_ANY_EXHDR(op));
	idem_check_operation_allowed(scope->operation);
	scope->operation_text = PointerGetDatum(op);
	idem_scope_set_key(scope, key_text);
}

/*
 * (owner, operation, key) from a call's arguments 0..2: none NULL (22004),
 * each checked.
 */
void
idem_scope_from_args(FunctionCallInfo fcinfo, IdemScope *scope)
{
	idem_check_not_null(fcinfo, 0, "owner");
	idem_check_not_null(fcinfo, 1, "operation");
	idem_check_not_null(fcinfo, 2, "key");
	idem_scope_init(scope, PG_GETARG_INT64(0), PG_GETARG_DATUM(1), PG_GETARG_DATUM(2));
}

/*
 * Spelling i (0 .. IDEM_KEY_SPELLINGS - 1) of scope's key, in the order a
 * lookup tries them, as a scope of its own in *spelled; false if the key
 * has no spelling i.
 */
bool
idem_scope_spelling(const IdemScope *scope, int i, IdemScope *spelled)
{
	if (i >= IDEM_KEY_SPELLINGS || (i > 0 && scope->sent_key == NULL))
		return false;
	*spelled = *scope;
	if (i > 0)
	{
		spelled->key = scope->sent_key;
		spelled->key_text = scope->sent_text;
	}
	return true;
}

/*
 * The key checks of the operation's policy: key_format 'uuid' or
 * 'ulid' (either case: see idem_scope_set_key); reject_weak_keys refuses
 * all-digit keys (timestamps, ids) and keys of fewer than 8 distinct
 * characters.  Asked only of a key about to be executed.  A key with a
 * record or an audit row from before the policy is replayed (or refused
 * with IK007) as any other.
 */
void
idem_check_key_policy(const IdemScope *scope)
{
	const IdemPolicy *policy = idem_policy_of(scope->operation);
	const char *k = scope->key;
	int			len = strlen(k);
	char	   *norm;
	KeyShape	shape;

	if (policy == NULL || (policy->key_format == IDEM_KEY_TOKEN && !policy->reject_weak_keys))
		return;
	shape = key_shape(k, len, &norm);
	if (policy->key_format == IDEM_KEY_UUID && shape != KEY_SHAPE_UUID)
		refuse_key(scope, "must be a UUID",
				   "Send a UUID (8-4-4-4-12 hexadecimal digits), e.g. 8e03978e-40d5-43e8-bc93-6894a57f9324.");
	if (policy->key_format == IDEM_KEY_ULID && shape != KEY_SHAPE_ULID)
		refuse_key(scope, "must be a ULID",
				   "Send a ULID (26 Crockford base32 characters), e.g. 01JZ3K9V4S6T8W0XYZ12AB34CD.");
	if (policy->reject_weak_keys)
	{
		bool		seen[128] = {0};
		int			distinct = 0;
		bool		digits = true;

		for (int i = 0; i < len; i++)
		{
			digits &= k[i] >= '0' && k[i] <= '9';
			distinct += !seen[(unsigned char) k[i] & 127];
			seen[(unsigned char) k[i] & 127] = true;
		}
		if (digits || distinct < 8)
			refuse_key(scope, digits ? "is weak: only digits" : "is weak: fewer than 8 distinct characters",
					   "Do not use timestamps or ids as keys: send a UUID or a ULID, one per business intent.");
	}
}
