/* CLBlast's process-wide state, and the library's only process-wide state, which exists because
 * of it.
 *
 * A lock around every CLBlast call. CLBlast 1.5.3 (Debian 12) races when several threads fill
 * its process-wide program and parameter caches at once (CLBlast issue #486, fixed upstream in
 * 2023): here, first calls from threads with their own contexts failed with CLBlast status -2039
 * and std::bad_alloc. CLBlast calls only enqueue work, so it is held briefly except while
 * CLBlast builds a program.
 *
 * A count of the live contexts that have called CLBlast. CLBlast keeps every program it
 * compiles in a process-wide cache, and each program holds a reference to its cl_context: a
 * freed context's OpenCL context would stay alive, about 1.7 MiB on PoCL for each context
 * created and freed. When the last such context is freed, CLBlast's program cache is cleared
 * (CLBlastClearCache; parameter overrides stay). Clearing while other contexts live would make
 * them rebuild CLBlast's programs, so a process that keeps one context alive pays nothing. */
#ifndef IHA_GEMM_CLBLAST_LOCK_H
#define IHA_GEMM_CLBLAST_LOCK_H
#include "runtime/context.h"

/* Takes the lock for a CLBlast call on ctx's queue, counting ctx as a CLBlast user the first
 * time. */
void iha__clblast_enter(iha_context *ctx);
/* At iha_context_free, after the queue has finished: the last CLBlast user's departure empties
 * CLBlast's program cache. */
void iha__clblast_leave(iha_context *ctx);
/* The lock alone, for calls that compile nothing for a context (parameter overrides). */
void iha__clblast_lock(void);
void iha__clblast_unlock(void);
#endif
