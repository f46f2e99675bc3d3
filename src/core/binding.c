/*-------------------------------------------------------------------------
 *
 * binding.c
 *	  The role bindings.  idem.allowed_owners and idem.allowed_operations,
 *	  the owners and the operations a session may act for.
 *
 * A superuser binds a role with ALTER ROLE ... SET idem.allowed_owners =
 * '7, 100-199' (owners and ranges) and idem.allowed_operations =
 * 'CREATE_ORDER,SHIP' (exact names); both are PGC_SUSET, so the role
 * cannot change them.  The check hooks parse each setting once, when it is
 * set, into ranges and names kept as the GUC's extra.  The claiming entry
 * points refuse (42501) an owner or operation outside them
 * (idem_check_owner, idem_check_operation_allowed).  idem_audit hides
 * other owners' rows (idem_owner_allowed).  An empty setting binds
 * nothing.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "utils/guc.h"

#include "idem.h"
#include "compat.h"
#include "binding.h"

/* GUC variables */
static char *idem_allowed_owners = NULL;
static char *idem_allowed_operations = NULL;

/*
 * idem.allowed_owners, parsed.  The owners a role may act for, as ranges.
 * NULL (an empty setting) binds nothing.
 */
typedef struct OwnerRanges
{
	int			n;
	struct
	{
		int64		lo;
		int64		hi;
	}			r[FLEXIBLE_ARRAY_MEMBER];
} OwnerRanges;

static OwnerRanges *allowed_owners = NULL;

/* Parse an optionally signed decimal int64 at *p; false if there is none. */
static bool
parse_owner(const char **p, int64 *value)
{
	const char *s = *p;
	bool		neg = false;
	uint64		v = 0;

	if (*s == '-')
	{
		neg = true;
		s++;
	}
	if (*s < '0' || *s > '9')
		return false;
	while (*s >= '0' && *s <= '9')
	{
		if (v > (PG_UINT64_MAX - 9) / 10)
			return false;
		v = v * 10 + (*s++ - '0');
	}
	if (v > (uint64) PG_INT64_MAX + (neg ? 1 : 0))
		return false;
	*value = neg ? (int64) (0 - v) : (int64) v;
	*p = s;
	return true;
}

/*
 * The list settings (idem.allowed_owners, idem.allowed_operations) are
 * items separated by commas, with spaces around them ignored.  list_alloc
 * returns the check hook's extra: header bytes and room for as many items
 * of itemsize as the list can hold.  It comes from the allocator the GUC
 * code frees it with (compat.h: malloc before 16, guc_malloc from 16 on).
 * parse_list calls item at each item, which parses it at *p, stores it as
 * item i and advances *p.  It returns false for a malformed list or a
 * refused item.
 */
typedef bool (*ListItem) (const char **p, int i, void *extra);

static void *
list_alloc(const char *list, Size header, Size itemsize)
{
	int			cap = 1;
	void	   *extra;

	for (const char *c = list; *c; c++)
		if (*c == ',')
			cap++;
	extra = idem_guc_malloc(header + cap * itemsize);
	if (extra == NULL)
		GUC_check_errcode(ERRCODE_OUT_OF_MEMORY);
	return extra;
}

static bool
parse_list(const char *p, ListItem item, void *extra, int *n)
{
	*n = 0;
	while (*p == ' ')
		p++;
	while (*p != '\0')
	{
		if (!item(&p, (*n)++, extra))
			return false;
		while (*p == ' ')
			p++;
		if (*p == ',')
		{
			p++;
			while (*p == ' ')
				p++;
			if (*p == '\0')
				return false;
		}
		else if (*p != '\0')
			return false;
	}
	return true;
}

/* An owner ("7") or a range ("100-199", "-5..5") of idem.allowed_owners. */
static bool
owner_range_item(const char **p, int i, void *extra)
{
	OwnerRanges *ranges = (OwnerRanges *) extra;
	int64		lo;
	int64		hi;

	if (!parse_owner(p, &lo))
		return false;
	hi = lo;
	if ((*p)[0] == '.' && (*p)[1] == '.')
	{
		*p += 2;
		if (!parse_owner(p, &hi))
			return false;
	}
	else if ((*p)[0] == '-')
	{
		*p += 1;
		if (!parse_owner(p, &hi))
			return false;
	}
	if (hi < lo)
		return false;
	ranges->r[i].lo = lo;
	ranges->r[i].hi = hi;
	return true;
}

/*
 * Check hook of idem.allowed_owners: a comma-separated list of owners and
 * ranges ("7", "7,9", "100-199", "-5..5"); builds the parsed ranges.
 */
static bool
check_allowed_owners(char **newval, void **extra, GucSource source)
{
	OwnerRanges *ranges = list_alloc(*newval, offsetof(OwnerRanges, r),
									 sizeof(ranges->r[0]));

	if (ranges == NULL)
		return false;
	if (!parse_list(*newval, owner_range_item, ranges, &ranges->n))
	{
		idem_guc_free(ranges);
		GUC_check_errdetail("Give owners and ranges separated by commas, such as \"7\", \"7,9\" or \"100-199\".");
		return false;
	}
	*extra = ranges;
	return true;
}

static void
assign_allowed_owners(const char *newval, void *extra)
{
	OwnerRanges *ranges = (OwnerRanges *) extra;

	allowed_owners = (ranges != NULL && ranges->n > 0) ? ranges : NULL;
}

