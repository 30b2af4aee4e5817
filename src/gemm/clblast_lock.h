/* One lock around every CLBlast call. CLBlast 1.5.3 (Debian 12) races when several threads fill
 * its process-wide program and parameter caches at once (CLBlast issue #486, fixed upstream in
 * 2023): here, first calls from threads with their own contexts failed with CLBlast status -2039
 * and std::bad_alloc. This mutex is the library's only process-wide state, and it exists because
 * of CLBlast's own; CLBlast calls only enqueue work, so it is held briefly except while CLBlast
 * builds a program. */
#ifndef IHA_GEMM_CLBLAST_LOCK_H
#define IHA_GEMM_CLBLAST_LOCK_H

void iha__clblast_lock(void);
void iha__clblast_unlock(void);
#endif
