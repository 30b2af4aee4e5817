/*
 * test_device.c - device choice (src/runtime/device.c): "P:D", case-insensitive name
 * substrings, "cpu"/"gpu", IHA_DEVICE and its override by the option; a NULL out gets its
 * reason in the caller's buffer; device strings come whole.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/stat.h>
#include <unistd.h>

#include "test_util.h"
#include "test_layer.h"

/* ---- Device choice ---- */

/* Every device iha_devices_list reports (malloc'ed; free it). */
static iha_device_info *list_devices(size_t *count)
{
    assert_int_equal(iha_devices_list(NULL, 0, count), IHA_OK);
    assert_true(*count > 0);
    iha_device_info *info = tu_malloc(*count * sizeof *info);
    size_t again = 0;
    assert_int_equal(iha_devices_list(info, *count, &again), IHA_OK);
    assert_int_equal(again, *count);
    return info;
}

static cl_device_type device_type(iha_context *ctx)
{
    cl_device_type type = 0;
    assert_int_equal(clGetDeviceInfo(iha_context_cl_device(ctx), CL_DEVICE_TYPE, sizeof type, &type, NULL),
                     CL_SUCCESS);
    return type;
}

static iha_status try_spec(const char *spec, iha_context **out)
{
    iha_context_options options;
    iha_context_options_init(&options);
    options.device = spec;
    char message[512] = "";
    iha_status st = iha_context_create(out, &options, message, sizeof message);
    if (st != IHA_OK) {
        assert_null(*out);
        assert_true(strlen(message) > 0);
    }
    return st;
}

/* Without a context there is nowhere else for the reason: it goes to the caller's buffer. */
static void create_with_null_out_says_why(void **state)
{
    (void)state;
    char message[256] = "unchanged";
    assert_int_equal(iha_context_create(NULL, NULL, message, sizeof message), IHA_ERROR_INVALID_ARGUMENT);
    if (strstr(message, "out") == NULL)
        fail_msg("the message does not say that out is NULL: \"%s\"", message);
    assert_int_equal(iha_context_create(NULL, NULL, NULL, 0), IHA_ERROR_INVALID_ARGUMENT);
}

/* The whole string of clGetDeviceInfo, malloc'ed. */
static char *device_string(cl_device_id device, cl_device_info what)
{
    size_t size = 0;
    assert_int_equal(clGetDeviceInfo(device, what, 0, NULL, &size), CL_SUCCESS);
    char *s = tu_malloc(size + 1);
    assert_int_equal(clGetDeviceInfo(device, what, size, s, NULL), CL_SUCCESS);
    s[size] = '\0';
    return s;
}

/* A field holds the driver's string whole when it fits, else a non-empty prefix of it. */
static void assert_string_kept(const char *what, const char *field, size_t capacity, const char *whole)
{
    if (strlen(whole) < capacity) {
        if (strcmp(field, whole) != 0)
            fail_msg("%s is \"%s\", the driver says \"%s\"", what, field, whole);
    } else if (field[0] == '\0' || strncmp(field, whole, strlen(field)) != 0) {
        fail_msg("%s is \"%s\", not a prefix of the driver's \"%s\"", what, field, whole);
    }
}

/* Every device's strings as the driver reports them, however long (PoCL's version string is
 * exactly 64 characters on Debian 12's PoCL 3.1). */
static void device_strings_are_whole(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    size_t count = 0;
    assert_int_equal(iha_devices_list(NULL, 0, &count), IHA_OK);
    iha_device_info *info = tu_malloc(count * sizeof *info);
    assert_int_equal(iha_devices_list(info, count, &count), IHA_OK);
    cl_platform_id platforms[16];
    cl_uint np = 0;
    assert_int_equal(clGetPlatformIDs(16, platforms, &np), CL_SUCCESS);
    for (size_t i = 0; i < count; i++) {
        cl_device_id devices[64];
        cl_uint nd = 0;
        assert_true(info[i].platform_index < np);
        assert_int_equal(clGetDeviceIDs(platforms[info[i].platform_index], CL_DEVICE_TYPE_ALL, 64, devices, &nd),
                         CL_SUCCESS);
        const cl_device_id d = devices[info[i].device_index];
        const struct {
            const char *name;
            cl_device_info what;
            const char *field;
            size_t capacity;
        } strings[] = {
            {"device_name", CL_DEVICE_NAME, info[i].device_name, sizeof info[i].device_name},
            {"device_vendor", CL_DEVICE_VENDOR, info[i].device_vendor, sizeof info[i].device_vendor},
            {"driver_version", CL_DRIVER_VERSION, info[i].driver_version, sizeof info[i].driver_version},
            {"device_version", CL_DEVICE_VERSION, info[i].device_version, sizeof info[i].device_version},
        };
        for (size_t k = 0; k < sizeof strings / sizeof *strings; k++) {
            char *whole = device_string(d, strings[k].what);
            assert_string_kept(strings[k].name, strings[k].field, strings[k].capacity, whole);
            free(whole);
        }
    }
    free(info);
}

static void device_by_index(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    size_t count;
    iha_device_info *info = list_devices(&count);
    for (size_t i = 0; i < count && i < 4; i++) {
        char spec[32];
        snprintf(spec, sizeof spec, "%u:%u", info[i].platform_index, info[i].device_index);
        iha_context *ctx = NULL;
        iha_status st = try_spec(spec, &ctx);
        if (st != IHA_OK)
            fail_msg("device \"%s\" (%s): %s", spec, info[i].device_name, iha_status_name(st));
        assert_string_equal(iha_context_device_name(ctx), info[i].device_name);
        iha_context_free(ctx);
    }
    free(info);
}