/*
 * Is owner one the current role may act for (idem.allowed_owners; every
 * owner when it is empty)?  What idem_audit shows a role outside
 * pg_monitor.
 */
bool
idem_owner_allowed(int64 owner)
{
	if (allowed_owners == NULL)
		return true;
	for (int i = 0; i < allowed_owners->n; i++)
		if (owner >= allowed_owners->r[i].lo && owner <= allowed_owners->r[i].hi)
			return true;
	return false;
}

/*
 * The owners idem.allowed_owners binds the session to, as n ranges in
 * *lo and *hi (palloc'd); -1 when it binds nothing (any owner).
 */
int
idem_owner_ranges(int64 **lo, int64 **hi)
{
	if (allowed_owners == NULL)
		return -1;
	*lo = palloc(sizeof(int64) * Max(allowed_owners->n, 1));
	*hi = palloc(sizeof(int64) * Max(allowed_owners->n, 1));
	for (int i = 0; i < allowed_owners->n; i++)
	{
		(*lo)[i] = allowed_owners->r[i].lo;
		(*hi)[i] = allowed_owners->r[i].hi;
	}
	return allowed_owners->n;
}

/*
 * Refuse (42501) an owner outside idem.allowed_owners, the owners the
 * current role is bound to; an empty setting binds nothing.
 */
void
idem_check_owner(int64 owner)
{
	if (idem_owner_allowed(owner))
		return;
	ereport(ERROR,
			(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
			 errmsg("owner " INT64_FORMAT " is not one this session may act for", owner),
			 errdetail("idem.allowed_owners is \"%s\".", idem_allowed_owners),
			 errhint("A superuser binds a role to its owners with ALTER ROLE ... SET idem.allowed_owners.")));
}

/*
 * idem.allowed_operations, parsed.  The exact operation names the current
 * role may act for.  NULL (an empty setting) allows every operation.
 */
typedef struct OperationList
{
	int			n;
	char		names[FLEXIBLE_ARRAY_MEMBER][IDEM_OPERATION_MAX_LEN + 1];
} OperationList;

static OperationList *allowed_operations = NULL;


/* An operation name of idem.allowed_operations, as idem_check_operation accepts it. */
static bool
operation_item(const char **p, int i, void *extra)
{
	OperationList *ops = (OperationList *) extra;
	int			len = 0;

	while (idem_name_char((*p)[len]))
		len++;
	if (len == 0 || len > IDEM_OPERATION_MAX_LEN)
		return false;
	memcpy(ops->names[i], *p, len);
	ops->names[i][len] = '\0';
	*p += len;
	return true;
}

/*
 * Check hook of idem.allowed_operations: operation names separated by
 * commas; builds the parsed list.
 */
static bool
check_allowed_operations(char **newval, void **extra, GucSource source)
{
	OperationList *ops = list_alloc(*newval, offsetof(OperationList, names),
									sizeof(ops->names[0]));

	if (ops == NULL)
		return false;
	if (!parse_list(*newval, operation_item, ops, &ops->n))
	{
		idem_guc_free(ops);
		GUC_check_errdetail("Give operation names of 1 to %d characters from A-Z, a-z, 0-9, \"_\", \".\", \":\" and \"-\", separated by commas, such as \"CREATE_ORDER,SHIP\".",
							IDEM_OPERATION_MAX_LEN);
		return false;
	}
	*extra = ops;
	return true;
}

static void
assign_allowed_operations(const char *newval, void *extra)
{
	OperationList *ops = (OperationList *) extra;

	allowed_operations = (ops != NULL && ops->n > 0) ? ops : NULL;
}

/*
 * Refuse (42501) an operation outside idem.allowed_operations, the
 * operations the current role is bound to; an empty setting binds nothing.
 */
void
idem_check_operation_allowed(const char *operation)
{
	if (allowed_operations == NULL)
		return;
	for (int i = 0; i < allowed_operations->n; i++)
		if (strcmp(operation, allowed_operations->names[i]) == 0)
			return;
	ereport(ERROR,
			(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
			 errmsg("operation \"%s\" is not one this session may act for", operation),
			 errdetail("idem.allowed_operations is \"%s\".", idem_allowed_operations),
			 errhint("A superuser binds a role to its operations with ALTER ROLE ... SET idem.allowed_operations.")));
}

/* Define the GUCs of this module. */
void
idem_binding_init(void)
{
	DefineCustomStringVariable("idem.allowed_owners",
							   "The owners this session may act for: a list of owners and ranges.",
							   "Set by a superuser, typically per role (ALTER ROLE ... SET); "
							   "empty means any owner.",
							   &idem_allowed_owners,
							   "",
							   PGC_SUSET,
							   0,
							   check_allowed_owners, assign_allowed_owners, NULL);

	DefineCustomStringVariable("idem.allowed_operations",
							   "The operations this session may act for: a list of exact operation names.",
							   "Set by a superuser, typically per role (ALTER ROLE ... SET); "
							   "empty means any operation. Applies to idem_create_order "
							   "(CREATE_ORDER), idem_begin, idem_finish, idem_run, idem_submit "
							   "and the task calls; not to topics or consumers.",
							   &idem_allowed_operations,
							   "",
							   PGC_SUSET,
							   0,
							   check_allowed_operations, assign_allowed_operations, NULL);
}
