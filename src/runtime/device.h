/* Device choice and identity (device.c). */
#ifndef IHA_RUNTIME_DEVICE_H
#define IHA_RUNTIME_DEVICE_H
#ifndef CL_TARGET_OPENCL_VERSION
#define CL_TARGET_OPENCL_VERSION 120
#endif
#include <CL/cl.h>
#include "iha.h"
#include "common/message.h"

/* The device's identity strings whole (iha_device_info's copies are cut to their fields'
 * sizes): the program cache's and the profile's keys use these. */
typedef struct iha_device_identity {
    char *platform_version, *device_name, *device_vendor, *driver_version, *device_version;
} iha_device_identity;

iha_status iha__device_describe(cl_platform_id platform, cl_device_id device, unsigned pi, unsigned di,
                                iha_device_info *info);
/* The whole identity strings of a device (free them with iha__device_identity_free). */
iha_status iha__device_identity(cl_platform_id platform, cl_device_id device, iha_device_identity *id);
void iha__device_identity_free(iha_device_identity *id);
/* Whether the device runs NVIDIA's m16n8k16 mma.sync: vendor 0x10DE and, through
 * cl_nv_device_attribute_query, compute capability 8.0 or more (a driver without the query is
 * not trusted with it). */
int iha__device_has_mma(cl_device_id device);
/* Chooses a device for `spec` (NULL: first GPU, else first device). On failure writes why
 * into msg. */
iha_status iha__device_select(const char *spec, cl_platform_id *platform, cl_device_id *device,
                              iha_device_info *info, iha_message *msg);
#endif
