/* Device enumeration, description and choice from a spec ("P:D", name substring, type). */
#include "runtime/context.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#define IHA_MAX_PLATFORMS 16
#define IHA_MAX_DEVICES 64

/* A device or platform string, whole: its size is asked first, so no length is too long. */
static char *info_string(cl_platform_id platform, cl_device_id dev, cl_uint what)
{
    size_t size = 0;
    cl_int err = dev ? clGetDeviceInfo(dev, what, 0, NULL, &size) : clGetPlatformInfo(platform, what, 0, NULL, &size);
    if (err != CL_SUCCESS) size = 0;
    char *s = malloc(size + 1);
    if (s == NULL) return NULL;
    if (size > 0) {
        err = dev ? clGetDeviceInfo(dev, what, size, s, NULL) : clGetPlatformInfo(platform, what, size, s, NULL);
        if (err != CL_SUCCESS) size = 0;
    }
    s[size] = '\0';
    return s;
}

/* Copies src into dst[cap], cut at a character boundary when it is longer (UTF-8 continuation
 * bytes are not split). */
static void copy_truncated(char *dst, size_t cap, const char *src)
{
    size_t n = src ? strlen(src) : 0;
    if (n >= cap) {
        n = cap - 1;
        while (n > 0 && ((unsigned char)src[n] & 0xC0) == 0x80) --n;
    }
    if (n) memcpy(dst, src, n);
    dst[n] = '\0';
}

static void copy_info_string(cl_platform_id platform, cl_device_id dev, cl_uint what, char *dst, size_t cap)
{
    char *s = info_string(platform, dev, what);
    copy_truncated(dst, cap, s);
    free(s);
}

iha_status iha__device_identity(cl_platform_id platform, cl_device_id device, iha_device_identity *id)
{
    memset(id, 0, sizeof *id);
    id->platform_version = info_string(platform, NULL, CL_PLATFORM_VERSION);
    id->device_name = info_string(NULL, device, CL_DEVICE_NAME);
    id->device_vendor = info_string(NULL, device, CL_DEVICE_VENDOR);
    id->driver_version = info_string(NULL, device, CL_DRIVER_VERSION);
    id->device_version = info_string(NULL, device, CL_DEVICE_VERSION);
    if (id->platform_version && id->device_name && id->device_vendor && id->driver_version && id->device_version)
        return IHA_OK;
    iha__device_identity_free(id);
    return IHA_ERROR_HOST_MEMORY;
}

void iha__device_identity_free(iha_device_identity *id)
{
    free(id->platform_version);
    free(id->device_name);
    free(id->device_vendor);
    free(id->driver_version);
    free(id->device_version);
    memset(id, 0, sizeof *id);
}

/* cl_nv_device_attribute_query's CL_DEVICE_COMPUTE_CAPABILITY_MAJOR_NV and NVIDIA's PCI vendor. */
#define COMPUTE_CAPABILITY_MAJOR_NV 0x4000
#define VENDOR_NVIDIA 0x10DEu

int iha__device_has_mma(cl_device_id device)
{
    cl_uint vendor = 0, major = 0;
    size_t size = 0;
    if (clGetDeviceInfo(device, CL_DEVICE_VENDOR_ID, sizeof vendor, &vendor, NULL) != CL_SUCCESS || vendor != VENDOR_NVIDIA)
        return 0;
    if (clGetDeviceInfo(device, CL_DEVICE_EXTENSIONS, 0, NULL, &size) != CL_SUCCESS || size == 0) return 0;
    char *extensions = malloc(size);
    if (extensions == NULL) return 0;
    const int query = clGetDeviceInfo(device, CL_DEVICE_EXTENSIONS, size, extensions, NULL) == CL_SUCCESS &&
                      strstr(extensions, "cl_nv_device_attribute_query") != NULL;
    free(extensions);
    return query && clGetDeviceInfo(device, COMPUTE_CAPABILITY_MAJOR_NV, sizeof major, &major, NULL) == CL_SUCCESS &&
           major >= 8;
}

