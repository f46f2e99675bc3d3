/*-------------------------------------------------------------------------
 *
 * binding.h
 *	  The role bindings.  idem.allowed_owners, idem.allowed_operations
 *	  (binding.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_BINDING_H
#define IDEM_BINDING_H

extern void idem_binding_init(void);
extern void idem_check_owner(int64 owner);
extern bool idem_owner_allowed(int64 owner);
extern int	idem_owner_ranges(int64 **lo, int64 **hi);
extern void idem_check_operation_allowed(const char *operation);

#endif							/* IDEM_BINDING_H */
