/*-------------------------------------------------------------------------
 *
 * keycheck.h
 *	  The check value of each fingerprint secret version the server has
 *	  seen, in shared memory.  A version's secret never changes.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_KEYCHECK_H
#define IDEM_KEYCHECK_H

#define IDEM_KEYCHECK_LEN	32

extern void idem_keycheck_shmem_request(void);
extern void idem_keycheck_shmem_startup(void);
extern bool idem_keycheck_verify(int version, const uint8 *check);

#endif							/* IDEM_KEYCHECK_H */
