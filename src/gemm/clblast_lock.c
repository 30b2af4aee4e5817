/* The process-wide lock around CLBlast calls and the count of contexts using CLBlast (see
 * clblast_lock.h for why they exist). */
#include "gemm/clblast_lock.h"
#include "gemm/sgemm.h"

#include <clblast_c.h>
#include <pthread.h>

static pthread_mutex_t clblast_mutex = PTHREAD_MUTEX_INITIALIZER;
static size_t live_users; /* contexts that have called CLBlast and are not freed; under the lock */

void iha__clblast_lock(void) { pthread_mutex_lock(&clblast_mutex); }

void iha__clblast_unlock(void) { pthread_mutex_unlock(&clblast_mutex); }

void iha__clblast_leave(iha_context *ctx)
{
    if (!ctx->gemm->clblast_user) return;
    ctx->gemm->clblast_user = 0;
    iha__clblast_lock();
    if (live_users > 0 && --live_users == 0) (void)CLBlastClearCache();
    iha__clblast_unlock();
}

void iha__clblast_enter(iha_context *ctx)
{
    iha__clblast_lock();
    if (!ctx->gemm->clblast_user) {
        ctx->gemm->clblast_user = 1;
        ++live_users;
    }
}