iha_status iha__device_describe(cl_platform_id platform, cl_device_id device, unsigned pi, unsigned di,
                                iha_device_info *info)
{
    memset(info, 0, sizeof *info);
    info->platform_index = pi;
    info->device_index = di;
    copy_info_string(platform, NULL, CL_PLATFORM_NAME, info->platform_name, sizeof info->platform_name);
    copy_info_string(platform, NULL, CL_PLATFORM_VERSION, info->platform_version, sizeof info->platform_version);
    copy_info_string(NULL, device, CL_DEVICE_NAME, info->device_name, sizeof info->device_name);
    copy_info_string(NULL, device, CL_DEVICE_VENDOR, info->device_vendor, sizeof info->device_vendor);
    copy_info_string(NULL, device, CL_DRIVER_VERSION, info->driver_version, sizeof info->driver_version);
    copy_info_string(NULL, device, CL_DEVICE_VERSION, info->device_version, sizeof info->device_version);

    cl_device_type type = 0;
    cl_uint cu = 0;
    cl_ulong gmem = 0, alloc = 0, lmem = 0;
    cl_device_local_mem_type ltype = CL_LOCAL;
    size_t wg = 0;
    cl_int err = clGetDeviceInfo(device, CL_DEVICE_TYPE, sizeof type, &type, NULL);
    err |= clGetDeviceInfo(device, CL_DEVICE_MAX_COMPUTE_UNITS, sizeof cu, &cu, NULL);
    err |= clGetDeviceInfo(device, CL_DEVICE_GLOBAL_MEM_SIZE, sizeof gmem, &gmem, NULL);
    err |= clGetDeviceInfo(device, CL_DEVICE_MAX_MEM_ALLOC_SIZE, sizeof alloc, &alloc, NULL);
    err |= clGetDeviceInfo(device, CL_DEVICE_LOCAL_MEM_SIZE, sizeof lmem, &lmem, NULL);
    err |= clGetDeviceInfo(device, CL_DEVICE_LOCAL_MEM_TYPE, sizeof ltype, &ltype, NULL);
    err |= clGetDeviceInfo(device, CL_DEVICE_MAX_WORK_GROUP_SIZE, sizeof wg, &wg, NULL);
    if (err != CL_SUCCESS) return IHA_ERROR_OPENCL;
    info->is_gpu = (type & CL_DEVICE_TYPE_GPU) != 0;
    info->is_cpu = (type & CL_DEVICE_TYPE_CPU) != 0;
    info->compute_units = cu;
    info->global_mem_bytes = gmem;
    info->max_alloc_bytes = alloc;
    info->local_mem_bytes = lmem;
    info->local_mem_is_global = ltype == CL_GLOBAL;
    info->max_work_group_size = wg;

    size_t ext_len = 0;
    if (clGetDeviceInfo(device, CL_DEVICE_EXTENSIONS, 0, NULL, &ext_len) == CL_SUCCESS && ext_len > 0) {
        char *ext = malloc(ext_len + 1);
        if (ext == NULL) return IHA_ERROR_HOST_MEMORY;
        if (clGetDeviceInfo(device, CL_DEVICE_EXTENSIONS, ext_len, ext, NULL) == CL_SUCCESS) {
            ext[ext_len] = '\0';
            info->has_fp16 = strstr(ext, "cl_khr_fp16") != NULL;
        }
        free(ext);
    }
    return IHA_OK;
}

/* Every (platform, device) pair in platform order. */
typedef struct device_table {
    cl_platform_id platform[IHA_MAX_DEVICES];
    cl_device_id device[IHA_MAX_DEVICES];
    unsigned pi[IHA_MAX_DEVICES], di[IHA_MAX_DEVICES];
    size_t count;
} device_table;

static iha_status enumerate(device_table *t)
{
    cl_platform_id platforms[IHA_MAX_PLATFORMS];
    cl_uint np = 0;
    t->count = 0;
    cl_int err = clGetPlatformIDs(IHA_MAX_PLATFORMS, platforms, &np);
    if (err != CL_SUCCESS || np == 0) return IHA_ERROR_NO_DEVICE;
    if (np > IHA_MAX_PLATFORMS) np = IHA_MAX_PLATFORMS;
    for (cl_uint p = 0; p < np; ++p) {
        cl_device_id devices[IHA_MAX_DEVICES];
        cl_uint nd = 0;
        if (clGetDeviceIDs(platforms[p], CL_DEVICE_TYPE_ALL, IHA_MAX_DEVICES, devices, &nd) != CL_SUCCESS) continue;
        if (nd > IHA_MAX_DEVICES) nd = IHA_MAX_DEVICES;
        for (cl_uint d = 0; d < nd && t->count < IHA_MAX_DEVICES; ++d) {
            t->platform[t->count] = platforms[p];
            t->device[t->count] = devices[d];
            t->pi[t->count] = p;
            t->di[t->count] = d;
            t->count++;
        }
    }
    return t->count ? IHA_OK : IHA_ERROR_NO_DEVICE;
}

