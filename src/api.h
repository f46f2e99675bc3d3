/*-------------------------------------------------------------------------
 *
 * api.h
 *	  What the generic API's claims tell other entry points.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_API_H
#define IDEM_API_H

#include "key.h"

extern void idem_api_check_unclaimed(const IdemScope *scope, const char *fingerprint);

#endif							/* IDEM_API_H */
