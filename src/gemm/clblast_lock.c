/* The process-wide lock around CLBlast calls (see clblast_lock.h for why it exists). */
#include "gemm/clblast_lock.h"

#include <pthread.h>

static pthread_mutex_t clblast_mutex = PTHREAD_MUTEX_INITIALIZER;

void iha__clblast_lock(void) { pthread_mutex_lock(&clblast_mutex); }

void iha__clblast_unlock(void) { pthread_mutex_unlock(&clblast_mutex); }