iha_status iha_devices_list(iha_device_info *out, size_t capacity, size_t *count)
{
    if (count == NULL || (out == NULL && capacity > 0)) return IHA_ERROR_INVALID_ARGUMENT;
    *count = 0;
    device_table t;
    iha_status st = enumerate(&t);
    if (st != IHA_OK) return st;
    for (size_t i = 0; i < t.count && i < capacity; ++i) {
        st = iha__device_describe(t.platform[i], t.device[i], t.pi[i], t.di[i], &out[i]);
        if (st != IHA_OK) return st;
    }
    *count = t.count;
    return IHA_OK;
}

static int contains_nocase(const char *hay, const char *needle)
{
    size_t n = strlen(needle);
    if (n == 0) return 1;
    for (; *hay; ++hay) {
        size_t i = 0;
        while (i < n && hay[i] && tolower((unsigned char)hay[i]) == tolower((unsigned char)needle[i])) ++i;
        if (i == n) return 1;
    }
    return 0;
}

/* Parses "P:D" with decimal indices; returns 0 when spec is not of that form. */
static int parse_index_pair(const char *spec, unsigned *p, unsigned *d)
{
    char *end = NULL;
    if (!isdigit((unsigned char)spec[0])) return 0;
    unsigned long a = strtoul(spec, &end, 10);
    if (*end != ':' || !isdigit((unsigned char)end[1])) return 0;
    unsigned long b = strtoul(end + 1, &end, 10);
    if (*end != '\0' || a > 1000 || b > 1000) return 0;
    *p = (unsigned)a;
    *d = (unsigned)b;
    return 1;
}

static int matches(const char *spec, cl_platform_id platform, const iha_device_info *info)
{
    /* PoCL says "pocl" only in its platform vendor ("The pocl project") and version. */
    char *platform_vendor = info_string(platform, NULL, CL_PLATFORM_VENDOR);
    const int by_vendor = platform_vendor != NULL && contains_nocase(platform_vendor, spec);
    free(platform_vendor);
    if (contains_nocase(info->platform_name, spec) || contains_nocase(info->device_name, spec) ||
        contains_nocase(info->device_vendor, spec) || contains_nocase(info->platform_version, spec) || by_vendor)
        return 1;
    if (info->is_gpu && contains_nocase("gpu", spec) && strlen(spec) == 3) return 1;
    if (info->is_cpu && contains_nocase("cpu", spec) && strlen(spec) == 3) return 1;
    return 0;
}

iha_status iha__device_select(const char *spec, cl_platform_id *platform, cl_device_id *device,
                              iha_device_info *info, iha_message *msg)
{
    device_table t;
    if (enumerate(&t) != IHA_OK) {
        iha__message_printf(msg, "no OpenCL platform or device found (is an ICD such as pocl-opencl-icd installed "
                                 "and registered in /etc/OpenCL/vendors?)");
        return IHA_ERROR_NO_DEVICE;
    }
    if (spec != NULL && spec[0] == '\0') spec = NULL;
    unsigned want_p = 0, want_d = 0;
    int by_index = spec != NULL && parse_index_pair(spec, &want_p, &want_d);
    size_t chosen = t.count, first_gpu = t.count;
    for (size_t i = 0; i < t.count; ++i) {
        iha_device_info cand;
        if (iha__device_describe(t.platform[i], t.device[i], t.pi[i], t.di[i], &cand) != IHA_OK) continue;
        if (spec == NULL) {
            if (cand.is_gpu && first_gpu == t.count) first_gpu = i;
        } else if (by_index ? (t.pi[i] == want_p && t.di[i] == want_d) : matches(spec, t.platform[i], &cand)) {
            chosen = i;
            break;
        }
    }
    if (spec == NULL) chosen = first_gpu < t.count ? first_gpu : 0;
    if (chosen == t.count) {
        char shown[256];
        iha__message_printf(msg, "no OpenCL device matches \"%s\" (use \"P:D\" indexes or a substring of a platform or "
                                 "device name; `iha devices` lists them)", iha__message_escape(spec, shown, sizeof shown));
        return IHA_ERROR_NO_DEVICE;
    }
    *platform = t.platform[chosen];
    *device = t.device[chosen];
    if (iha__device_describe(*platform, *device, t.pi[chosen], t.di[chosen], info) != IHA_OK) {
        iha__message_printf(msg, "could not query the chosen OpenCL device");
        return IHA_ERROR_OPENCL;
    }
    return IHA_OK;
}
