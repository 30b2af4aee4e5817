/* How many iterations a loop really runs on this device: the library's check for drivers that
 * end kernel loops early (src/runtime/loop_limit.c). `n` is a kernel argument, so no compiler
 * can count the loop at build time. */
__kernel void loop_probe_count(__global int *out, int n)
{
    volatile int ran = 0;
    for (int i = 0; i < n; ++i) ran = ran + 1;
    out[0] = ran;
}
