/* limits.h: the process's resource limits, read before a run commits to them. A run that would
 * not fit its address-space limit (ulimit -v) must say so at start: past the limit, OpenBLAS's
 * buffer allocation retries a failing mmap forever instead of failing. */
#ifndef CT_UTIL_LIMITS_H
#define CT_UTIL_LIMITS_H

#include <stddef.h>

/* The soft address-space limit (RLIMIT_AS) in bytes, or SIZE_MAX when there is none. */
size_t ct_address_space_limit(void);
/* Bytes of address space this process has mapped now (VmSize). 0 when it cannot be read. */
size_t ct_address_space_in_use(void);

/* A memory size as a person writes it: a positive number (decimals allowed) and a unit, with no
 * space between: B, KB, MB, GB, TB (powers of 1000) or KiB, MiB, GiB, TiB (powers of 1024), case
 * not significant ("24GiB", "512MiB", "80GB", "1.5gib"). A number without a unit is refused
 * (bytes or GiB? the reader cannot tell). Returns 0 and sets *out; -1 with `why` filled ("expected
 * a size such as 24GiB ...") for anything else: empty, negative, zero, not a number, an unknown
 * unit, trailing text, or more than 2^62 bytes. */
int ct_parse_bytes(const char *s, size_t *out, char *why, size_t why_n);

/* The host memory available to a new process now (MemAvailable in /proc/meminfo), 0 when it
 * cannot be read. */
size_t ct_host_available_bytes(void);

#endif
