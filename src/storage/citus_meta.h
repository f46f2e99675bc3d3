/*-------------------------------------------------------------------------
 *
 * citus_meta.h
 *	  Citus's metadata, as idem's catalog needs it (citus_meta.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_CITUS_META_H
#define IDEM_CITUS_META_H

extern bool idem_citus_distributed(Oid relid);

#endif							/* IDEM_CITUS_META_H */
