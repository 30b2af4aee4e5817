/* The context's last-error message: a growable string, so that a build log fits whole. */
#ifndef IHA_COMMON_MESSAGE_H
#define IHA_COMMON_MESSAGE_H
#include <stdarg.h>
#include <stddef.h>

typedef struct iha_message {
    char *text; /* NUL-terminated; NULL until the first message */
    size_t capacity;
} iha_message;

/* Replaces the message with printf-style text. On allocation failure keeps a truncated
 * message in the existing storage rather than failing: reporting must not fail. */
void iha__message_printf(iha_message *m, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void iha__message_vprintf(iha_message *m, const char *fmt, va_list ap);
/* Appends text (used to attach build logs). */
void iha__message_append(iha_message *m, const char *text);
void iha__message_clear(iha_message *m);
void iha__message_free(iha_message *m);
const char *iha__message_text(const iha_message *m);

/* Untrusted text (a device spec, a name from the environment) for a message: printable ASCII
 * as it is, every other byte and the backslash as \xNN, so that a message never carries control
 * bytes (a terminal's escape sequences) and says which bytes it was given. Truncated to fit
 * buf, with "..." when it is; returns buf. */
const char *iha__message_escape(const char *text, char *buf, size_t capacity);
#endif
