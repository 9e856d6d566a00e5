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

#endif