/* What kinds of device are installed. */
typedef struct installed {
    int pocl, cpu, gpu;
} installed;

static installed installed_kinds(void)
{
    size_t count;
    iha_device_info *info = list_devices(&count);
    installed k = {0, 0, 0};
    for (size_t i = 0; i < count; i++) {
        k.pocl |= tu_contains_nocase(info[i].platform_name, "pocl") || tu_contains_nocase(info[i].platform_version, "pocl") ||
                  tu_contains_nocase(info[i].platform_name, "Portable Computing Language");
        k.cpu |= info[i].is_cpu;
        k.gpu |= info[i].is_gpu;
    }
    free(info);
    return k;
}

/* The header's own example: "pocl" in any case picks the PoCL platform (whose platform name is
 * "Portable Computing Language"; "PoCL" appears in its version and vendor strings). */
static void device_by_name_pocl(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    if (!installed_kinds().pocl)
        skip();
    static const char *specs[] = {"pocl", "PoCL", "POCL"};
    for (size_t i = 0; i < 3; i++) {
        iha_context *ctx = NULL;
        iha_status st = try_spec(specs[i], &ctx);
        if (st != IHA_OK)
            fail_msg("device \"%s\": %s although a PoCL platform is installed", specs[i], iha_status_name(st));
        iha_context_free(ctx);
    }
}

static void device_by_type(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    const installed k = installed_kinds();
    iha_context *ctx = NULL;
    if (k.cpu) {
        assert_int_equal(try_spec("cpu", &ctx), IHA_OK);
        assert_true(device_type(ctx) & CL_DEVICE_TYPE_CPU);
        iha_context_free(ctx);
    }
    if (k.gpu) {
        assert_int_equal(try_spec("GPU", &ctx), IHA_OK);
        assert_true(device_type(ctx) & CL_DEVICE_TYPE_GPU);
        iha_context_free(ctx);
    } else {
        assert_int_equal(try_spec("gpu", &ctx), IHA_ERROR_NO_DEVICE);
    }
}

/* A piece of the first device's name, with its case flipped. */
static void device_by_name_piece(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    size_t count;
    iha_device_info *info = list_devices(&count);
    char piece[8] = "";
    const char *name = info[0].device_name;
    size_t len = strlen(name), start = len > 6 ? len / 3 : 0, take = len - start < 5 ? len - start : 5;
    for (size_t i = 0; i < take; i++) {
        unsigned char c = (unsigned char)name[start + i];
        piece[i] = (char)(isupper(c) ? tolower(c) : toupper(c));
    }
    piece[take] = '\0';
    iha_context *ctx = NULL;
    iha_status st = try_spec(piece, &ctx);
    if (st != IHA_OK)
        fail_msg("device \"%s\" (a piece of \"%s\"): %s", piece, name, iha_status_name(st));
    iha_context_free(ctx);
    free(info);
}

/* IHA_DEVICE applies when options.device is NULL; the option overrides it. */
static void device_from_environment(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    tu_saved_env e = tu_env_save("IHA_DEVICE");
    setenv("IHA_DEVICE", "no-such-device-xyz", 1);
    iha_context *ctx = NULL;
    iha_status from_env = try_spec(NULL, &ctx);
    iha_context_free(ctx);
    ctx = NULL;
    iha_status overridden = try_spec("0:0", &ctx);
    iha_context_free(ctx);
    tu_env_restore(&e);
    assert_int_equal(from_env, IHA_ERROR_NO_DEVICE);
    assert_int_equal(overridden, IHA_OK);
}

/* A device spec comes from the environment: its control bytes reach the message escaped, so
 * that printing the message cannot send escape sequences to the user's terminal. */
static void device_spec_escaped_in_message(void **state)
{
    (void)state;
    TU_REQUIRE_DEVICE(tu_ctx);
    tu_saved_env e = tu_env_save("IHA_DEVICE");
    setenv("IHA_DEVICE", "ab\x1b[31mcd\\", 1);
    iha_context *ctx = NULL;
    char message[512] = "";
    const iha_status st = iha_context_create(&ctx, NULL, message, sizeof message);
    iha_context_free(ctx);
    tu_env_restore(&e);
    assert_int_equal(st, IHA_ERROR_NO_DEVICE);
    for (const char *p = message; *p; ++p)
        if ((unsigned char)*p < 0x20 || (unsigned char)*p == 0x7f) fail_msg("control byte in \"%s\"", message);
    assert_non_null(strstr(message, "\"ab\\x1b[31mcd\\x5c\""));
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(create_with_null_out_says_why),
        cmocka_unit_test(device_strings_are_whole),
        cmocka_unit_test(device_by_index),
        cmocka_unit_test(device_by_name_pocl),
        cmocka_unit_test(device_by_type),
        cmocka_unit_test(device_by_name_piece),
        cmocka_unit_test(device_from_environment),
        cmocka_unit_test(device_spec_escaped_in_message),
    };
    return tu_main(argc, argv, tests, sizeof tests / sizeof tests[0], tu_group_setup, tu_group_teardown);
}
