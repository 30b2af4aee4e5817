/* The generic side of tuning spaces: validity, enumeration, text form, bucket distance. */
#include "tune/space.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

int iha__space_param_index(const iha_tune_space *s, const char *name)
{
    for (int i = 0; i < s->param_count; ++i)
        if (strcmp(s->params[i].name, name) == 0) return i;
    return -1;
}

int iha__space_key_index(const iha_tune_space *s, const char *name)
{
    for (int i = 0; i < s->key_count; ++i)
        if (strcmp(s->keys[i].name, name) == 0) return i;
    return -1;
}

/* The value of a name in a constraint or formula; 0 with *found = 0 when unknown. */
static long named_value(const iha_tune_space *s, const iha_tune_config *c, const iha_tune_bucket *b,
                        const iha_tune_limits *lim, const char *name, int *found)
{
    *found = 1;
    int i = iha__space_param_index(s, name);
    if (i >= 0) return c->v[i];
    i = iha__space_key_index(s, name);
    if (i >= 0 && b != NULL) return b->values[i];
    if (strcmp(name, "max_group") == 0) return lim->max_group;
    if (strcmp(name, "local_bytes") == 0) return lim->local_bytes;
    if (strcmp(name, "mma") == 0) return lim->mma;
    *found = 0;
    return 0;
}

static int is_candidate(const iha_tune_param *p, long value)
{
    for (int k = 0; k < p->count; ++k)
        if (p->values[k] == value) return 1;
    return 0;
}

int iha__space_valid(const iha_tune_space *s, const iha_tune_config *c, const iha_tune_bucket *b,
                     const iha_tune_limits *lim, const char **why)
{
    const char *dummy;
    if (why == NULL) why = &dummy;
    for (int i = 0; i < s->param_count; ++i) {
        const iha_tune_param *p = &s->params[i];
        if (p->same_as != NULL) {
            int j = iha__space_param_index(s, p->same_as);
            if (j < 0 || c->v[i] != c->v[j]) return *why = "a tied parameter differs from its leader", 0;
        } else if (!is_candidate(p, c->v[i])) {
            return *why = "a value is not a candidate of its parameter", 0;
        }
    }
    for (int k = 0; k < s->constraint_count; ++k) {
        const iha_tune_constraint *con = &s->constraints[k];
        long v[IHA_TUNE_CONSTRAINT_NAMES] = {0};
        for (int n = 0; n < IHA_TUNE_CONSTRAINT_NAMES && con->names[n] != NULL; ++n) {
            int found;
            v[n] = named_value(s, c, b, lim, con->names[n], &found);
            if (!found) return *why = "a constraint names an unknown value", 0;
        }
        if (!con->holds(v)) return *why = con->why, 0;
    }
    if (s->local_bytes != NULL) {
        long v[6] = {0, 0, 0, 0, 0, 0};
        for (int n = 0; n < 6 && s->local_names[n] != NULL; ++n) {
            int found;
            v[n] = named_value(s, c, b, lim, s->local_names[n], &found);
        }
        if (s->local_bytes(v) > lim->local_bytes) return *why = "needs more local memory than the device has", 0;
    }
    long group = 1;
    for (int n = 0; n < 3 && s->group_names[n] != NULL; ++n) {
        int found;
        group *= named_value(s, c, b, lim, s->group_names[n], &found);
    }
    if (group < 1 || group > lim->max_group) return *why = "the work-group exceeds the device's maximum", 0;
    return 1;
}

void iha__space_tie(const iha_tune_space *s, iha_tune_config *c)
{
    for (int i = 0; i < s->param_count; ++i) {
        if (s->params[i].same_as == NULL) continue;
        int j = iha__space_param_index(s, s->params[i].same_as);
        if (j >= 0) c->v[i] = c->v[j];
    }
}

size_t iha__space_size(const iha_tune_space *s)
{
    size_t n = 1;
    for (int i = 0; i < s->param_count; ++i)
        if (s->params[i].same_as == NULL) n *= (size_t)s->params[i].count;
    return n;
}

void iha__space_at(const iha_tune_space *s, size_t index, iha_tune_config *c)
{
    memset(c, 0, sizeof *c);
    for (int i = s->param_count - 1; i >= 0; --i) {
        const iha_tune_param *p = &s->params[i];
        if (p->same_as != NULL) continue;
        c->v[i] = p->values[index % (size_t)p->count];
        index /= (size_t)p->count;
    }
    iha__space_tie(s, c);
}

int iha__space_format(const iha_tune_space *s, const iha_tune_config *c, char *out, size_t cap)
{
    size_t used = 0;
    if (cap == 0) return -1;
    out[0] = '\0';
    for (int i = 0; i < s->param_count; ++i) {
        int n = snprintf(out + used, cap - used, "%s%s=%ld", i ? " " : "", s->params[i].name, c->v[i]);
        if (n < 0 || (size_t)n >= cap - used) return -1;
        used += (size_t)n;
    }
    return 0;
}

int iha__config_equal(const iha_tune_space *s, const iha_tune_config *a, const iha_tune_config *b)
{
    for (int i = 0; i < s->param_count; ++i)
        if (a->v[i] != b->v[i]) return 0;
    return 1;
}

void iha__bucket_format(const iha_tune_space *s, const iha_tune_bucket *b, char *out, size_t cap)
{
    size_t used = 0;
    if (cap == 0) return;
    out[0] = '\0';
    for (int i = 0; i < s->key_count && i < b->count; ++i) {
        int n = snprintf(out + used, cap - used, "%s%s=%ld", i ? " " : "", s->keys[i].name, b->values[i]);
        if (n < 0 || (size_t)n >= cap - used) return;
        used += (size_t)n;
    }
}

double iha__bucket_distance(const iha_tune_space *s, const iha_tune_bucket *a, const iha_tune_bucket *b)
{
    if (a->count != s->key_count || b->count != s->key_count) return -1.0;
    double d = 0.0;
    for (int i = 0; i < s->key_count; ++i) {
        if (s->keys[i].kind) {
            if (a->values[i] != b->values[i]) return -1.0;
        } else {
            const double x = a->values[i] > 0 ? (double)a->values[i] : 1.0;
            const double y = b->values[i] > 0 ? (double)b->values[i] : 1.0;
            d += fabs(log2(x) - log2(y));
        }
    }
    return d;
}

int iha__multiple_of_x(const long *v) { return v[1] > 0 && v[0] % v[1] == 0; }
int iha__multiple_of_x_mul_y(const long *v) { return v[1] * v[2] > 0 && v[0] % (v[1] * v[2]) == 0; }
int iha__multiple_of_x_mul_y_div_z(const long *v)
{
    if (v[3] <= 0 || (v[1] * v[2]) % v[3] != 0) return 0;
    const long q = v[1] * v[2] / v[3];
    return q > 0 && v[0] % q == 0;
}
int iha__at_most_x(const long *v) { return v[0] <= v[1]; }
int iha__product_at_most_z(const long *v) { return v[0] * v[1] <= v[2]; }

long iha__pow2_ceil(long x)
{
    long p = 1;
    while (p < x && p < (1L << 40)) p <<= 1;
    return p;
}
