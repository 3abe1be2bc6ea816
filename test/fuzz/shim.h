/*
 * shim.h
 *	  The few parts of a PostgreSQL backend that the fuzz targets' source files
 *	  use, provided outside a server (shim.c), and what the targets ask of it.
 */
#ifndef RL_FUZZ_SHIM_H
#define RL_FUZZ_SHIM_H

#include "postgres.h"

extern void shim_begin(void);
extern void shim_end(void);
extern bool shim_set_string_setting(const char *name, const char *value);
extern void shim_error_caught(void);
extern void shim_fail(const char *format,...) pg_attribute_printf(1, 2) pg_attribute_noreturn();
extern char *shim_copy(const uint8_t *data, size_t size);

/* A target's check: a false condition is a finding, reported and fatal. */
#define FUZZ_CHECK(condition) \
	((condition) ? (void) 0 : \
	 shim_fail("check failed: %s (%s:%d)", #condition, __FILE__, __LINE__))

#endif							/* RL_FUZZ_SHIM_H */
