/*
 * cmd_devices.c - "iha devices": every OpenCL device with the limits that decide what the
 * library can run there, and the P:D index that --device and IHA_DEVICE accept.
 */
#include <stdio.h>
#include <stdlib.h>

#include "common/args.h"
#include "commands/cli.h"
#include "iha.h"

static cli_option options[] = {
    {NULL, NULL, NULL, NULL},
};

static cli_spec spec = {
    "devices",
    "",
    "Lists every OpenCL platform and device. The P:D index in the first column is what\n"
    "--device and the IHA_DEVICE environment variable accept (a name substring works too).",
    options,
};

/* "15.6 GiB", "512.0 KiB": binary units, as drivers report memory. */
static const char *format_bytes(uint64_t bytes, char *buf, size_t size)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double value = (double)bytes;
    int unit = 0;
    while (value >= 1024 && unit < 4) {
        value /= 1024;
        unit++;
    }
    snprintf(buf, size, unit ? "%.1f %s" : "%.0f %s", value, units[unit]);
    return buf;
}

static void print_device(const iha_device_info *d)
{
    char global[32], alloc[32], local[32];
    const char *type = d->is_gpu ? "GPU" : d->is_cpu ? "CPU" : "other";
    printf("%u:%u  %s  (%s)\n", d->platform_index, d->device_index, d->device_name, type);
    printf("     %-17s %s, %s\n", "platform", d->platform_name, d->platform_version);
    printf("     %-17s %s\n", "vendor", d->device_vendor);
    printf("     %-17s %s, driver %s\n", "version", d->device_version, d->driver_version);
    printf("     %-17s %u\n", "compute units", d->compute_units);
    printf("     %-17s %s\n", "global memory", format_bytes(d->global_mem_bytes, global, sizeof global));
    printf("     %-17s %s\n", "max allocation", format_bytes(d->max_alloc_bytes, alloc, sizeof alloc));
    printf("     %-17s %s%s\n", "local memory", format_bytes(d->local_mem_bytes, local, sizeof local),
           d->local_mem_is_global ? " (emulated in global memory)" : "");
    printf("     %-17s %zu\n", "max work-group", d->max_work_group_size);
    printf("     %-17s %s\n", "fp16", d->has_fp16 ? "yes (cl_khr_fp16)" : "no");
}

int cmd_devices(int argc, char **argv)
{
    int code = cli_parse(&spec, argc, argv);
    if (code >= 0)
        return code;
    size_t count = 0;
    iha_status status = iha_devices_list(NULL, 0, &count);
    if (status == IHA_ERROR_NO_DEVICE || (status == IHA_OK && count == 0)) {
        cli_error(&spec, "no OpenCL device found (is an ICD such as pocl-opencl-icd installed?)");
        return CLI_EXIT_FAILURE;
    }
    if (status != IHA_OK) {
        cli_error(&spec, "%s: %s", iha_status_name(status), iha_status_description(status));
        return CLI_EXIT_FAILURE;
    }
    iha_device_info *devices = calloc(count, sizeof *devices);
    if (!devices) {
        cli_error(&spec, "out of memory");
        return CLI_EXIT_FAILURE;
    }
    size_t filled = 0;
    status = iha_devices_list(devices, count, &filled);
    if (status != IHA_OK) {
        cli_error(&spec, "%s: %s", iha_status_name(status), iha_status_description(status));
        free(devices);
        return CLI_EXIT_FAILURE;
    }
    /* A device may appear between the two calls; print only what was filled in. */
    size_t shown = filled < count ? filled : count;
    for (size_t i = 0; i < shown; i++) {
        if (i)
            printf("\n");
        print_device(&devices[i]);
    }
    free(devices);
    return CLI_EXIT_OK;
}
