/* Stand-alone reproducer of Mesa gallivm's loop limit (doc/drivers.md): one work-item runs a
 * loop of n iterations, then two nested loops, and reports how many iterations really ran, on
 * every OpenCL device. A conformant driver prints the requested counts.
 *   cc mesa_loop_limit.c -lOpenCL -o mesa_loop_limit && RUSTICL_ENABLE=llvmpipe ./mesa_loop_limit */
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>
#include <stdio.h>

static const char *source =
    "__kernel void count(__global int *out, int n, int m)\n"
    "{\n"
    "    volatile int flat = 0;\n"
    "    for (int i = 0; i < n; ++i) flat = flat + 1;\n"
    "    out[0] = flat;\n"
    "}\n"
    "__kernel void nested(__global int *out, int n, int m)\n"
    "{\n"
    "    volatile int outer = 0, inner = 0;\n"
    "    for (int i = 0; i < n; ++i) {\n"
    "        outer = outer + 1;\n"
    "        for (int j = 0; j < m; ++j) inner = inner + 1;\n"
    "    }\n"
    "    out[0] = outer;\n"
    "    out[1] = inner;\n"
    "}\n";

static int run(cl_context ctx, cl_command_queue q, cl_program prog, const char *name, cl_int n, cl_int m, cl_int *got)
{
    cl_int err;
    cl_kernel k = clCreateKernel(prog, name, &err);
    if (err != CL_SUCCESS) return -1;
    cl_mem out = clCreateBuffer(ctx, CL_MEM_READ_WRITE, 2 * sizeof(cl_int), NULL, &err);
    const size_t one = 1;
    int ok = err == CL_SUCCESS && clSetKernelArg(k, 0, sizeof out, &out) == CL_SUCCESS &&
             clSetKernelArg(k, 1, sizeof n, &n) == CL_SUCCESS && clSetKernelArg(k, 2, sizeof m, &m) == CL_SUCCESS &&
             clEnqueueNDRangeKernel(q, k, 1, NULL, &one, &one, 0, NULL, NULL) == CL_SUCCESS &&
             clEnqueueReadBuffer(q, out, CL_TRUE, 0, 2 * sizeof(cl_int), got, 0, NULL, NULL) == CL_SUCCESS;
    if (out) clReleaseMemObject(out);
    clReleaseKernel(k);
    return ok ? 0 : -1;
}

int main(void)
{
    cl_platform_id platforms[16];
    cl_uint np = 0;
    if (clGetPlatformIDs(16, platforms, &np) != CL_SUCCESS) return 1;
    for (cl_uint p = 0; p < np && p < 16; ++p) {
        cl_device_id dev;
        char name[256] = "", driver[256] = "";
        if (clGetDeviceIDs(platforms[p], CL_DEVICE_TYPE_ALL, 1, &dev, NULL) != CL_SUCCESS) continue;
        clGetDeviceInfo(dev, CL_DEVICE_NAME, sizeof name, name, NULL);
        clGetDeviceInfo(dev, CL_DRIVER_VERSION, sizeof driver, driver, NULL);
        cl_int err;
        cl_context ctx = clCreateContext(NULL, 1, &dev, NULL, NULL, &err);
        if (err != CL_SUCCESS) continue;
        cl_command_queue q = clCreateCommandQueue(ctx, dev, 0, &err);
        cl_program prog = clCreateProgramWithSource(ctx, 1, &source, NULL, &err);
        cl_int flat[2] = {0, 0}, nested[2] = {0, 0};
        if (q && prog && clBuildProgram(prog, 1, &dev, "", NULL, NULL) == CL_SUCCESS &&
            run(ctx, q, prog, "count", 100000, 0, flat) == 0 && run(ctx, q, prog, "nested", 20, 4000, nested) == 0)
            printf("%s (driver %s): a loop of 100000 iterations ran %d; 20 x 4000 nested ran %d x %d\n", name,
                   driver, flat[0], nested[0], nested[1]);
        else
            printf("%s (driver %s): could not run the kernels\n", name, driver);
        if (prog) clReleaseProgram(prog);
        if (q) clReleaseCommandQueue(q);
        clReleaseContext(ctx);
    }
    return 0;
}
