/* Growable message buffer for the context's last error. */
#include "common/message.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int reserve(iha_message *m, size_t need)
{
    if (need <= m->capacity) return 1;
    size_t cap = m->capacity ? m->capacity : 256;
    while (cap < need) cap *= 2;
    char *p = realloc(m->text, cap);
    if (p == NULL) return 0;
    if (m->text == NULL) p[0] = '\0';
    m->text = p;
    m->capacity = cap;
    return 1;
}

void iha__message_vprintf(iha_message *m, const char *fmt, va_list ap)
{
    va_list copy;
    va_copy(copy, ap);
    int n = vsnprintf(NULL, 0, fmt, copy);
    va_end(copy);
    if (n < 0) n = 0;
    if (!reserve(m, (size_t)n + 1) && m->capacity == 0) return;
    vsnprintf(m->text, m->capacity, fmt, ap);
}

void iha__message_printf(iha_message *m, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    iha__message_vprintf(m, fmt, ap);
    va_end(ap);
}

void iha__message_append(iha_message *m, const char *text)
{
    size_t old = m->text ? strlen(m->text) : 0;
    size_t add = strlen(text);
    if (!reserve(m, old + add + 1)) {
        if (m->capacity == 0) return;
        add = m->capacity - old - 1;
    }
    memcpy(m->text + old, text, add);
    m->text[old + add] = '\0';
}

void iha__message_clear(iha_message *m)
{
    if (m->text) m->text[0] = '\0';
}

void iha__message_free(iha_message *m)
{
    free(m->text);
    m->text = NULL;
    m->capacity = 0;
}

const char *iha__message_text(const iha_message *m) { return m->text ? m->text : ""; }

const char *iha__message_escape(const char *text, char *buf, size_t capacity)
{
    static const char hex[] = "0123456789abcdef";
    size_t n = 0;
    if (capacity < 8) { /* no room for one escaped byte and "..." */
        if (capacity > 0) buf[0] = '\0';
        return buf;
    }
    for (const unsigned char *p = (const unsigned char *)text; *p; ++p) {
        if (n + 4 + 4 > capacity) {
            memcpy(buf + n, "...", 3);
            n += 3;
            break;
        }
        if (*p >= 0x20 && *p < 0x7f && *p != '\\') {
            buf[n++] = (char)*p;
        } else {
            buf[n++] = '\\';
            buf[n++] = 'x';
            buf[n++] = hex[*p >> 4];
            buf[n++] = hex[*p & 15];
        }
    }
    buf[n] = '\0';
    return buf;
}
